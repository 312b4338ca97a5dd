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
// The device code is in kernels/cuda/sort_assignments_kernels.cuh.
#include <cub/device/device_radix_sort.cuh>

#include <cstdint>
#include <climits>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/sort_assignments_kernels.cuh"
#include "kernels/permute.h"

namespace switchyard::kernels::cuda {
namespace {

constexpr int kThreads = 256;

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

  const int end_bit = sort_dev::KeyBits(num_experts);
  SY_CHECK(n <= INT32_MAX) << "SortAssignments: " << n
                           << " assignments exceed the sort's 32-bit item count";
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

  sort_dev::MakeKeysKernel<<<GridFor(n), kThreads, 0, stream>>>(experts.data<int32_t>(),
                                                      kept.data<uint8_t>(), n, e, keys_in,
                                                      values_in);
  SY_CUDA_CHECK_LAUNCH();
  SY_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_temp, sort_bytes, keys_in, keys_out,
                                                values_in, values_out, items, 0, end_bit,
                                                stream));
  SY_CUDA_CHECK(cudaMemsetAsync(bounds.raw_data(), 0, bounds.nbytes(), stream));
  sort_dev::FinishSortKernel<<<GridFor(n), kThreads, 0, stream>>>(
      keys_out, values_out, n, k, static_cast<uint32_t>(e), token.data<int64_t>(),
      slot.data<int64_t>(), inverse.data<int64_t>(), bounds.data<int32_t>());
  SY_CUDA_CHECK_LAUNCH();
  *sorted_keys = keys_out;
  return bounds;
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
  sort_dev::OffsetsKernel<<<GridFor(num_experts + 1), kThreads, 0, stream>>>(keys, n, num_experts,
                                                                   offsets.data<int64_t>());
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
