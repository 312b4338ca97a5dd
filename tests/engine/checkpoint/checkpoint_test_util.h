// Helpers of the checkpoint tests (checkpoint_plan_test.cc, checkpoint_unit_test.cc):
// tensors whose bytes name their position, and the element arithmetic of boxes.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/core/tensor.h"

namespace switchyard::train::testing {

// A tensor whose every byte is a function of its index, so that a misplaced element shows.
inline Tensor Pattern(const Shape& shape, DType dtype, uint8_t salt) {
  Tensor t = Tensor::Empty(shape, dtype);
  auto* bytes = static_cast<uint8_t*>(t.raw_data());
  for (size_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<uint8_t>(i * 131 + salt);
  return t;
}

// The row-major flat index in `global` of element k of the box at `offset` of size `size`.
inline int64_t GlobalFlat(const Shape& global, const std::vector<int64_t>& offset, const Shape& size,
                   int64_t k) {
  std::vector<int64_t> idx(size.size());
  for (int d = static_cast<int>(size.size()) - 1; d >= 0; --d) {
    idx[d] = k % size[d];
    k /= size[d];
  }
  int64_t g = 0;
  for (size_t d = 0; d < size.size(); ++d) {
    g = g * global[d] + idx[d] + (offset.empty() ? 0 : offset[d]);
  }
  return g;
}

// Element k of t and element j of u hold the same bytes.
inline bool SameElement(const Tensor& t, int64_t k, const Tensor& u, int64_t j) {
  const size_t e = SizeOf(t.dtype());
  return std::memcmp(static_cast<const char*>(t.raw_data()) + k * e,
                     static_cast<const char*>(u.raw_data()) + j * e, e) == 0;
}

}  // namespace switchyard::train::testing
