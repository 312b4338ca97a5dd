// The blend schedule; see blend.h.
#include "engine/data/blend.h"

#include <cmath>

namespace switchyard::data {

StatusOr<BlendSchedule> BlendSchedule::Create(const std::vector<double>& weights) {
  if (weights.empty() || weights.size() > 255) {
    return InvalidArgument("a blend holds 1 to 255 datasets, got ", weights.size());
  }
  double total = 0;
  for (size_t d = 0; d < weights.size(); ++d) {
    if (!(weights[d] > 0) || !std::isfinite(weights[d])) {
      return InvalidArgument("data.paths[", d, "].weight must be a positive number, got ",
                             weights[d]);
    }
    total += weights[d];
  }
  BlendSchedule schedule;
  schedule.dataset_.resize(kBlock);
  schedule.rank_.resize(kBlock);
  schedule.per_block_.assign(weights.size(), 0);
  for (int64_t r = 0; r < kBlock; ++r) {
    size_t best = 0;
    double best_error = -INFINITY;
    for (size_t d = 0; d < weights.size(); ++d) {
      const double error = weights[d] / total * static_cast<double>(r + 1) -
                           static_cast<double>(schedule.per_block_[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    schedule.dataset_[r] = static_cast<uint8_t>(best);
    schedule.rank_[r] = static_cast<uint32_t>(schedule.per_block_[best]++);
  }
  return schedule;
}

std::pair<int, int64_t> BlendSchedule::Locate(int64_t g) const {
  const int64_t block = g / kBlock, r = g % kBlock;
  const int d = dataset_[r];
  return {d, block * per_block_[d] + rank_[r]};
}

}  // namespace switchyard::data
