// The host model of kernels/cuda/wgmma.cuh (included by tests/kernels/cuda_emulation.h, after
// its model of the rest of CUDA): wgmma.mma_async m64n128k16 and m64n256k16 bf16 on 128-byte
// swizzled shared operands, and its fences.
//  - A shared address is the byte offset from the start of the kernels' shared memory (the
//    buffer emu::Launch runs the CTA on), so the swizzle, which acts on address bits, lands
//    where the kernel's 1024-byte alignment put it.
//  - A product is recorded when issued and computed when this thread's WgmmaWait<N> leaves at
//    most N newer groups: it reads the shared tiles then, so a tile overwritten (or poisoned by
//    a cp.async issued into it) before the wait shows as wrong values, and accumulators read
//    before the wait hold the old sums. A CTA that ends with products pending fails.
//  - Each thread computes its own N / 2 accumulators from the descriptors with the layout of
//    wgmma.cuh's comment: f32 sums of the exact bf16 products in k order onto d, as the
//    mma.sync model does, so the same tiles give the same bits as the mma.sync kernels.
// What it cannot show: whether that layout is the hardware's (the GPU tests check that), a
// missing WgmmaFence or FenceProxyAsync (no-ops here), and anything about speed.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cuda/wgmma.cuh"

namespace emu {
inline unsigned char* shared_base = nullptr;  // the running CTA's shared memory (emu::Launch)
// The shared address of shared_base: not on 1024 bytes, as a CTA's dynamic shared memory need
// not be, so that the kernels' own placement of their 1024-byte swizzle atoms (StagesOf) and
// the swizzle's use of the absolute address run as they would on a GPU.
inline constexpr uint32_t kSharedWindow = 0x80;

struct PendingWgmma {
  float* d;
  int n;  // the instruction's N
  uint64_t a, b;
  bool trans_a, trans_b;
};
// The running thread's (emu::Launch swaps them with each thread's own at every turn).
inline std::vector<PendingWgmma> wgmma_open;                 // not yet committed
inline std::vector<std::vector<PendingWgmma>> wgmma_groups;  // oldest first

inline int WgmmaPending() {
  size_t n = wgmma_open.size();
  for (const auto& g : wgmma_groups) n += g.size();
  return static_cast<int>(n);
}

// Expects a descriptor this model (and wgmma.cuh's layout) covers.
inline void CheckDescriptor(uint64_t desc, bool mn_major) {
  EXPECT_EQ(desc >> 62, 1u) << "a 128-byte swizzled operand";
  EXPECT_EQ(desc >> 49 & 7u, 0u) << "base offset 0: aligned atoms";
  const uint32_t start = static_cast<uint32_t>(desc & 0x3FFFu) << 4;
  if (!mn_major) {
    EXPECT_LE(start % 128 + 32, 128u) << "K-major: one instruction's K in a row";
  }
}

// Element (mn, k) of the operand a descriptor describes, k < 16 (one instruction's K).
inline float SwizzledElement(uint64_t desc, bool mn_major, int mn, int k) {
  const uint32_t start = static_cast<uint32_t>(desc & 0x3FFFu) << 4;
  const uint32_t lbo = static_cast<uint32_t>(desc >> 16 & 0x3FFFu) << 4;
  const uint32_t sbo = static_cast<uint32_t>(desc >> 32 & 0x3FFFu) << 4;
  uint32_t at = mn_major ? start + mn / 64 * lbo + k / 8 * sbo + k % 8 * 128 + mn % 64 * 2
                         : start + mn / 8 * sbo + mn % 8 * 128 + k * 2;
  at ^= (at >> 7 & 7u) << 4;  // on the absolute address
  if (at < kSharedWindow || at - kSharedWindow + 2 > kSharedBytes) {
    ADD_FAILURE() << "a wgmma operand outside shared memory: address " << at;
    return NAN;
  }
  switchyard::BFloat16 v;
  std::memcpy(&v.bits, shared_base + (at - kSharedWindow), 2);
  return static_cast<float>(v);
}

inline void RunWgmma(const PendingWgmma& p) {
  CheckDescriptor(p.a, p.trans_a);
  CheckDescriptor(p.b, p.trans_b);
  const int in_group = LinearThread() % 128, warp = in_group / 32, lane = in_group % 32;
  const int g = lane / 4, t = lane % 4;
  for (int j = 0; j < p.n / 8; ++j) {
    for (int r = 0; r < 4; ++r) {
      const int row = 16 * warp + g + 8 * (r / 2), col = 8 * j + 2 * t + r % 2;
      float acc = p.d[4 * j + r];
      for (int k = 0; k < 16; ++k) {
        acc += SwizzledElement(p.a, p.trans_a, row, k) * SwizzledElement(p.b, p.trans_b, col, k);
      }
      p.d[4 * j + r] = acc;
    }
  }
}
}  // namespace emu

namespace switchyard::kernels::cuda {
inline uint32_t SharedAddress(const void* p) {
  const auto* c = static_cast<const unsigned char*>(p);
  EXPECT_TRUE(c >= emu::shared_base && c < emu::shared_base + emu::kSharedBytes)
      << "SharedAddress of memory outside the kernels' shared memory";
  return static_cast<uint32_t>(c - emu::shared_base) + emu::kSharedWindow;
}
inline void WgmmaFence() {}
inline void FenceProxyAsync() {}
inline void WgmmaCommit() {
  emu::wgmma_groups.push_back(std::move(emu::wgmma_open));
  emu::wgmma_open.clear();
}
template <int N>
void WgmmaWait() {
  while (emu::wgmma_groups.size() > static_cast<size_t>(N)) {
    for (const emu::PendingWgmma& p : emu::wgmma_groups.front()) emu::RunWgmma(p);
    emu::wgmma_groups.erase(emu::wgmma_groups.begin());
  }
}
template <int N, bool kTransA, bool kTransB>
void WgmmaM64N(float (&d)[N / 2], uint64_t a, uint64_t b) {
  static_assert(N == 128 || N == 256, "m64n128k16 or m64n256k16");
  emu::wgmma_open.push_back({d, N, a, b, kTransA, kTransB});
}
}  // namespace switchyard::kernels::cuda
