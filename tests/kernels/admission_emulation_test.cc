// The capacity admission's device code run on the CPU, without a GPU, through the host model
// of CUDA in tests/kernels/cuda_emulation.h (tests/kernels/dispatch_emulation.h), with the
// launch shapes of admission.cu, against the CPU twins.
// Admission (kernels/cuda/admission_kernels.cuh): the keys kernel, then what admission.cu
// asks of CUB done here on the host (an exclusive scan of the class counts, and a stable
// sort of (key, value) pairs on key bits [0, SortEndBit): CUB's radix-sort order), then
// the rank kernel and the admitted-counts kernel. kept, position and the counts must be
// EXACTLY the CPU's AdmitAssignments / AdmitAssignmentsInto: both orders, top-1, top-2 and
// wider, gates full of ties (equal values, +0 and -0, subnormals: the CPU's stable sort by
// `>` breaks them by token then slot), capacity 0, below, at and above the demand and
// unlimited, keep masks, priority offsets, expert indices outside [0, E) (sorted after
// everything and counted apart), and a grid capped to one block (grid-stride loops).
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/tensor.h"
#include "kernels/moe_routing.h"
#include "tests/kernels/dispatch_emulation.h"

#include "kernels/cuda/admission_kernels.cuh"

namespace switchyard::kernels {
namespace {

namespace adm = cuda::dispatch::admission;
using dispatch_emu::kNan;
using dispatch_emu::kNoCap;
using dispatch_emu::no_smem;
using dispatch_emu::Rng;
using emu::ExpectSameBits;

struct Routing {
  int64_t T = 0, k = 0, E = 0;
  std::vector<int32_t> indices;  // (T, k)
  std::vector<uint8_t> keep;     // (T, k), or empty for all (keep undefined)
  std::vector<float> gates;      // (T, k)
};

// T tokens, k distinct experts each (repeats when E < k), a third of them crowding onto
// expert 0; gates drawn from a few values (ties, +-0, a subnormal) when `ties`.
Routing MakeRouting(int64_t T, int64_t k, int64_t E, bool ties, bool with_keep, Rng& rng) {
  static const float kTied[] = {0.5f, 0.25f, 0.0f, -0.0f, 0.125f, 1e-40f, -1e-40f, 0.75f, -0.3f};
  Routing r{T, k, E, std::vector<int32_t>(T * k), {}, std::vector<float>(T * k)};
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      int32_t e;
      bool repeat;
      do {
        e = static_cast<int32_t>(j == 0 && rng.Int(3) == 0 ? 0 : rng.Int(E));
        repeat = false;
        for (int64_t i = 0; i < j && k <= E; ++i) repeat |= r.indices[t * k + i] == e;
      } while (repeat);
      r.indices[t * k + j] = e;
      r.gates[t * k + j] = ties ? kTied[rng.Int(std::size(kTied))] : rng.Uniform(0.0f, 1.0f);
    }
  }
  if (with_keep) {
    r.keep.resize(T * k);
    for (uint8_t& x : r.keep) x = rng.Int(5) != 0;
  }
  return r;
}

struct DeviceAdmission {
  std::vector<uint8_t> kept;      // (T, k)
  std::vector<int64_t> position;  // (T, k)
  std::vector<int64_t> classes;   // (k E + 2) class counts
  std::vector<double> admitted;   // (E + 1) AdmittedCountsKernel's (no offsets only)
};

// admission.cu's AdmitOnDevice (+ AdmittedCountsKernel without offsets) for one routing and
// order, at several capacities, CUB's scan and sort done on the host.
template <bool kByProbability>
class DeviceAdmitter {
 public:
  using Key = adm::AdmissionKey<kByProbability>;

