// The host model of CUDA (tests/kernels/cuda_emulation.h) itself: what the device code's
// emulation tests rely on it to show.
//  - A thread reading shared memory another thread writes, with no barrier between, reads it
//    unwritten (NaN) in some thread's turn; with __syncthreads between, every read sees the write.
//  - Warp barriers (a shuffle) and the block barrier keep the threads' per-thread state
//    (threadIdx, blockIdx, cp.async groups) apart while they take turns.
//  - A barrier that not every thread reaches stops the program with one line (a GPU hangs).
#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

// Last: the host model defines CUDA's qualifiers as macros.
#include "tests/kernels/cuda_emulation.h"

namespace {

alignas(128) unsigned char smem[4096];

// Each thread writes its index to shared slot t, then reads slots t - 1 and t + 1 (a barrier
// between when `sync`) into out[2t], out[2t + 1].
void NeighbourKernel(float* out, bool sync) {
  float* s = reinterpret_cast<float*>(smem);
  const int t = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  s[t] = static_cast<float>(t);
  if (sync) __syncthreads();
  out[2 * t] = s[(t + n - 1) % n];
  out[2 * t + 1] = s[(t + 1) % n];
}

TEST(ModelEmulationTest, AMissingBarrierShowsAsUnwrittenSharedMemory) {
  const int n = 64;
  std::vector<float> out(2 * n, 0.0f);
  emu::Launch(EmuDim3{1, 1, 1}, n, smem, sizeof(smem), 0, [&] { NeighbourKernel(out.data(), true); });
  for (int t = 0; t < n; ++t) {
    EXPECT_EQ(out[2 * t], static_cast<float>((t + n - 1) % n)) << t;
    EXPECT_EQ(out[2 * t + 1], static_cast<float>((t + 1) % n)) << t;
  }
  emu::Launch(EmuDim3{1, 1, 1}, n, smem, sizeof(smem), 0, [&] { NeighbourKernel(out.data(), false); });
  int unwritten = 0;
  for (float v : out) unwritten += std::isnan(v);
  EXPECT_GT(unwritten, 0) << "every read found its write without a barrier";
}

TEST(ModelEmulationTest, ThreadsKeepTheirOwnStateAcrossTurns) {
  const unsigned blocks = 3;
  const int n = 96;
  std::vector<int> sums(blocks * n, -1);
  std::vector<float> src(blocks * n * 4), dst(blocks * n * 4, NAN);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  emu::Launch(EmuDim3{blocks, 1, 1}, n, smem, sizeof(smem), 0, [&] {
    const int t = static_cast<int>(threadIdx.x), b = static_cast<int>(blockIdx.x);
    const int i = b * n + t;
    // A copy in flight across the warp's barriers (each thread's group is its own).
    __pipeline_memcpy_async(&dst[4 * i], &src[4 * i], 16);
    __pipeline_commit();
    int sum = t;
    for (int lane_mask = 16; lane_mask > 0; lane_mask /= 2) sum += __shfl_xor_sync(~0u, sum, lane_mask);
    __syncthreads();
    __pipeline_wait_prior(0);
    // The warp's indices 32 w .. 32 w + 31 sum to 32 (32 w) + 496; the indices are still ours.
    EXPECT_EQ(static_cast<int>(threadIdx.x), t);
    EXPECT_EQ(static_cast<int>(blockIdx.x), b);
    sums[i] = sum;
  });
  for (unsigned b = 0; b < blocks; ++b) {
    for (int t = 0; t < n; ++t) EXPECT_EQ(sums[b * n + t], 32 * (t / 32 * 32) + 496) << b << " " << t;
  }
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), src.size() * sizeof(float)));
}

TEST(ModelEmulationDeathTest, ABarrierNotEveryThreadReachesStops) {
  EXPECT_DEATH(emu::Launch(EmuDim3{1, 1, 1}, 64, smem, sizeof(smem), 0,
                           [] {
                             if (threadIdx.x < 32) __syncthreads();
                           }),
               "emu: 32 of the CTA's 64 threads wait at barriers that the others never reach");
}

}  // namespace
