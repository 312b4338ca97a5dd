// How a checkpoint gathers whole tensors from the slices ranks hold, and how every rank
// returns the same Status. Used by checkpoint.cc (and its tests); not a public API.
//
// Every rank lists its boxes (SliceEntry: name, dtype, global shape, the box's offset and
// size per dim, from the parameter descriptions); the lists are all-gathered, and PlanGather
// turns them into the same plan on every rank: for each tensor, the lowest rank that holds
// it whole, or else the distinct boxes that tile it, lowest rank first. Nothing assumes a
// mesh: experts split over ep (dim 0) and etp (the hidden dim), tensor-parallel splits and
// pipeline stages holding only their layers all come out of what the ranks hold.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"
#include "engine/parallel/parameter.h"

namespace switchyard::train {

// Which file of a step directory a tensor goes to.
enum CheckpointFile { kModelTensors = 0, kOptimizerTensors = 1 };

// One box of a tensor that one rank holds.
struct SliceEntry {
  int file = kModelTensors;
  std::string name;
  DType dtype = DType::kF32;
  Shape global;
  std::vector<int64_t> offset;  // per dim
  Shape size;                   // per dim; == global when held whole
};

// This rank's slices: model parameters first, then the optimizer state (index i of the
// result is the i-th of them). Errors: a name twice in one list, an undefined value, a value
// that is not a slice of the global shape.
StatusOr<std::vector<SliceEntry>> LocalSlices(const std::vector<parallel::Parameter>& params,
                                              const std::vector<parallel::Parameter>& optimizer);

// One-line text of a list and back (for AllGatherStrings); "" parses as an empty list.
std::string SerializeSlices(const std::vector<SliceEntry>& entries);
std::vector<SliceEntry> DeserializeSlices(const std::string& text);

// A box to fetch: entry `index` of rank `rank`.
struct GatherPiece {
  int rank = 0;
  int index = 0;
  std::vector<int64_t> offset;
  Shape size;
};

// One whole tensor and the disjoint boxes that make it up.
struct GatherItem {
  int file = kModelTensors;
  std::string name;
  DType dtype = DType::kF32;
  Shape global;
  std::vector<GatherPiece> pieces;
};

// The plan for per_rank[r] = rank r's LocalSlices, sorted by file then name. Errors: ranks
// that disagree on a tensor's dtype or global shape, boxes that overlap without being
// equal, and boxes that leave a gap.
StatusOr<std::vector<GatherItem>> PlanGather(const std::vector<std::vector<SliceEntry>>& per_rank);

// Copies between `part`, the box of `whole` at `offset` (empty: all zero) of part's shape,
// and `whole`: into whole when `paste`, out of it otherwise. Host tensors, any dtype.
void CopyBox(const Tensor& whole, const Tensor& part, const std::vector<int64_t>& offset,
             bool paste);

// Every rank's `mine`, in rank order. Collective over world (a host communicator).
std::vector<std::string> AllGatherStrings(const std::string& mine, dist::Communicator& world);

// The Status of the lowest failing rank, on every rank (OK when all are OK), so that every
// rank takes the same path afterwards. Collective.
Status AgreeOnStatus(const Status& local, dist::Communicator& world);

}  // namespace switchyard::train
