// Who writes which piece of a checkpoint, and how every rank returns the same Status. Used
// by checkpoint.cc (and its tests); not a public API.
//
// Every rank lists what it offers (SliceEntry: name, dtype, global shape, and a Piece: the
// box of its parameter description and the element range it owns, [flat_begin, FlatEnd()));
// the lists are all-gathered, and PlanSave turns them into the same plan on every rank: for
// each tensor, the lowest rank offering it whole, or else its distinct non-empty pieces
// (identical pieces of replicas once, from the lowest rank), which must tile it. Nothing
// assumes a mesh: experts split over ep (dim 0) and etp (the hidden dim), tensor-parallel
// splits, pipeline stages holding only their layers and ZeRO's element ranges all come out
// of what the ranks hold.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"
#include "engine/parallel/parameter.h"
#include "engine/checkpoint/piece.h"

namespace switchyard::checkpoint {

// Which kind of file of a step directory a tensor goes to.
enum CheckpointFile { kModelTensors = 0, kOptimizerTensors = 1 };

// "model" / "optimizer": the kind's name in the index.
const char* CheckpointFileKind(int file);

// One piece of a tensor that one rank offers (saving) or needs (loading).
struct SliceEntry {
  int file = kModelTensors;
  std::string name;
  DType dtype = DType::kF32;
  Shape global;
  Piece piece;
};

// What a rank lists: what it writes when saving, what it must receive when loading.
enum class SliceUse {
  kSave,  // the owned range [flat_begin, FlatEnd()) of every entry
  kLoad,  // flat_value entries: that range; the others: the whole box (all of value)
};

// This rank's pieces: model parameters first, then the optimizer state (index i of the
// result is the i-th of them). Errors: a name twice (within a list or across both), an
// undefined value, a box that is not inside the global shape, a range that is not inside
// the box, a flat value that is not 1-D of its range's length.
StatusOr<std::vector<SliceEntry>> LocalSlices(const std::vector<parallel::Parameter>& params,
                                              const std::vector<parallel::Parameter>& optimizer,
                                              SliceUse use);

// One-line text of a list and back (for dist::AllGatherStrings); "" parses as an empty list.
std::string SerializeSlices(const std::vector<SliceEntry>& entries);
std::vector<SliceEntry> DeserializeSlices(const std::string& text);

// A piece to write: entry `index` of rank `rank`.
struct SavePiece {
  int rank = 0;
  int index = 0;
  Piece piece;
};

// One tensor and the disjoint pieces that make it up, lowest rank first.
struct SaveItem {
  int file = kModelTensors;
  std::string name;
  DType dtype = DType::kF32;
  Shape global;
  std::vector<SavePiece> pieces;
};

// The plan for per_rank[r] = rank r's LocalSlices(.., kSave), sorted by file then name.
// Errors (one line naming the tensor): ranks that disagree on a tensor's kind, dtype or
// global shape, a piece outside its tensor, pieces that overlap without being equal, and
// pieces that leave a gap.
StatusOr<std::vector<SaveItem>> PlanSave(const std::vector<std::vector<SliceEntry>>& per_rank);

// Copies between `part`, the box of `whole` at `offset` (empty: all zero) of part's shape,
// and `whole`: into whole when `paste`, out of it otherwise. Host tensors, any dtype.
void CopyBox(const Tensor& whole, const Tensor& part, const std::vector<int64_t>& offset,
             bool paste);

}  // namespace switchyard::checkpoint
