// The device code of kernels/cuda/sort_assignments.cu (which describes the two sorts): the
// keys, the pass over the sorted keys, and the per-expert offsets; and the key width the
// radix sort is asked for. Include after kernels/cuda/device_common.cuh.
#pragma once

#include <cstdint>

namespace switchyard::kernels::cuda::sort_dev {
// Internal linkage: the emulation test compiles these kernels too, and links with the .cu's.
namespace {

// The radix sort's key bits [0, KeyBits(E)): enough for every key, 0 .. E + 1.
inline int KeyBits(int64_t num_experts) {
  int end_bit = 1;
  while ((uint64_t{1} << end_bit) <= static_cast<uint64_t>(num_experts) + 1) ++end_bit;
  return end_bit;
}

__global__ void MakeKeysKernel(const int32_t* __restrict__ experts,
                               const uint8_t* __restrict__ kept, int64_t n, int32_t num_experts,
                               uint32_t* __restrict__ keys, int32_t* __restrict__ values) {
  SY_GRID_STRIDE(i, n) {
    const int32_t e = experts[i];
    uint32_t key = static_cast<uint32_t>(e);
    if (!kept[i]) {
      key = static_cast<uint32_t>(num_experts);  // dropped: after every expert
    } else if (e < 0 || e >= num_experts) {
      key = static_cast<uint32_t>(num_experts) + 1;  // invalid: counted, reported on the host
    }
    keys[i] = key;
    values[i] = static_cast<int32_t>(i);
  }
}

// keys/values: sorted. bounds: (2, E + 2) zeroed; row 0 gets each key's first position,
// row 1 one past its last.
__global__ void FinishSortKernel(const uint32_t* __restrict__ keys,
                                 const int32_t* __restrict__ values, int64_t n, int64_t k,
                                 uint32_t num_experts, int64_t* __restrict__ token,
                                 int64_t* __restrict__ slot, int64_t* __restrict__ inverse,
                                 int32_t* __restrict__ bounds) {
  int32_t* begin = bounds;
  int32_t* end = bounds + num_experts + 2;
  SY_GRID_STRIDE(a, n) {
    const uint32_t key = keys[a];
    const int64_t s = values[a];
    slot[a] = s;
    token[a] = s / k;
    inverse[s] = key < num_experts ? a : -1;
    if (a == 0 || keys[a - 1] != key) begin[key] = static_cast<int32_t>(a);
    if (a == n - 1 || keys[a + 1] != key) end[key] = static_cast<int32_t>(a + 1);
  }
}

// offsets[e] (e = 0..E) = the number of sorted keys below e: a binary search per entry.
__global__ void OffsetsKernel(const uint32_t* __restrict__ keys, int64_t n, int64_t num_experts,
                              int64_t* __restrict__ offsets) {
  SY_GRID_STRIDE(e, num_experts + 1) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (keys[mid] < static_cast<uint32_t>(e)) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    offsets[e] = lo;
  }
}

}  // namespace
}  // namespace switchyard::kernels::cuda::sort_dev
