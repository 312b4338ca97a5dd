// The device code of the elementwise family (kernels/cuda/elementwise_kernels.cuh) run on the
// CPU, without a GPU, through the host model of CUDA in tests/kernels/cuda_emulation.h, with
// elementwise.cu's launch shapes, against the CPU twins (kernels/elementwise.h).
//
// What it checks: Add, Mul, Axpy, MulAdd (and Add in place), Fill (f32, bf16) and the f32 <->
// bf16 casts (one element a thread and four), with NaN payloads, infinities, rounding ties,
// negative zero and denormals (f32 -> bf16), and every bf16 bit pattern (bf16 -> f32):
// bit-equal to the CPU and to engine/core/dtype.h's BFloat16; on the .cu's grids and on grids
// capped below n / 256 blocks (the grid-stride loop); outputs pre-filled (every element
// written). ZeroMany's kernel: each piece of a table zeroed, whatever its alignment, and
// nothing around it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "kernels/elementwise.h"
// Last: the host model defines CUDA's qualifiers as macros.
#include "tests/kernels/cuda_emulation.h"

#include "kernels/cuda/elementwise_kernels.cuh"
#include "tests/kernels/flat_emulation.h"

namespace switchyard::kernels {
namespace {

namespace ew = cuda::elementwise;
using namespace flat_emulation;  // the shared helpers (tests/kernels/flat_emulation.h)

// A grid of the elementwise kernels: the .cu's (max_blocks 0), or capped at max_blocks.
unsigned EwGrid(int64_t n, int64_t max_blocks) {
  return cuda::GridFor(n, ew::kThreads, max_blocks == 0 ? cuda::kMaxGridBlocks : max_blocks);
}

TEST(ElementwiseEmulationTest, LaunchShapesAreGridFors) {
  EXPECT_EQ(EwGrid(1, 0), 1u);
  EXPECT_EQ(EwGrid(513, 0), 3u);
  EXPECT_EQ(EwGrid(int64_t{1} << 40, 0), 65535u * 8);
}

TEST(ElementwiseEmulationTest, ArithmeticEqualsTheCpuBitForBit) {
  uint64_t stream = 900;
  for (const Sized& s : kSingle) {
    const int64_t n = s.n;
    const unsigned grid = EwGrid(n, s.max_blocks);
    const std::string name = " n " + std::to_string(n) + " grid " + std::to_string(grid);
    const std::vector<float> a = WithSpecials(n, ++stream), b = Uniform(n, ++stream, -3, 3);
    std::vector<float> av = a, bv = b;  // the CPU ops take mutable tensors
    const Tensor ta = Wrap(av.data(), n), tb = Wrap(bv.data(), n);
    const std::vector<float> y0 = Uniform(n, ++stream, -3.0f, 3.0f);
    auto run = [&](auto op, const float* b_or_null, float alpha, std::vector<float>& out) {
      Launch(grid, ew::kThreads, [&] {
        ew::ArithKernel<decltype(op)::value>(a.data(), b_or_null, out.data(), alpha, n);
      });
    };
    using Add = std::integral_constant<ew::Op, ew::Op::kAdd>;
    using Mul = std::integral_constant<ew::Op, ew::Op::kMul>;
    using Axpy = std::integral_constant<ew::Op, ew::Op::kAxpy>;
    using MulAdd = std::integral_constant<ew::Op, ew::Op::kMulAdd>;
    std::vector<float> got(n, kNaN), want(n, kNaN);
    Tensor tw = Wrap(want.data(), n);
    run(Add{}, b.data(), 0.0f, got);
    kernels::Add(ta, tb, tw);
    ExpectSameBits(got, want, "Add" + name);
    std::fill(got.begin(), got.end(), kNaN);
    run(Mul{}, b.data(), 0.0f, got);
    kernels::Mul(ta, tb, tw);
    ExpectSameBits(got, want, "Mul" + name);
    got = want = y0;
    run(Axpy{}, nullptr, -1.7f, got);
    kernels::Axpy(-1.7f, ta, tw);
    ExpectSameBits(got, want, "Axpy" + name);
    got = want = y0;
    run(MulAdd{}, b.data(), 0.0f, got);
    kernels::MulAdd(ta, tb, tw);
    ExpectSameBits(got, want, "MulAdd" + name);
    // In place: out is a's memory.
    std::vector<float> in_place = a;
    Launch(grid, ew::kThreads, [&] {
      ew::ArithKernel<ew::Op::kAdd>(in_place.data(), b.data(), in_place.data(), 0.0f, n);
    });
    kernels::Add(ta, tb, tw);
    ExpectSameBits(in_place, want, "Add in place" + name);
  }
}

TEST(ElementwiseEmulationTest, FillEqualsTheCpuBitForBit) {
  const float values[] = {1.0f / 3.0f, -0.0f, kNaN, -kInf, FromBits(0x3f818000u), 1e-40f};
  for (const Sized& s : kSingle) {
    const unsigned grid = EwGrid(s.n, s.max_blocks);
    for (float value : values) {
      const std::string name = "Fill " + std::to_string(value) + " n " + std::to_string(s.n);
      std::vector<float> got(s.n, 1.0f), want(s.n, 2.0f);
      Launch(grid, ew::kThreads, [&] { ew::FillKernel<float>(got.data(), value, s.n); });
      Tensor tw = Wrap(want.data(), s.n);
      Fill(tw, value);
      ExpectSameBits(got, want, name + " f32");
      // bf16: elementwise.cu passes BFloat16::FromFloat(value) as the bits.
      std::vector<uint16_t> got16(s.n, 0x1234u), want16(s.n, 0x4321u);
      Launch(grid, ew::kThreads, [&] {
        ew::FillKernel<uint16_t>(got16.data(), BFloat16::FromFloat(value), s.n);
      });
      Tensor tw16 = Tensor::Wrap(want16.data(), {s.n}, DType::kBF16, Device::Cpu());
      Fill(tw16, value);
      ExpectSameBits(got16, want16, name + " bf16");
    }
  }
}

// ZeroManyKernel over pieces of one buffer at offsets and sizes that take each of its three
// paths (16-byte words, 4-byte words, bytes), on elementwise.cu's blocks (ZeroManyBlocks: as
// many as each piece's words need, at most kZeroMaxBlocks) and with at most 1 and 2 blocks a
// piece (the stride): every byte of every piece becomes 0, and the bytes between them keep
// their 0xAB.
TEST(ElementwiseEmulationTest, ZeroManyZeroesEachPieceAndNothingElse) {
  struct Piece {
    int64_t offset, bytes;
  };
  const Piece pieces[] = {{0, 4096 * 16},    // 16-byte words: 16 blocks of 256 threads
                          {65600, 48},       // 16-byte aligned, 3 words
                          {65700, 4 * 999},  // 4-byte words (offset 4 mod 16)
                          {69700, 37},       // bytes (odd size)
                          {69801, 64}};      // bytes (odd offset)
  constexpr int64_t kBuffer = 70000;
  for (int64_t max_blocks : {ew::kZeroMaxBlocks, int64_t{1}, int64_t{2}}) {
    // 16-byte aligned storage, so that the offsets decide the paths.
    std::vector<ew::Words16> storage(kBuffer / 16 + 1);
    unsigned char* buffer = reinterpret_cast<unsigned char*>(storage.data());
    std::memset(buffer, 0xAB, kBuffer);
    ew::ZeroTable table;
    for (const Piece& p : pieces) {
      table.ptr[table.count] = buffer + p.offset;
      table.bytes[table.count] = p.bytes;
      ++table.count;
    }
    const unsigned blocks = ew::ZeroManyBlocks(table, max_blocks);
    // 4096 words over 256 threads, then one block each (250, 3 and fewer words).
    EXPECT_EQ(blocks, max_blocks == ew::kZeroMaxBlocks ? 16u + 4 : max_blocks == 1 ? 5u : 6u);
    Launch(blocks, ew::kThreads, [&] { ew::ZeroManyKernel(table); });
    int64_t zeroed = 0;
    for (int64_t i = 0; i < kBuffer; ++i) {
      bool inside = false;
      for (const Piece& p : pieces) inside = inside || (i >= p.offset && i < p.offset + p.bytes);
      ASSERT_EQ(buffer[i], inside ? 0 : 0xAB) << "byte " << i << ", max blocks " << max_blocks;
      zeroed += inside;
    }
    EXPECT_EQ(zeroed, 4096 * 16 + 48 + 4 * 999 + 37 + 64);
  }
}

// f32 bit patterns the rounding to bf16 must get right, then random patterns.
std::vector<float> CastInputs(int64_t random) {
  const uint32_t bits[] = {
      0x00000000u, 0x80000000u,                            // zeros
      0x7f800000u, 0xff800000u,                            // infinities
      0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u,  // NaNs: quiet, signalling
      0x7fbfffffu, 0x7fc12345u, 0xffffffffu, 0x7f80ffffu,  // NaN payloads
      0x3f808000u, 0x3f818000u, 0xbf808000u, 0xbf818000u,  // ties: to even (down, up)
      0x3f807fffu, 0x3f808001u, 0x3f80ffffu,               // below, above a tie
      0x7f7fffffu, 0x7f7f8000u, 0x7f7f7fffu, 0xff7fffffu,  // the largest: to inf or not
      0x00000001u, 0x00008000u, 0x00018000u, 0x00007fffu,  // denormals: ties, below
      0x007fffffu, 0x807fffffu, 0x80008000u, 0x8000ffffu,  // largest denormal, negatives
      0x00800000u, 0x007f8000u, 0x007f7fffu};              // smallest normal, the boundary
  std::vector<float> x;
  for (uint32_t b : bits) x.push_back(FromBits(b));
  std::mt19937 rng(2024);
  for (int64_t i = 0; i < random; ++i) x.push_back(FromBits(static_cast<uint32_t>(rng())));
  return x;
}

TEST(ElementwiseEmulationTest, CastsEqualTheCpuAndBFloat16BitForBit) {
  for (const Sized& s : std::vector<Sized>{{0, 0}, {5000, 0}, {5000, 3}}) {
    const std::vector<float> src = CastInputs(s.n);
    const int64_t n = static_cast<int64_t>(src.size());
    const std::string name =
        "f32 -> bf16 n " + std::to_string(n) + " grid " + std::to_string(EwGrid(n, s.max_blocks));
    std::vector<uint16_t> got(n, 0xffffu), want(n, 0u);
    Launch(EwGrid(n, s.max_blocks), ew::kThreads,
           [&] { ew::F32ToBf16Kernel<1>(src.data(), got.data(), n); });
    std::vector<float> src_copy = src;
    Tensor tw = Tensor::Wrap(want.data(), {n}, DType::kBF16, Device::Cpu());
    Cast(Wrap(src_copy.data(), n), tw);
    ExpectSameBits(got, want, name + " vs Cast");
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(got[i], BFloat16::FromFloat(src[i])) << name << " element " << i;
    }
    // Four a thread (the .cu's grid over n / 4 quads; n % 4 tail elements), the same bits.
    ASSERT_TRUE(ew::CastQuadsFit(src.data(), got.data()));
    std::fill(got.begin(), got.end(), 0xffffu);
    Launch(EwGrid(n / 4, s.max_blocks), ew::kThreads,
           [&] { ew::F32ToBf16Kernel<4>(src.data(), got.data(), n); });
    ExpectSameBits(got, want, name + " four a thread, n % 4 = " + std::to_string(n % 4));
  }
  // Every bf16 pattern, on the .cu's grid and on a capped one.
  std::vector<uint16_t> all(65536);
  for (uint32_t b = 0; b < all.size(); ++b) all[b] = static_cast<uint16_t>(b);
  const int64_t n = static_cast<int64_t>(all.size());
  std::vector<float> want(n, 1.0f);
  Tensor tw = Wrap(want.data(), n);
  Cast(Tensor::Wrap(all.data(), {n}, DType::kBF16, Device::Cpu()), tw);
  for (int64_t max_blocks : {0, 5}) {
    std::vector<float> got(n, kNaN);
    Launch(EwGrid(n, max_blocks), ew::kThreads,
           [&] { ew::Bf16ToF32Kernel<1>(all.data(), got.data(), n); });
    ExpectSameBits(got, want, "bf16 -> f32 grid " + std::to_string(EwGrid(n, max_blocks)));
    for (int64_t i = 0; i < n; ++i) {
      const float expected = BFloat16::ToFloat(all[i]);
      ASSERT_EQ(std::memcmp(&got[i], &expected, 4), 0) << "bf16 -> f32 pattern " << i;
    }
    // Four a thread, over every pattern and over a length with a tail (n - 3).
    for (const int64_t m : {n, n - 3}) {
      std::vector<float> got4(m, kNaN), want4(want.begin(), want.begin() + m);
      ASSERT_TRUE(ew::CastQuadsFit(got4.data(), all.data()));
      Launch(EwGrid(m / 4, max_blocks), ew::kThreads,
             [&] { ew::Bf16ToF32Kernel<4>(all.data(), got4.data(), m); });
      ExpectSameBits(got4, want4, "bf16 -> f32 four a thread, n " + std::to_string(m));
    }
  }
}

}  // namespace
}  // namespace switchyard::kernels
