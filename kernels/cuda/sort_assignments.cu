// CUDA kernels of kernels/permute.h's sorts (split from kernels/cuda/permute.cu).
//
//   SortAssignments           keys (expert; E for dropped, E + 1 for an invalid expert)
//                             sorted with the flat slots as values by
//                             cub::DeviceRadixSort::SortPairs (stable, bits [0, bits(E + 1))
//                             only); one pass then writes slot, token, the inverse map and
//                             each key's [begin, end) in the sorted order (segment boundaries,
//                             no atomics); those 2 (E + 2) integers come back to the host as
//                             the counts.
//   SortAssignmentsToOffsets  the same sort; then offsets[e] = the number of sorted keys below
//                             e, one binary search per entry, left on the device.
#include <cub/device/device_radix_sort.cuh>

#include <cstdint>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/permute.h"

namespace switchyard::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// ---- SortAssignments ------------------------------------------------------------------

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

size_t AlignUp(size_t bytes) { return (bytes + 255) / 256 * 256; }

// The sort both entry points share: keys made, sorted, and slot, token and inverse written.
// Returns the (2, E + 2) i32 segment bounds of FinishSortKernel (undefined when n = 0);
// `sorted_keys` gets the sorted keys (kept alive by `scratch`).
Tensor SortOnDevice(const Tensor& experts, const Tensor& kept, int64_t num_experts,
                    Tensor& token, Tensor& slot, Tensor& inverse, Tensor& scratch,
                    const uint32_t** sorted_keys, DeviceContext* ctx) {
  const int64_t n = experts.numel(), k = experts.dim(1);
  const int32_t e = static_cast<int32_t>(num_experts);
  cudaStream_t stream = StreamOf(ctx);
  const Device dev = slot.device();

  // Key bits: enough for E + 1.
  int end_bit = 1;
  while ((uint64_t{1} << end_bit) <= static_cast<uint64_t>(e) + 1) ++end_bit;
  const int items = static_cast<int>(n);
  size_t sort_bytes = 0;
  SY_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), items, 0, end_bit,
      stream));
  // Scratch: keys in/out (u32), values in/out (i32), the sort's temporary storage.
  const size_t vec = AlignUp(sizeof(uint32_t) * n);
  scratch = Tensor::Empty({static_cast<int64_t>(4 * vec + AlignUp(sort_bytes))}, DType::kU8, dev);
  char* base = static_cast<char*>(scratch.raw_data());
  auto* keys_in = reinterpret_cast<uint32_t*>(base);
  auto* keys_out = reinterpret_cast<uint32_t*>(base + vec);
  auto* values_in = reinterpret_cast<int32_t*>(base + 2 * vec);
  auto* values_out = reinterpret_cast<int32_t*>(base + 3 * vec);
  void* sort_temp = base + 4 * vec;
  Tensor bounds = Tensor::Empty({2, num_experts + 2}, DType::kI32, dev);

  MakeKeysKernel<<<GridFor(n), kThreads, 0, stream>>>(experts.data<int32_t>(),
                                                      kept.data<uint8_t>(), n, e, keys_in,
                                                      values_in);
  SY_CUDA_CHECK_LAUNCH();
  SY_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_temp, sort_bytes, keys_in, keys_out,
                                                values_in, values_out, items, 0, end_bit,
                                                stream));
  SY_CUDA_CHECK(cudaMemsetAsync(bounds.raw_data(), 0, bounds.nbytes(), stream));
  FinishSortKernel<<<GridFor(n), kThreads, 0, stream>>>(
      keys_out, values_out, n, k, static_cast<uint32_t>(e), token.data<int64_t>(),
      slot.data<int64_t>(), inverse.data<int64_t>(), bounds.data<int32_t>());
  SY_CUDA_CHECK_LAUNCH();
  *sorted_keys = keys_out;
  return bounds;
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

std::vector<int64_t> SortAssignments(const Tensor& experts, const Tensor& kept,
                                     int64_t num_experts, Tensor& token, Tensor& slot,
                                     Tensor& inverse, DeviceContext* ctx) {
  std::vector<int64_t> counts(num_experts, 0);
  if (experts.numel() == 0) return counts;
  Tensor scratch;
  const uint32_t* keys = nullptr;
  const Tensor bounds =
      SortOnDevice(experts, kept, num_experts, token, slot, inverse, scratch, &keys, ctx);
  // The one device->host copy of the dispatch: 2 (E + 2) integers (waits for the stream).
  Tensor host = bounds.To(Device::Cpu(), ctx);
  const int32_t* begin = host.data<int32_t>();
  const int32_t* end = begin + num_experts + 2;
  for (int64_t i = 0; i < num_experts; ++i) counts[i] = end[i] - begin[i];
  const int64_t invalid = end[num_experts + 1] - begin[num_experts + 1];
  SY_CHECK_EQ(invalid, 0) << "SortAssignments: " << invalid
                          << " kept assignments have an expert index outside [0, "
                          << num_experts << ")";
  return counts;
}

void SortAssignmentsToOffsets(const Tensor& experts, const Tensor& kept, int64_t num_experts,
                              Tensor& token, Tensor& slot, Tensor& inverse, Tensor& offsets,
                              DeviceContext* ctx) {
  const int64_t n = experts.numel();
  cudaStream_t stream = StreamOf(ctx);
  if (n == 0) {
    SY_CUDA_CHECK(cudaMemsetAsync(offsets.raw_data(), 0, offsets.nbytes(), stream));
    return;
  }
  Tensor scratch;
  const uint32_t* keys = nullptr;
  SortOnDevice(experts, kept, num_experts, token, slot, inverse, scratch, &keys, ctx);
  OffsetsKernel<<<GridFor(num_experts + 1), kThreads, 0, stream>>>(keys, n, num_experts,
                                                                   offsets.data<int64_t>());
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
