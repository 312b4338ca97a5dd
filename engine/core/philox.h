// Counter-based random numbers: Philox4x32-10 (Salmon et al., "Parallel random numbers:
// as easy as 1, 2, 3", SC 2011). Every value is a pure function of (seed, stream, index),
// so a tensor's random values do not depend on how it is chunked, sharded or which device
// draws them. The same header runs on the host and in CUDA kernels.
//
// Layout: element `index` of stream `stream` under `seed` is word (index % 4) of the block
//   Philox4x32-10(counter = {lo(index/4), hi(index/4), lo(stream), hi(stream)},
//                 key = {lo(seed), hi(seed)}).
// Normal values use one block per element (Box-Muller on words 0 and 1).
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

#if defined(__CUDACC__)
#define SY_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SY_HOST_DEVICE inline
#endif

namespace switchyard {

struct PhiloxBlock {
  uint32_t v[4];
};

SY_HOST_DEVICE uint32_t MulHiLo32(uint32_t a, uint32_t b, uint32_t* hi) {
  uint64_t product = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(product >> 32);
  return static_cast<uint32_t>(product);
}

// Philox4x32 with 10 rounds: the Random123 reference constants.
SY_HOST_DEVICE PhiloxBlock Philox4x32(PhiloxBlock ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    uint32_t lo0 = MulHiLo32(kM0, ctr.v[0], &hi0);
    uint32_t lo1 = MulHiLo32(kM1, ctr.v[2], &hi1);
    ctr = PhiloxBlock{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return ctr;
}

// What a random draw is keyed by, besides the element index.
struct RngKey {
  uint64_t seed = 0;
  uint64_t stream = 0;  // what the numbers are for (see StreamId)
};

SY_HOST_DEVICE PhiloxBlock PhiloxAt(RngKey key, uint64_t block) {
  PhiloxBlock ctr{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                   static_cast<uint32_t>(key.stream), static_cast<uint32_t>(key.stream >> 32)}};
  return Philox4x32(ctr, static_cast<uint32_t>(key.seed), static_cast<uint32_t>(key.seed >> 32));
}

// Uniform in [0, 1) with 24 random bits.
SY_HOST_DEVICE float UniformFromBits(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

// The raw 32-bit word for element `index`.
SY_HOST_DEVICE uint32_t RandomBitsAt(RngKey key, uint64_t index) {
  return PhiloxAt(key, index >> 2).v[index & 3];
}

// Uniform [0, 1) for element `index`.
SY_HOST_DEVICE float UniformAt(RngKey key, uint64_t index) {
  return UniformFromBits(RandomBitsAt(key, index));
}

// Standard normal for element `index` (Box-Muller; u1 in (0, 1] so log is finite).
SY_HOST_DEVICE float NormalAt(RngKey key, uint64_t index) {
  PhiloxBlock b = PhiloxAt(key, index);
  float u1 = (static_cast<float>(b.v[0] >> 8) + 1.0f) * (1.0f / 16777216.0f);
  float u2 = UniformFromBits(b.v[1]);
  constexpr float kTwoPi = 6.28318530717958647692f;
  // The same expression on both sides; host and device libm may differ in the last ulp.
  return sqrtf(-2.0f * logf(u1)) * cosf(kTwoPi * u2);
}

// A stable 64-bit stream id for a name (FNV-1a), e.g. StreamId("layers.3.moe.router").
constexpr uint64_t StreamId(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace switchyard
