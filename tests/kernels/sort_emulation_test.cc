// The dispatch sort's device code (kernels/cuda/sort_assignments_kernels.cuh: the keys, the
// pass over the sorted keys that writes slot, token, inverse and each key's segment bounds,
// and the device-sized offsets) run on the CPU, without a GPU, through the host model of CUDA
// in tests/kernels/cuda_emulation.h, with the .cu's 256-thread blocks. CUB's radix sort
// between the kernels is a stable sort by key here: a radix sort over bits [0, KeyBits(E))
// is stable, and every key fits in those bits (checked).
//
// What it checks, on random routings (k = 1, 2, 4; E = 1, 3, 8, 33; a quarter dropped; grids
// smaller than the work, so the grid-stride loops run their tails):
//  - slot, token, inverse and the counts from the bounds equal cpu::SortAssignments exactly;
//  - offsets equal cpu::SortAssignmentsToOffsets exactly;
//  - a kept assignment with an expert outside [0, E) is sorted after the dropped ones, its
//    inverse is -1 and it is in no expert's rows (the CUDA contract of kernels/permute.h), and
//    the bounds count it for SortAssignments' fatal check.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/philox.h"
#include "engine/core/tensor.h"
#include "kernels/permute.h"
// Last: the host model defines CUDA's qualifiers as macros.
#include "tests/kernels/cuda_emulation.h"

#include "kernels/cuda/sort_assignments_kernels.cuh"

namespace switchyard::kernels {
namespace {

namespace sd = cuda::sort_dev;
constexpr unsigned kThreads = 256;  // the .cu's block

struct DeviceSort {
  std::vector<int64_t> token, slot, inverse, offsets;
  std::vector<int32_t> bounds;  // (2, E + 2): each key's [begin, end)
};

// The .cu's sequence on `blocks` blocks: keys, the stable sort, the pass, the offsets.
DeviceSort RunDeviceSort(const std::vector<int32_t>& experts, const std::vector<uint8_t>& kept,
                         int64_t k, int32_t e, unsigned blocks) {
  const int64_t n = static_cast<int64_t>(experts.size());
  std::vector<uint32_t> keys(n);
  std::vector<int32_t> values(n);
  unsigned char unused_smem[1];
  emu::Launch({blocks, 1, 1}, kThreads, unused_smem, 0, 0, [&] {
    sd::MakeKeysKernel(experts.data(), kept.data(), n, e, keys.data(), values.data());
  });
  const int bits = sd::KeyBits(e);
  for (uint32_t key : keys) EXPECT_LT(key, uint32_t{1} << bits) << "a key past the sorted bits";
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return keys[a] < keys[b]; });
  std::vector<uint32_t> keys_out(n);
  std::vector<int32_t> values_out(n);
  for (int64_t i = 0; i < n; ++i) keys_out[i] = keys[order[i]], values_out[i] = values[order[i]];

  DeviceSort d;
  d.token.assign(n, -7), d.slot.assign(n, -7), d.inverse.assign(n, -7);
  d.bounds.assign(2 * (e + 2), 0);  // the .cu's memset
  emu::Launch({blocks, 1, 1}, kThreads, unused_smem, 0, 0, [&] {
    sd::FinishSortKernel(keys_out.data(), values_out.data(), n, k, static_cast<uint32_t>(e),
                         d.token.data(), d.slot.data(), d.inverse.data(), d.bounds.data());
  });
  d.offsets.assign(e + 1, -7);
  emu::Launch({blocks, 1, 1}, kThreads, unused_smem, 0, 0, [&] {
    sd::OffsetsKernel(keys_out.data(), n, e, d.offsets.data());
  });
  return d;
}

struct Routing {
  std::vector<int32_t> experts;
  std::vector<uint8_t> kept;
};

