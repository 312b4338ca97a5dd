// Pieces of a logical tensor, and the one copy between any two of them (docs/checkpoints.md,
// "The piece rule"). Used by checkpoint saving, its index and loading; not a public API.
//
// A piece is a box of the tensor (offset and size per dim, as a parameter description
// gives it) and, of that box's row-major flattening, the elements [begin, end):
//
//   global (4, 6), box (2, 6) at [2, 0], elements [3, 9):
//
//     row 0  . . . . . .
//     row 1  . . . . . .
//     row 2  . . . x x x      the box's elements 3, 4, 5
//     row 3  x x x . . .      and 6, 7, 8
//
// A whole box is [0, NumElements(box)); a ZeRO shard is a range of it; a 0-d scalar is the
// box () with elements [0, 1). A piece's data is its elements in that order, contiguous.
//
// The elements two pieces share are a contiguous stretch of the row-major order of their
// boxes' intersection (an element range of a box is an interval of that order, and the
// intersection's order agrees with both boxes'), so the copy finds that stretch in O(dims)
// and walks it in runs along the innermost dim, merging runs that are contiguous in both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "engine/core/tensor.h"

namespace switchyard::checkpoint {

struct Piece {
  std::vector<int64_t> offset;  // per dim, where the box starts in the tensor
  Shape box;                    // per dim, the box's size
  int64_t begin = 0, end = 0;   // elements [begin, end) of the box's row-major flattening

  int64_t numel() const { return end - begin; }
  // The range is the whole box.
  bool whole_box() const { return begin == 0 && end == NumElements(box); }
  bool operator==(const Piece&) const = default;
};

// The whole box at `offset` of size `box`.
Piece BoxPiece(std::vector<int64_t> offset, Shape box);

// "box (2, 6) at [2, 0], elements [3, 9)"; "(4, 6)" style alone for a whole tensor.
std::string PieceString(const Piece& p, const Shape& global);

// The piece is well formed for a tensor of shape `global`: one offset and size per dim, the
// box inside the tensor, 0 <= begin <= end <= NumElements(box).
bool PieceInside(const Piece& p, const Shape& global);

// Calls run(src_at, dst_at, n) for every run of elements that both pieces hold (pieces of
// one tensor): elements [src_at, src_at + n) of src's data are elements [dst_at, dst_at +
// n) of dst's (counted from each piece's begin). Runs come in increasing order in both and
// are maximal (two runs contiguous in both are one). Nothing when they share no element.
void ForEachCommonRun(const Piece& src, const Piece& dst,
                      absl::FunctionRef<void(int64_t src_at, int64_t dst_at, int64_t n)> run);

// How many elements both pieces hold, in O(dims).
int64_t CommonElements(const Piece& a, const Piece& b);

// Copies every element both pieces hold from src_data (src's elements, laid out as src
// says) into dst_data (dst's), elem_size bytes each, a memcpy per run. Returns the number
// of elements copied.
int64_t CopyCommon(const Piece& src, const void* src_data, const Piece& dst, void* dst_data,
                   size_t elem_size);

// The tensor index (row-major over `global`) of element k of the piece's box.
int64_t GlobalIndexOf(const Piece& p, const Shape& global, int64_t k);

// Two pieces of a tensor that overlap without being equal, or how many elements the pieces
// cover, when they do not tile `global` exactly. Pieces with no element are ignored.
struct TilingProblem {
  int first = -1, second = -1;  // indices of two pieces that overlap (-1: none)
  int64_t covered = 0;          // elements covered, counted once per piece
};
// Empty (first == -1 and covered == NumElements(global)) when the pieces tile the tensor:
// every element in exactly one non-empty piece. Pieces are swept in the order of their
// first element, so pieces far apart are never compared.
TilingProblem CheckTiling(const std::vector<Piece>& pieces, const Shape& global);

}  // namespace switchyard::checkpoint
