// The device code of capacity admission (kernels/cuda/admission.cu, which launches it around
// CUB's radix sort and scan, and describes the method): the sort keys and class counts, the
// ranks of the sorted assignments, and the admitted counts per expert; with the launch shape
// and the sort's key bits, which the host side and tests/kernels/dispatch_emulation_test.cc
// both use. Include after kernels/cuda/common.cuh (or the host model of CUDA).
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

namespace switchyard::kernels::cuda::dispatch::admission {
// Internal linkage: the emulation test compiles these kernels too, and links with admission.cu.
namespace {

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

constexpr int kThreads = 256;  // every admission kernel's block

// The key bits [0, end) the radix sort orders by: the fewest that hold every key.
inline int SortEndBit(bool by_probability, int64_t k, int64_t E) {
  return by_probability ? 32 + std::bit_width(static_cast<uint64_t>(E) + 1)
                        : std::bit_width(static_cast<uint64_t>(k * E + 1));
}

// Order-preserving unsigned image of a float (ascending), with -0 taken as +0 (the CPU
// compares gates with >, which treats them as equal).
__device__ __forceinline__ uint32_t OrderedBits(float g) {
  if (g == 0.0f) g = 0.0f;
  const uint32_t bits = __float_as_uint(g);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

template <bool kByProbability>
using AdmissionKey = std::conditional_t<kByProbability, unsigned long long, uint32_t>;

// keys, values (n): assignment i's sort key and i; counts (k E + 2) += its class.
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

// out[e] = the admitted assignments of expert e (AdmitAssignments' host loop with no
// offsets, one thread per expert), out[E] = the out-of-range count. c: the (k E + 2) class
// counts of the keys kernel. Launched over E + 1 items.
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
}  // namespace switchyard::kernels::cuda::dispatch::admission
