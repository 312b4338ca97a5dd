// How a checkpoint gathers whole tensors from the slices ranks hold, and how every rank
// returns the same Status. Used by checkpoint.cc (and its tests); not a public API.
//
// Every rank lists its slices (SliceEntry: name, dtype, global shape, shard_dim, offset,
// length); the lists are all-gathered, and PlanGather turns them into the same plan on
// every rank: for each tensor, the lowest rank that holds it whole, or else slices along
// its shard_dim that tile it, lowest rank first. Nothing assumes a mesh: experts split over
// ep, tensor-parallel splits along any dim and pipeline stages holding only their layers
// all come out of what the ranks hold.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"
#include "engine/model/parameter_registry.h"

namespace switchyard::train {

// Which file of a step directory a tensor goes to.
enum CheckpointFile { kModelTensors = 0, kOptimizerTensors = 1 };

// One tensor slice that one rank holds.
struct SliceEntry {
  int file = kModelTensors;
  std::string name;
  DType dtype = DType::kF32;
  Shape global;
  int shard_dim = -1;           // -1: held whole
  int64_t offset = 0, len = 0;  // along shard_dim
};

// This rank's slices: model parameters first, then the optimizer state (index i of the
// result is the i-th of them). Errors: a name twice in one list, an undefined value, a value
// that is not a slice of the global shape.
StatusOr<std::vector<SliceEntry>> LocalSlices(const std::vector<model::Parameter>& params,
                                              const std::vector<model::Parameter>& optimizer);

// One-line text of a list and back (for AllGatherStrings); "" parses as an empty list.
std::string SerializeSlices(const std::vector<SliceEntry>& entries);
std::vector<SliceEntry> DeserializeSlices(const std::string& text);

// A slice to fetch: entry `index` of rank `rank`, [offset, offset + len) along shard_dim.
struct GatherPiece {
  int rank = 0;
  int index = 0;
  int64_t offset = 0, len = 0;
};

// One whole tensor and the disjoint slices that make it up, in order.
struct GatherItem {
  int file = kModelTensors;
  std::string name;
  DType dtype = DType::kF32;
  Shape global;
  int shard_dim = -1;  // -1: one piece holds it whole
  std::vector<GatherPiece> pieces;
};

// The plan for per_rank[r] = rank r's LocalSlices, sorted by file then name. Errors: ranks
// that disagree on a tensor's dtype or global shape, or on its shard_dim, and slices that
// leave a gap.
StatusOr<std::vector<GatherItem>> PlanGather(const std::vector<std::vector<SliceEntry>>& per_rank);

// `global` with dim's size set to len (unchanged for dim < 0).
Shape SliceShape(const Shape& global, int dim, int64_t len);

// Copies between `part`, the slice [offset, offset + part.dim(dim)) of `whole` along dim,
// and `whole`: into whole when `paste`, out of it otherwise. Host tensors, any dtype.
void CopySlice(const Tensor& whole, const Tensor& part, int dim, int64_t offset, bool paste);

// Every rank's `mine`, in rank order. Collective over world (a host communicator).
std::vector<std::string> AllGatherStrings(const std::string& mine, dist::Communicator& world);

// The Status of the lowest failing rank, on every rank (OK when all are OK), so that every
// rank takes the same path afterwards. Collective.
Status AgreeOnStatus(const Status& local, dist::Communicator& world);

}  // namespace switchyard::train
