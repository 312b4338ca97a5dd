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
  using config::LrDecayStyle;
  if (style == LrDecayStyle::kConstant) return lr;
  if (s >= max_steps) return min_lr;
  double coeff = 1.0;  // f(s) of schedule.h
  if (style == LrDecayStyle::kWsd) {
    SY_CHECK(decay_steps >= 1 && decay_steps <= max_steps - warmup_steps)
        << "LrSchedule: wsd decay_steps " << decay_steps;
    const int64_t start = max_steps - decay_steps;
    if (s >= start) coeff = 1.0 - static_cast<double>(s - start) / static_cast<double>(decay_steps);
  } else {
    const double ratio = static_cast<double>(s - warmup_steps) /
                         static_cast<double>(max_steps - warmup_steps);
    coeff = style == LrDecayStyle::kLinear ? 1.0 - ratio
                                           : 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  }
  return static_cast<float>(min_lr + coeff * (static_cast<double>(lr) - min_lr));
}

LrSchedule ScheduleFor(const config::TrainConfig& t) {
  return {.lr = t.lr, .min_lr = t.resolved_min_lr(), .warmup_steps = t.warmup_steps,
          .max_steps = t.max_steps, .style = t.lr_decay_style, .decay_steps = t.lr_decay_steps};
}

}  // namespace switchyard::train