  // The keys kernel, the scan of the class counts and the sort.
  DeviceAdmitter(const Routing& r, unsigned grid_cap) : r_(r), n_(r.T * r.k) {
    const int64_t classes = r.k * r.E + 2;
    std::vector<Key> keys(n_, static_cast<Key>(0x5A5A5A5A));
    std::vector<int32_t> values(n_, -7);
    std::vector<unsigned long long> counts(classes, 0);  // Tensor::Zeros
    blocks_ = std::min(cuda::GridFor(n_, adm::kThreads), grid_cap);
    counts_blocks_ = std::min(cuda::GridFor(r.E + 1, adm::kThreads), grid_cap);
    emu::Launch(EmuDim3{blocks_, 1, 1}, adm::kThreads, no_smem, 0, 0, [&] {
      adm::AdmissionKeysKernel<kByProbability>(
          r.indices.data(), r.keep.empty() ? nullptr : r.keep.data(),
          kByProbability ? r.gates.data() : nullptr, n_, static_cast<int>(r.k),
          static_cast<int>(r.E), keys.data(), values.data(), counts.data());
    });
    classes_.assign(counts.begin(), counts.end());
    // cub::DeviceScan::ExclusiveSum of the class counts.
    starts_.resize(classes);
    long long run = 0;
    for (int64_t c = 0; c < classes; ++c) starts_[c] = run, run += counts[c];
    // cub::DeviceRadixSort::SortPairs on key bits [0, end_bit): stable, higher bits unseen.
    const int end_bit = adm::SortEndBit(kByProbability, r.k, r.E);
    EXPECT_LE(end_bit, static_cast<int>(8 * sizeof(Key)));
    const Key mask = end_bit >= static_cast<int>(8 * sizeof(Key)) ? ~Key{0}
                                                                  : (Key{1} << end_bit) - 1;
    for (Key key : keys) EXPECT_EQ(key & ~mask, Key{0}) << "key bits past end_bit";
    std::vector<int64_t> order(n_);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t x, int64_t y) { return (keys[x] & mask) < (keys[y] & mask); });
    keys_.resize(n_);
    values_.resize(n_);
    for (int64_t s = 0; s < n_; ++s) keys_[s] = keys[order[s]], values_[s] = values[order[s]];
  }

  // The rank kernel (and the counts kernel without offsets) at this capacity.
  DeviceAdmission Admit(int64_t capacity, const std::vector<int64_t>& offsets) const {
    DeviceAdmission out{std::vector<uint8_t>(n_, 0), std::vector<int64_t>(n_, -1), classes_, {}};
    emu::Launch(EmuDim3{blocks_, 1, 1}, adm::kThreads, no_smem, 0, 0, [&] {
      adm::AdmissionRankKernel<kByProbability>(
          keys_.data(), values_.data(), n_, static_cast<int>(r_.k), static_cast<int>(r_.E),
          starts_.data(), offsets.empty() ? nullptr : offsets.data(), capacity,
          out.kept.data(), out.position.data());
    });
    if (offsets.empty()) {
      out.admitted.assign(r_.E + 1, kNan);
      emu::Launch(EmuDim3{counts_blocks_, 1, 1}, adm::kThreads, no_smem, 0, 0, [&] {
        adm::AdmittedCountsKernel(classes_.data(), r_.E, r_.k, capacity, kByProbability,
                                  out.admitted.data());
      });
    }
    return out;
  }

 private:
  const Routing& r_;
  int64_t n_;
  unsigned blocks_ = 0, counts_blocks_ = 0;
  std::vector<int64_t> classes_;
  std::vector<long long> starts_;
  std::vector<Key> keys_;  // sorted, with their values
  std::vector<int32_t> values_;
};

// Compares one device admission with the CPU's. bad: slots whose expert index was put
// outside [0, E) (the CPU, which rejects those, sees them with keep = 0 instead).
void CheckAdmission(const Routing& r, const DeviceAdmission& got, int64_t capacity,
                    AdmissionOrder order, const std::vector<int64_t>& offsets,
                    const std::vector<int64_t>& bad, const std::string& what) {
  const int64_t n = r.T * r.k, k = r.k, E = r.E;
  Routing cpu_r = r;
  if (!bad.empty() && cpu_r.keep.empty()) cpu_r.keep.assign(n, 1);
  for (int64_t s : bad) cpu_r.indices[s] = 0, cpu_r.keep[s] = 0;
  const Tensor indices = Tensor::FromVector(cpu_r.indices, {r.T, k});
  const Tensor gates = Tensor::FromVector(cpu_r.gates, {r.T, k});
  const Tensor keep = cpu_r.keep.empty() ? Tensor() : Tensor::FromVector(cpu_r.keep, {r.T, k});
  Tensor kept = Tensor::Empty({r.T, k}, DType::kU8);
  Tensor position = Tensor::Empty({r.T, k}, DType::kI64);
  const AdmissionCounts want =
      AdmitAssignments(indices, gates, keep, E, capacity, order, offsets, kept, position);
  ExpectSameBits(got.kept, kept.ToVector<uint8_t>(), what + ": kept");
  ExpectSameBits(got.position, position.ToVector<int64_t>(), what + ": position");
  const int64_t num_bad = static_cast<int64_t>(bad.size());
  EXPECT_EQ(got.classes[k * E + 1], num_bad) << what << ": out-of-range count";
  EXPECT_EQ(got.classes[k * E], want.removed - num_bad) << what << ": removed";
  for (int64_t e = 0; e < E; ++e) {
    int64_t before = 0;
    for (int64_t j = 0; j < k; ++j) before += got.classes[e * k + j];
    EXPECT_EQ(before, want.before[e]) << what << ": competitors of expert " << e;
  }
  if (!offsets.empty()) return;
  // AdmitAssignmentsInto's counts: the CPU's after, then the out-of-range count.
  Tensor counts = Tensor::Empty({E + 1}, DType::kF64);
  AdmitAssignmentsInto(indices, gates, keep, E, capacity, order, kept, position, counts);
  std::vector<double> want_counts = counts.ToVector<double>();
  want_counts[E] = static_cast<double>(num_bad);
  for (int64_t e = 0; e < E; ++e) ASSERT_EQ(want_counts[e], want.after[e]) << what;
  ExpectSameBits(got.admitted, want_counts, what + ": admitted counts");
}

