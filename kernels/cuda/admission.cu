// CUDA capacity admission (kernels/moe_routing.h: AdmitAssignments), split from
// kernels/cuda/moe_routing.cu. The CPU loop in kernels/cpu/moe_routing.cc is the reference.
// The (T * k) assignments are sorted with a stable cub::DeviceRadixSort on the fewest key
// bits that order them (expert, slot) or (expert, decreasing gate); a rank is then the
// sorted position minus the start of the expert's (or the (expert, slot)) segment, from an
// exclusive scan of the per-key counts. Exact. The kernels, and the classes and keys they
// sort by, are in kernels/cuda/admission_kernels.cuh.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/admission_kernels.cuh"
#include "kernels/moe_routing.h"

namespace switchyard::kernels::cuda {
namespace {

using dispatch::admission::AdmissionKey;
using dispatch::admission::AdmissionKeysKernel;
using dispatch::admission::AdmissionRankKernel;
using dispatch::admission::AdmittedCountsKernel;
using dispatch::admission::kThreads;
using dispatch::admission::SortEndBit;

// The device part of admission: keys, counts, scan, sort, ranks. Returns the (k * E + 2)
// class counts on the device.
template <bool kByProbability>
Tensor AdmitOnDevice(const Tensor& indices, const Tensor& gates, const Tensor& keep, int E,
                     int64_t capacity, const Tensor& offsets, Tensor& kept, Tensor& position,
                     DeviceContext* ctx) {
  using Key = AdmissionKey<kByProbability>;
  cudaStream_t stream = StreamOf(ctx);
  const int64_t T = indices.dim(0);
  const int k = static_cast<int>(indices.dim(1));
  const int64_t n = T * k;
  const int64_t classes = static_cast<int64_t>(k) * E + 2;
  const Device dev = ctx->device();

  Tensor counts = Tensor::Zeros({classes}, DType::kI64, dev, ctx);
  Tensor starts = Tensor::Empty({classes}, DType::kI64, dev);
  // Keys: u32 or u64 (as i32 pairs or i64 tensors of the same bytes).
  const DType key_dtype = sizeof(Key) == 8 ? DType::kI64 : DType::kI32;
  Tensor keys_in = Tensor::Empty({n}, key_dtype, dev);
  Tensor keys_out = Tensor::Empty({n}, key_dtype, dev);
  Tensor values_in = Tensor::Empty({n}, DType::kI32, dev);
  Tensor values_out = Tensor::Empty({n}, DType::kI32, dev);
  Key* kin = static_cast<Key*>(keys_in.raw_data());
  Key* kout = static_cast<Key*>(keys_out.raw_data());
  int32_t* vin = values_in.data<int32_t>();
  int32_t* vout = values_out.data<int32_t>();
  auto* cnt = reinterpret_cast<unsigned long long*>(counts.data<int64_t>());
  auto* cnt_ll = reinterpret_cast<long long*>(counts.data<int64_t>());
  auto* start_ll = reinterpret_cast<long long*>(starts.data<int64_t>());

  AdmissionKeysKernel<kByProbability><<<GridFor(n, kThreads), kThreads, 0, stream>>>(
      indices.data<int32_t>(), keep.defined() ? keep.data<uint8_t>() : nullptr,
      kByProbability ? gates.data<float>() : nullptr, n, k, E, kin, vin, cnt);
  SY_CUDA_CHECK_LAUNCH();

  // The fewest key bits that hold every key.
  const int end_bit = SortEndBit(kByProbability, k, E);
  size_t sort_bytes = 0, scan_bytes = 0;
  SY_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, kin, kout, vin, vout, n, 0,
                                                end_bit, stream));
  SY_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, cnt_ll, start_ll, classes,
                                              stream));
  Tensor temp = Scratch(std::max(sort_bytes, scan_bytes), ctx);
  SY_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.raw_data(), scan_bytes, cnt_ll, start_ll,
                                              classes, stream));
  SY_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw_data(), sort_bytes, kin, kout, vin, vout,
                                                n, 0, end_bit, stream));

  AdmissionRankKernel<kByProbability><<<GridFor(n, kThreads), kThreads, 0, stream>>>(
      kout, vout, n, k, E, start_ll, offsets.defined() ? offsets.data<int64_t>() : nullptr,
      capacity, kept.data<uint8_t>(), position.data<int64_t>());
  SY_CUDA_CHECK_LAUNCH();
  return counts;
}

}  // namespace

