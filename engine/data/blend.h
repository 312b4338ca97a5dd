// Which dataset each training sequence of a blend comes from (data.paths with weights, as
// Megatron-LM's data-path blends).
//
// Sequences are taken in blocks of kBlock. Inside a block, sequence r goes to the dataset
// d that maximises weight_d * (r + 1) - taken_d(r) (the sequences of d before r in the
// block; ties to the lower d), Megatron's greedy blending rule, so every prefix of a block
// is within one sequence per dataset of the weights. Every block is the same, so sequence g
// is sequence k of its dataset with
//   k = (g / kBlock) * per_block_d + (rank of g mod kBlock among d's in the block),
// a pure function of g: the blend needs no state to resume, and any data-parallel layout
// reads the same sequences.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/status.h"

namespace switchyard::data {

// One dataset of a blend (config data.paths) and its share of the training sequences.
struct DataPath {
  std::string dir;    // a `switchyard prep` output folder
  double weight = 1;  // > 0; weights are normalised over the blend
};

class BlendSchedule {
 public:
  static constexpr int64_t kBlock = 1 << 16;

  // `weights`: one per dataset, each > 0 (normalised here); at most 255 datasets.
  static StatusOr<BlendSchedule> Create(const std::vector<double>& weights);

  // (dataset, sequence index within that dataset) of global sequence g >= 0.
  std::pair<int, int64_t> Locate(int64_t g) const;
  // Sequences of each dataset per block (they add up to kBlock).
  const std::vector<int64_t>& per_block() const { return per_block_; }

 private:
  std::vector<uint8_t> dataset_;  // per position in a block
  std::vector<uint32_t> rank_;    // per position: index among its dataset's in the block
  std::vector<int64_t> per_block_;
};

}  // namespace switchyard::data
