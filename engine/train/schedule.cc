#include "engine/train/schedule.h"

#include <cmath>
#include <numbers>

#include "engine/core/check.h"

namespace switchyard::train {

float LrSchedule::LrAt(int64_t s) const {
  SY_CHECK(s >= 0) << "LrSchedule::LrAt(" << s << ")";
  if (s < warmup_steps) {
    return static_cast<float>(static_cast<double>(lr) * static_cast<double>(s + 1) /
                              static_cast<double>(warmup_steps));
  }
  if (s >= max_steps) return min_lr;
  const double ratio = static_cast<double>(s - warmup_steps) /
                       static_cast<double>(max_steps - warmup_steps);
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  return static_cast<float>(min_lr + coeff * (static_cast<double>(lr) - min_lr));
}

LrSchedule ScheduleFor(const config::TrainConfig& t) {
  return {.lr = t.lr, .min_lr = t.resolved_min_lr(), .warmup_steps = t.warmup_steps,
          .max_steps = t.max_steps};
}

}  // namespace switchyard::train