void AdmitAssignmentsInto(const Tensor& indices, const Tensor& gates, const Tensor& keep,
                          int64_t num_experts, int64_t capacity, AdmissionOrder order,
                          Tensor& kept, Tensor& position, Tensor& counts, DeviceContext* ctx) {
  const int64_t T = indices.dim(0), k = indices.dim(1), E = num_experts;
  const int64_t n = T * k;
  cudaStream_t stream = StreamOf(ctx);
  if (n == 0) {
    SY_CUDA_CHECK(cudaMemsetAsync(counts.raw_data(), 0, counts.nbytes(), stream));
    return;
  }
  SY_CHECK(n <= INT32_MAX && k * E + 2 <= INT32_MAX)
      << "AdmitAssignments on CUDA: T*k=" << n << ", k*E=" << k * E << " exceed int32";
  SY_CUDA_CHECK(cudaMemsetAsync(kept.raw_data(), 0, kept.nbytes(), stream));
  SY_CUDA_CHECK(cudaMemsetAsync(position.raw_data(), 0xFF, position.nbytes(), stream));  // -1
  const bool by_probability = order == AdmissionOrder::kProbability;
  const int e32 = static_cast<int>(E);
  const Tensor no_offsets;
  Tensor class_counts =
      by_probability
          ? AdmitOnDevice<true>(indices, gates, keep, e32, capacity, no_offsets, kept, position,
                                ctx)
          : AdmitOnDevice<false>(indices, gates, keep, e32, capacity, no_offsets, kept,
                                 position, ctx);
  AdmittedCountsKernel<<<GridFor(E + 1, kThreads), kThreads, 0, stream>>>(
      class_counts.data<int64_t>(), E, k, capacity, by_probability, counts.data<double>());
  SY_CUDA_CHECK_LAUNCH();
}

AdmissionCounts AdmitAssignments(const Tensor& indices, const Tensor& gates, const Tensor& keep,
                                 int64_t num_experts, int64_t capacity, AdmissionOrder order,
                                 std::span<const int64_t> offsets, Tensor& kept,
                                 Tensor& position, DeviceContext* ctx) {
  const int64_t T = indices.dim(0), k = indices.dim(1), E = num_experts;
  const int64_t n = T * k;
  AdmissionCounts a;
  a.before.assign(E, 0);
  a.after.assign(E, 0);
  if (n == 0) return a;
  SY_CHECK(n <= INT32_MAX && k * E + 2 <= INT32_MAX)
      << "AdmitAssignments on CUDA: T*k=" << n << ", k*E=" << k * E << " exceed int32";
  cudaStream_t stream = StreamOf(ctx);
  SY_CUDA_CHECK(cudaMemsetAsync(kept.raw_data(), 0, kept.nbytes(), stream));
  SY_CUDA_CHECK(cudaMemsetAsync(position.raw_data(), 0xFF, position.nbytes(), stream));  // -1
  const bool by_probability = order == AdmissionOrder::kProbability;
  Tensor offsets_dev;
  if (!offsets.empty()) {
    offsets_dev = ToDevice(std::vector<int64_t>(offsets.begin(), offsets.end()), ctx);
  }

  const int e32 = static_cast<int>(E);
  Tensor counts_dev =
      by_probability
          ? AdmitOnDevice<true>(indices, gates, keep, e32, capacity, offsets_dev, kept, position,
                                ctx)
          : AdmitOnDevice<false>(indices, gates, keep, e32, capacity, offsets_dev, kept, position,
                                 ctx);
  const std::vector<int64_t> c = ToHost<int64_t>(counts_dev, ctx);  // the one copy back
  SY_CHECK_EQ(c[k * E + 1], 0) << "AdmitAssignments: " << c[k * E + 1]
                               << " expert indices outside [0, " << E << ")";
  a.removed = c[k * E];
  const bool limited = capacity >= 0;
  for (int64_t e = 0; e < E; ++e) {
    int64_t earlier_slots = 0;  // this piece's competitors for e in slots < j
    for (int64_t j = 0; j < k; ++j) {
      const int64_t len = c[e * k + j];
      a.before[e] += len;
      if (!by_probability) {
        // Slot j's competitors for e hold ranks base, base + 1, ...; those below C stay.
        const int64_t base = offsets.empty() ? earlier_slots : offsets[j * E + e];
        a.after[e] += limited ? std::clamp<int64_t>(capacity - base, 0, len) : len;
      }
      earlier_slots += len;
    }
    if (by_probability) a.after[e] = limited ? std::min(a.before[e], capacity) : a.before[e];
  }
  return a;
}

}  // namespace switchyard::kernels::cuda