// Admits r at each capacity on the device (the keys and the sort once) and checks each.
template <bool kByProbability>
void CheckCapacities(const Routing& r, const std::vector<int64_t>& capacities,
                     const std::vector<int64_t>& offsets, unsigned grid_cap,
                     const std::vector<int64_t>& bad, const std::string& what) {
  const AdmissionOrder order =
      kByProbability ? AdmissionOrder::kProbability : AdmissionOrder::kPosition;
  const DeviceAdmitter<kByProbability> device(r, grid_cap);
  for (int64_t capacity : capacities) {
    CheckAdmission(r, device.Admit(capacity, offsets), capacity, order, offsets, bad,
                   what + (kByProbability ? " probability" : " position") + " C " +
                       std::to_string(capacity));
  }
}

TEST(DispatchEmulationTest, AdmissionIsTheCpuOrderExactly) {
  struct Shape {
    int64_t T, k, E;
  };
  // top-1 and top-2 over several blocks (600 assignments: 3 blocks), both slots on one expert,
  // one token, more experts, a wider k (slot decoding).
  const std::vector<Shape> shapes = {{300, 1, 7}, {300, 2, 7}, {1, 2, 1}, {257, 2, 33},
                                     {64, 4, 5}};
  Rng rng(11);
  for (const Shape& sh : shapes) {
    // Demand per expert is ~T k / E (expert 0's about twice that): capacity unlimited, 0,
    // below, about at, above it and above every expert's demand.
    const int64_t mean = std::max<int64_t>(1, sh.T * sh.k / sh.E), all = sh.T * sh.k;
    const std::vector<std::vector<int64_t>> capacities = {
        {-1, mean / 2, mean}, {0, mean, all}, {mean / 2, 3 * mean, all}};
    for (int variant = 0; variant < 3; ++variant) {
      // Tied gates, distinct gates, tied gates with a keep mask.
      const Routing r = MakeRouting(sh.T, sh.k, sh.E, variant != 1, variant == 2, rng);
      const std::string what = "T " + std::to_string(sh.T) + " k " + std::to_string(sh.k) +
                               " E " + std::to_string(sh.E) + " variant " +
                               std::to_string(variant);
      CheckCapacities<false>(r, capacities[variant], {}, kNoCap, {}, what);
      CheckCapacities<true>(r, capacities[variant], {}, kNoCap, {}, what);
      if (variant == 2) {
        CheckCapacities<false>(r, {mean}, {}, 1, {}, what + " grid 1");
        CheckCapacities<true>(r, {mean}, {}, 1, {}, what + " grid 1");
        std::vector<int64_t> offsets(sh.k * sh.E);
        for (int64_t& o : offsets) o = rng.Int(mean + 2);
        CheckCapacities<false>(r, {-1, mean}, offsets, kNoCap, {}, what + " offsets");
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(DispatchEmulationTest, AdmissionSortsOutOfRangeExpertsAfterEverything) {
  Rng rng(12);
  for (int64_t k : {1, 2}) {
    Routing r = MakeRouting(200, k, 6, true, true, rng);
    std::vector<int64_t> bad;
    for (int64_t s = 3; s < r.T * k; s += 17) {
      r.indices[s] = s % 2 == 0 ? -1 : 6 + static_cast<int32_t>(s % 3);  // below 0, E or above
      bad.push_back(s);
    }
    const std::string what = "out of range, k " + std::to_string(k);
    CheckCapacities<false>(r, {-1, 20}, {}, kNoCap, bad, what);
    CheckCapacities<true>(r, {-1, 20}, {}, kNoCap, bad, what);
  }
}

}  // namespace
}  // namespace switchyard::kernels
