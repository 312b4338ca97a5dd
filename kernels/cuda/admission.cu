// CUDA capacity admission (kernels/moe_routing.h: AdmitAssignments), split from
// kernels/cuda/moe_routing.cu. The CPU loop in kernels/cpu/moe_routing.cc is the reference.
// The (T * k) assignments are sorted with a stable cub::DeviceRadixSort on the fewest key
// bits that order them (expert, slot) or (expert, decreasing gate); a rank is then the
// sorted position minus the start of the expert's (or the (expert, slot)) segment, from an
// exclusive scan of the per-key counts. Exact.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <bit>
#include <climits>
#include <cstring>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/moe_routing.h"

namespace switchyard::kernels::cuda {
namespace {

// ---- Admission ------------------------------------------------------------------------
//
// Every assignment i = t * k + j (token-major; the sort's value) gets a class K:
//   K = e * k + j  competing (keep = 1) for expert e in slot j
//   K = k * E      removed (keep = 0)
//   K = k * E + 1  expert index outside [0, E)
// counts[K] (atomics) and their exclusive scan `starts` give each class's segment in K
// order. The sort key orders the assignments:
//   position    key = K (u32): by expert, then slot, then token (stable: values ascend);
//   probability key = (e << 32) | ~Ordered(gate) (u64), removed/bad (E or E+1) << 32: by
//               expert, then decreasing gate, then token and slot (stable).
// Either way expert e's competitors form one segment starting at starts[e * k], and under
// `position` its slot-j ones the sub-segment starting at starts[e * k + j].

// Order-preserving unsigned image of a float (ascending), with -0 taken as +0 (the CPU
// compares gates with >, which treats them as equal).
__device__ __forceinline__ uint32_t OrderedBits(float g) {
  if (g == 0.0f) g = 0.0f;
  const uint32_t bits = __float_as_uint(g);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

template <bool kByProbability>
using AdmissionKey = std::conditional_t<kByProbability, unsigned long long, uint32_t>;

template <bool kByProbability>
__global__ void AdmissionKeysKernel(const int32_t* __restrict__ indices,
                                    const uint8_t* __restrict__ keep,
                                    const float* __restrict__ gates, int64_t n, int k, int E,
                                    AdmissionKey<kByProbability>* __restrict__ keys,
                                    int32_t* __restrict__ values,
                                    unsigned long long* __restrict__ counts) {
  using Key = AdmissionKey<kByProbability>;
  const int64_t removed = static_cast<int64_t>(k) * E;
  SY_GRID_STRIDE(i, n) {
    const int e = indices[i];
    const int j = static_cast<int>(i % k);
    int64_t cls;
    Key key;
    if (e < 0 || e >= E) {
      cls = removed + 1;
      if constexpr (kByProbability) key = static_cast<Key>(E + 1) << 32;
      else key = static_cast<Key>(cls);
    } else if (keep != nullptr && keep[i] == 0) {
      cls = removed;
      if constexpr (kByProbability) key = static_cast<Key>(E) << 32;
      else key = static_cast<Key>(cls);
    } else {
      cls = static_cast<int64_t>(e) * k + j;
      if constexpr (kByProbability) {
        key = (static_cast<Key>(e) << 32) | static_cast<Key>(~OrderedBits(gates[i]));
      } else {
        key = static_cast<Key>(cls);
      }
    }
    keys[i] = key;
    values[i] = static_cast<int32_t>(i);
    atomicAdd(&counts[cls], 1ull);
  }
}

// For sorted position s holding assignment v = t * k + j of expert e: rank = s - (the start
// of e's segment), or under `position` with offsets, s - starts[e * k + j] + offsets[j][e].
template <bool kByProbability>
__global__ void AdmissionRankKernel(const AdmissionKey<kByProbability>* __restrict__ keys,
                                    const int32_t* __restrict__ values, int64_t n, int k, int E,
                                    const long long* __restrict__ starts,
                                    const int64_t* __restrict__ offsets, int64_t capacity,
                                    uint8_t* __restrict__ kept, int64_t* __restrict__ position) {
  SY_GRID_STRIDE(s, n) {
    const auto key = keys[s];
    const int32_t v = values[s];
    int e, j;
    if constexpr (kByProbability) {
      e = static_cast<int>(key >> 32);
      if (e >= E) continue;  // removed or bad: they sort after every competitor
      j = v % k;
    } else {
      if (key >= static_cast<uint32_t>(k) * static_cast<uint32_t>(E)) continue;
      e = static_cast<int>(key / k);
      j = static_cast<int>(key % k);
    }
    const int64_t base = offsets != nullptr
                             ? starts[static_cast<int64_t>(e) * k + j] -
                                   offsets[static_cast<int64_t>(j) * E + e]
                             : starts[static_cast<int64_t>(e) * k];
    const int64_t rank = s - base;
    if (capacity < 0 || rank < capacity) {
      kept[v] = 1;
      position[v] = rank;
    }
  }
}

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

  AdmissionKeysKernel<kByProbability><<<GridFor(n), 256, 0, stream>>>(
      indices.data<int32_t>(), keep.defined() ? keep.data<uint8_t>() : nullptr,
      kByProbability ? gates.data<float>() : nullptr, n, k, E, kin, vin, cnt);
  SY_CUDA_CHECK_LAUNCH();

  // The fewest key bits that hold every key.
  const int end_bit = kByProbability
                          ? 32 + std::bit_width(static_cast<uint64_t>(E) + 1)
                          : std::bit_width(static_cast<uint64_t>(classes - 1));
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

  AdmissionRankKernel<kByProbability><<<GridFor(n), 256, 0, stream>>>(
      kout, vout, n, k, E, start_ll, offsets.defined() ? offsets.data<int64_t>() : nullptr,
      capacity, kept.data<uint8_t>(), position.data<int64_t>());
  SY_CUDA_CHECK_LAUNCH();
  return counts;
}

}  // namespace

namespace {

// out[e] = the admitted assignments of expert e (AdmitAssignments' host loop with no
// offsets, one thread per expert), out[E] = the out-of-range count. c: the (k E + 2) class
// counts of AdmitOnDevice.
__global__ void AdmittedCountsKernel(const int64_t* __restrict__ c, int64_t E, int64_t k,
                                     int64_t capacity, bool by_probability,
                                     double* __restrict__ out) {
  SY_GRID_STRIDE(e, E + 1) {
    if (e == E) {
      out[E] = static_cast<double>(c[k * E + 1]);
      continue;
    }
    int64_t before = 0, after = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t len = c[e * k + j];
      if (!by_probability) {
        // Slot j's competitors for e hold ranks before, before + 1, ...; those below C stay.
        after += capacity >= 0 ? min(max(capacity - before, int64_t{0}), len) : len;
      }
      before += len;
    }
    if (by_probability) after = capacity >= 0 ? min(before, capacity) : before;
    out[e] = static_cast<double>(after);
  }
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
  AdmittedCountsKernel<<<GridFor(E + 1), 256, 0, stream>>>(
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