Routing RandomRouting(int64_t n, int32_t e, uint64_t seed) {
  Routing r;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t expert_bits = RandomBitsAt(RngKey{seed, 3}, 2 * i);
    const uint32_t kept_bits = RandomBitsAt(RngKey{seed, 3}, 2 * i + 1);
    r.experts.push_back(static_cast<int32_t>(expert_bits % static_cast<uint32_t>(e)));
    r.kept.push_back(kept_bits % 4 != 0);
  }
  return r;
}

TEST(SortEmulationTest, MatchesTheCpuSortExactly) {
  for (int64_t k : {1, 2, 4}) {
    for (int32_t e : {1, 3, 8, 33}) {
      for (int64_t tokens : {1, 7, 300}) {
        const int64_t n = tokens * k;
        const Routing r = RandomRouting(n, e, 100 * k + e + tokens);
        Tensor token = Tensor::Empty({n}, DType::kI64), slot = Tensor::Empty({n}, DType::kI64);
        Tensor inverse = Tensor::Empty({n}, DType::kI64);
        Tensor offsets = Tensor::Empty({e + 1}, DType::kI64);
        const Tensor experts = Tensor::FromVector(r.experts, {tokens, k});
        const Tensor kept = Tensor::FromVector(r.kept, {tokens, k});
        const std::vector<int64_t> counts =
            cpu::SortAssignments(experts, kept, e, token, slot, inverse);
        cpu::SortAssignmentsToOffsets(experts, kept, e, token, slot, inverse, offsets);
        // Fewer blocks than the work (one block of 256 over 1200 slots) and more.
        for (unsigned blocks : {1u, 3u}) {
          SCOPED_TRACE(::testing::Message() << "k " << k << " E " << e << " tokens " << tokens
                                            << " blocks " << blocks);
          const DeviceSort d = RunDeviceSort(r.experts, r.kept, k, e, blocks);
          EXPECT_EQ(d.token, token.ToVector<int64_t>());
          EXPECT_EQ(d.slot, slot.ToVector<int64_t>());
          EXPECT_EQ(d.inverse, inverse.ToVector<int64_t>());
          EXPECT_EQ(d.offsets, offsets.ToVector<int64_t>());
          for (int32_t x = 0; x < e; ++x) {
            EXPECT_EQ(d.bounds[e + 2 + x] - d.bounds[x], counts[x]) << "expert " << x;
          }
          EXPECT_EQ(d.bounds[2 * (e + 2) - 1] - d.bounds[e + 1], 0) << "invalid count";
        }
      }
    }
  }
}

TEST(SortEmulationTest, AnOutOfRangeExpertIsSortedOutOfEveryGroup) {
  // N = 4, k = 2, E = 3; slot 2 names expert 5, slot 5 expert -1 (both kept), slot 6 dropped.
  const std::vector<int32_t> experts = {2, 0, 5, 1, 1, -1, 0, 2};
  const std::vector<uint8_t> kept = {1, 1, 1, 1, 1, 1, 0, 1};
  const DeviceSort d = RunDeviceSort(experts, kept, 2, 3, 1);
  // Kept in range, by expert then slot: 1 | 3 4 | 0 7; then dropped 6; then invalid 2 5.
  EXPECT_EQ(d.slot, (std::vector<int64_t>{1, 3, 4, 0, 7, 6, 2, 5}));
  EXPECT_EQ(d.token, (std::vector<int64_t>{0, 1, 2, 0, 3, 3, 1, 2}));
  EXPECT_EQ(d.inverse, (std::vector<int64_t>{3, 0, -1, 1, 2, -1, -1, 4}));
  EXPECT_EQ(d.offsets, (std::vector<int64_t>{0, 1, 3, 5}));
  // begin row then end row over keys 0..E+1: 1, 2, 2 kept, 1 dropped, 2 invalid.
  EXPECT_EQ(d.bounds, (std::vector<int32_t>{0, 1, 3, 5, 6, 1, 3, 5, 6, 8}));
}

}  // namespace
}  // namespace switchyard::kernels
