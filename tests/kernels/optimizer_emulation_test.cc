// The device code of the optimizer family (kernels/cuda/optimizer_kernels.cuh) run on the CPU,
// without a GPU, through the host model of CUDA in tests/kernels/cuda_emulation.h, with
// optimizer.cu's launch shapes and chunk tables (the .cuh helpers both use), against the CPU
// twins (kernels/optimizer.h). The elementwise family's: elementwise_emulation_test.cc.
//
// What it checks:
//  - AdamW (single tensor, and chunked over several tensors of one element, of sizes not a
//    multiple of the block, of exactly one chunk and of three chunks, and empty), with and
//    without weight decay, steps 1, 2, 3 and a later step with a clip factor; SGD with and
//    without momentum and weight decay; scale (single and chunked): bit-equal to the CPU, as
//    optimizer.cu promises (the same correctly rounded f32 operations in the same order);
//  - single-tensor kernels also on grids capped below n / 256 blocks (the grid-stride loop);
//  - the sums of squares (single: the real grid, up to its cap of 1024 blocks; chunked: one
//    block per chunk, the host adding each tensor's partials in order): bit-equal to the CPU
//    on values whose squares and sums are exact in double (so any element missed or added
//    twice shows), and within a bound by construction on random values: both sum the same n
//    non-negative exact products in double, so each is within gamma(n) S of the exact S
//    (gamma(n) = n u / (1 - n u), u = 2^-53), and they differ by at most 2 gamma(n) S;
//  - outputs pre-filled with NaN (every element written), exact-size buffers, and the chunked
//    tensors laid out in one buffer with a guard element around each, checked unchanged.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/dtype.h"
#include "engine/core/philox.h"
#include "engine/core/tensor.h"
#include "kernels/optimizer.h"
#include "kernels/random.h"
// Last: the host model defines CUDA's qualifiers as macros. The sum-of-squares kernels declare
// their shared arrays inside the kernel: static, they are one array for the CTA's threads.
#include "tests/kernels/cuda_emulation.h"
#undef __shared__
#define __shared__ static

#include "kernels/cuda/optimizer_kernels.cuh"
#include "tests/kernels/flat_emulation.h"

namespace switchyard::kernels {
namespace {

namespace opt = cuda::optimizer;
using namespace flat_emulation;  // the shared helpers (tests/kernels/flat_emulation.h)

// Values k / 16, k in [-64, 64]: their squares and any sum of up to 2^40 of them are exact.
std::vector<float> Sixteenths(int64_t n, uint64_t stream) {
  std::vector<float> x = Uniform(n, stream, -64.5f, 64.5f);
  for (float& v : x) v = std::nearbyint(v) / 16.0f;
  return x;
}

// A single-tensor grid: the .cu's (max_blocks 0), or capped at max_blocks.
unsigned OptGrid(int64_t n, int64_t max_blocks) {
  return cuda::GridFor(n, opt::kThreads, max_blocks == 0 ? cuda::kMaxGridBlocks : max_blocks);
}

std::string NameOf(const char* op, const Sized& s) {
  return std::string(op) + " n " + std::to_string(s.n) + " grid " +
         std::to_string(OptGrid(s.n, s.max_blocks));
}

// A gradient with some zeros.
std::vector<float> Gradient(int64_t n, uint64_t stream) {
  std::vector<float> g = Uniform(n, stream);
  for (int64_t i = 0; i < n; i += 7) g[i] = 0.0f;
  return g;
}

// One AdamW state: param, grad, m, v (v >= 0), with some zero moments.
struct AdamWState {
  std::vector<float> p, g, m, v;
};
AdamWState RandomState(int64_t n, uint64_t stream) {
  AdamWState s{Uniform(n, stream), Gradient(n, stream + 1), Uniform(n, stream + 2, -0.1f, 0.1f),
               Uniform(n, stream + 3, 0.0f, 1e-2f)};
  for (int64_t i = 3; i < n; i += 11) s.m[i] = s.v[i] = 0.0f;
  return s;
}

// The steps each AdamW case runs: 1, 2, 3 with new gradients, then step 1000 scaled by 0.5.
std::vector<AdamWStep> Steps(float weight_decay) {
  std::vector<AdamWStep> steps;
  for (int64_t t : {1, 2, 3, 1000}) {
    steps.push_back({.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                     .weight_decay = weight_decay, .step = t,
                     .grad_scale = t == 1000 ? 0.5f : 1.0f});
  }
  return steps;
}

TEST(OptimizerEmulationTest, LaunchShapesAreGridFors) {
  EXPECT_EQ(OptGrid(1, 0), 1u);
  EXPECT_EQ(OptGrid(256, 0), 1u);
  EXPECT_EQ(OptGrid(257, 0), 2u);
  EXPECT_EQ(OptGrid(int64_t{1} << 40, 0), 65535u * 8);
  EXPECT_EQ(opt::SumSquaresBlocks(1), 1u);
  EXPECT_EQ(opt::SumSquaresBlocks(4096), 1u);
  EXPECT_EQ(opt::SumSquaresBlocks(4097), 2u);
  EXPECT_EQ(opt::SumSquaresBlocks(int64_t{1} << 40), 1024u);
  int64_t chunks = 0, covered = 0;
  opt::ForEachChunk(2 * opt::kChunk + 3, [&](int64_t offset, int64_t length) {
    EXPECT_EQ(offset, covered);
    EXPECT_TRUE(length >= 1 && length <= opt::kChunk);
    covered += length;
    ++chunks;
  });
  EXPECT_EQ(chunks, 3);
  EXPECT_EQ(covered, 2 * opt::kChunk + 3);
}

TEST(OptimizerEmulationTest, AdamWSingleTensorEqualsTheCpuBitForBit) {
  uint64_t stream = 100;
  for (const Sized& s : kSingle) {
    for (float wd : {0.0f, 0.1f}) {
      const std::string name = NameOf("AdamW", s) + " wd " + std::to_string(wd);
      AdamWState emu = RandomState(s.n, stream), cpu = emu;
      stream += 4;
      for (const AdamWStep& hp : Steps(wd)) {
        emu.g = cpu.g = Gradient(s.n, ++stream);
        const float decay = AdamWScalarsOf(hp, hp.weight_decay).decay;
        const opt::AdamWConsts c = opt::ConstsOf(hp);
        Launch(OptGrid(s.n, s.max_blocks), opt::kThreads, [&] {
          opt::AdamWKernel(emu.p.data(), emu.g.data(), emu.m.data(), emu.v.data(), s.n, decay, c);
        });
        Tensor p = Wrap(cpu.p.data(), s.n), m = Wrap(cpu.m.data(), s.n);
        Tensor v = Wrap(cpu.v.data(), s.n);
        AdamWUpdate(p, Wrap(cpu.g.data(), s.n), m, v, hp);
        const std::string at = name + " step " + std::to_string(hp.step);
        ExpectSameBits(emu.p, cpu.p, at + " param");
        ExpectSameBits(emu.m, cpu.m, at + " exp_avg");
        ExpectSameBits(emu.v, cpu.v, at + " exp_avg_sq");
      }
    }
  }
}

// Several tensors of the given sizes back to back in one buffer, a guard element (kGuard)
// before, between and after them; with `align`, more guards so that each tensor starts on a
// multiple of 4 elements (16 bytes: the buffer's start is).
constexpr float kGuard = 1234.5f;  // any update or scaling changes it
struct Packed {
  std::vector<float> data;
  std::vector<int64_t> at;  // tensor k starts at data[at[k]]
};
Packed Pack(const std::vector<std::vector<float>>& tensors, bool align = false) {
  Packed b{{kGuard}, {}};
  for (const std::vector<float>& t : tensors) {
    while (align && b.data.size() % 4 != 0) b.data.push_back(kGuard);
    b.at.push_back(static_cast<int64_t>(b.data.size()));
    b.data.insert(b.data.end(), t.begin(), t.end());
    b.data.push_back(kGuard);
  }
  return b;
}
std::vector<float> Unpack(const Packed& b, size_t k, int64_t n) {
  return {b.data.begin() + b.at[k], b.data.begin() + b.at[k] + n};
}
void ExpectGuardsUnchanged(const Packed& b, const std::vector<int64_t>& sizes,
                           const std::string& what) {
  EXPECT_EQ(b.data[0], kGuard) << what << ": the guard before tensor 0 was written";
  for (size_t k = 0; k < b.at.size(); ++k) {
    const int64_t end = k + 1 < b.at.size() ? b.at[k + 1] : int64_t(b.data.size());
    for (int64_t i = b.at[k] + sizes[k]; i < end; ++i) {
      EXPECT_EQ(b.data[i], kGuard) << what << ": a guard after tensor " << k;
    }
  }
}

// Tensors of the chunked cases: one element; two blocks' worth of a chunk and 3; empty;
// exactly one chunk; three chunks, the last of 3 elements; 7. Seven chunks in all.
const std::vector<int64_t> kChunked = {1, 1027, 0, opt::kChunk, 2 * opt::kChunk + 3, 7};

// aligned: every tensor on 16 bytes, so that the chunks of a multiple of 4 elements take four
// elements a thread (opt::AdamWQuads; 3 of the 7 chunks), else element by element.
void CheckAdamWChunked(bool aligned) {
  const size_t count = kChunked.size();
  std::vector<AdamWState> cpu;
  std::vector<float> decays;
  for (size_t k = 0; k < count; ++k) {
    cpu.push_back(RandomState(kChunked[k], 200 + 4 * k));
    decays.push_back(k % 2 == 0 ? 0.0f : 0.05f * k);
  }
  auto role = [&](std::vector<float> AdamWState::*r) {
    std::vector<std::vector<float>> t;
    for (const AdamWState& s : cpu) t.push_back(s.*r);
    return Pack(t, aligned);
  };
  Packed p = role(&AdamWState::p), m = role(&AdamWState::m), v = role(&AdamWState::v);
  // bf16 weight shadows on the tensors of odd index (each its own exact-size buffer, as the
  // CPU's): the new values rounded in the update's pass.
  auto shadowed = [](size_t k) { return k % 2 == 1; };
  std::vector<std::vector<BFloat16>> p16(count), cpu_p16(count);
  for (size_t k = 0; k < count; ++k) {
    if (!shadowed(k)) continue;
    p16[k].assign(kChunked[k], BFloat16(1234.5f));
    cpu_p16[k] = p16[k];
  }
  auto bf16_of = [](std::vector<BFloat16>& b) {
    return b.empty() ? nullptr : reinterpret_cast<__nv_bfloat16*>(b.data());
  };
  uint64_t stream = 300;
  for (const AdamWStep& hp : Steps(/*ignored*/ 7.0f)) {
    for (size_t k = 0; k < count; ++k) cpu[k].g = Gradient(kChunked[k], ++stream);
    Packed g = role(&AdamWState::g);
    std::vector<opt::AdamWChunk> chunks;
    for (size_t k = 0; k < count; ++k) {
      opt::AppendAdamWChunks(p.data.data() + p.at[k], g.data.data() + g.at[k],
                             m.data.data() + m.at[k], v.data.data() + v.at[k], kChunked[k],
                             AdamWScalarsOf(hp, decays[k]).decay, bf16_of(p16[k]), chunks);
    }
    ASSERT_EQ(chunks.size(), 7u);
    int quads = 0;
    for (const opt::AdamWChunk& ch : chunks) quads += opt::AdamWQuads(ch);
    // Aligned: the three chunks of 65536 elements (the others' sizes are not multiples of 4);
    // packed tightly, some of them start off 16 bytes and go element by element.
    if (aligned) {
      EXPECT_EQ(quads, 3) << "chunks taking four elements a thread";
    } else {
      EXPECT_LT(quads, 3) << "chunks taking four elements a thread";
    }
    const opt::AdamWConsts c = opt::ConstsOf(hp);
    Launch(static_cast<unsigned>(chunks.size()), opt::kChunkThreads,
           [&] { opt::AdamWChunksKernel(chunks.data(), c); });

    std::vector<AdamWTensors> tensors;
    for (size_t k = 0; k < count; ++k) {
      const int64_t n = kChunked[k];
      tensors.push_back({Wrap(cpu[k].p.data(), n), Wrap(cpu[k].g.data(), n),
                         Wrap(cpu[k].m.data(), n), Wrap(cpu[k].v.data(), n), decays[k],
                         Tensor()});
      if (shadowed(k)) {
        tensors.back().shadow = Tensor::Wrap(cpu_p16[k].data(), {n}, DType::kBF16, Device::Cpu());
      }
    }
    AdamWUpdateMany(tensors, hp);
    for (size_t k = 0; k < count; ++k) {
      const std::string at = "AdamW chunked, tensor " + std::to_string(k) + " of " +
                             std::to_string(kChunked[k]) + ", step " + std::to_string(hp.step);
      ExpectSameBits(Unpack(p, k, kChunked[k]), cpu[k].p, at + " param");
      ExpectSameBits(Unpack(m, k, kChunked[k]), cpu[k].m, at + " exp_avg");
      ExpectSameBits(Unpack(v, k, kChunked[k]), cpu[k].v, at + " exp_avg_sq");
      if (!shadowed(k)) continue;
      for (int64_t i = 0; i < kChunked[k]; ++i) {
        ASSERT_EQ(p16[k][i].bits, cpu_p16[k][i].bits) << at << " shadow " << i;
        ASSERT_EQ(p16[k][i].bits, BFloat16(cpu[k].p[i]).bits) << at << " shadow " << i;
      }
    }
    ExpectGuardsUnchanged(p, kChunked, "AdamW param");
    ExpectGuardsUnchanged(m, kChunked, "AdamW exp_avg");
    ExpectGuardsUnchanged(v, kChunked, "AdamW exp_avg_sq");
  }
}

TEST(OptimizerEmulationTest, AdamWChunkedEqualsTheCpuBitForBit) {
  CheckAdamWChunked(/*aligned=*/false);
  CheckAdamWChunked(/*aligned=*/true);
}

TEST(OptimizerEmulationTest, SgdEqualsTheCpuBitForBit) {
  uint64_t stream = 400;
  for (const Sized& s : kSingle) {
    for (float momentum : {0.0f, 0.9f}) {
      for (float wd : {0.0f, 0.01f}) {
        const std::string name = NameOf("SGD", s) + " momentum " + std::to_string(momentum) +
                                 " wd " + std::to_string(wd);
        std::vector<float> p = Uniform(s.n, ++stream), cpu_p = p;
        std::vector<float> b(s.n, 0.0f), cpu_b = b;
        for (int step = 0; step < 3; ++step) {
          std::vector<float> g = Uniform(s.n, ++stream);
          Launch(OptGrid(s.n, s.max_blocks), opt::kThreads, [&] {
            if (momentum == 0.0f) {
              opt::SgdKernel<false>(p.data(), g.data(), nullptr, s.n, 0.05f, momentum, wd);
            } else {
              opt::SgdKernel<true>(p.data(), g.data(), b.data(), s.n, 0.05f, momentum, wd);
            }
          });
          Tensor tp = Wrap(cpu_p.data(), s.n), tb = Wrap(cpu_b.data(), s.n);
          SgdUpdate(tp, Wrap(g.data(), s.n), tb, 0.05f, momentum, wd);
          ExpectSameBits(p, cpu_p, name + " param");
          ExpectSameBits(b, cpu_b, name + " buffer");
        }
      }
    }
  }
}

TEST(OptimizerEmulationTest, ScaleEqualsTheCpuBitForBit) {
  uint64_t stream = 500;
  for (const Sized& s : kSingle) {
    std::vector<float> x = WithSpecials(s.n, ++stream), cpu = x;
    Launch(OptGrid(s.n, s.max_blocks), opt::kThreads,
           [&] { opt::ScaleKernel(x.data(), s.n, 0.37f); });
    Tensor t = Wrap(cpu.data(), s.n);
    ScaleInPlace(t, 0.37f);
    ExpectSameBits(x, cpu, NameOf("Scale", s));
  }
  std::vector<std::vector<float>> tensors;
  for (int64_t n : kChunked) tensors.push_back(WithSpecials(n, ++stream));
  Packed packed = Pack(tensors);
  std::vector<opt::Span> chunks;
  for (size_t k = 0; k < tensors.size(); ++k) {
    opt::AppendSpans(packed.data.data() + packed.at[k], kChunked[k], chunks);
  }
  Launch(static_cast<unsigned>(chunks.size()), opt::kChunkThreads,
         [&] { opt::ScaleChunksKernel(chunks.data(), -0.25f); });
  std::vector<Tensor> cpu;
  for (std::vector<float>& t : tensors) cpu.push_back(Wrap(t.data(), int64_t(t.size())));
  ScaleMany(cpu, -0.25f);
  for (size_t k = 0; k < tensors.size(); ++k) {
    ExpectSameBits(Unpack(packed, k, kChunked[k]), tensors[k],
                     "ScaleChunks tensor " + std::to_string(k));
  }
  ExpectGuardsUnchanged(packed, kChunked, "ScaleChunks");
}

double Gamma53(int64_t m) {
  const double u = std::ldexp(1.0, -53);
  return m * u / (1.0 - m * u);
}

// |got - want| within 2 gamma(n) of the exact sum (<= want / (1 - gamma(n))).
void ExpectSumWithinBound(double got, double want, int64_t n, const std::string& what) {
  const double bound = 2 * Gamma53(n) * want / (1 - Gamma53(n));
  EXPECT_LE(std::fabs(got - want), bound) << what << ": " << got << " vs " << want;
}

// SumSquaresKernel on the .cu's grid (max_blocks 0) or a capped one, and the host's in-order
// sum of its partials.
double EmulatedSumSquares(const std::vector<float>& x, int64_t max_blocks) {
  const int64_t n = static_cast<int64_t>(x.size());
  const unsigned blocks =
      max_blocks == 0 ? opt::SumSquaresBlocks(n) : opt::SumSquaresBlocks(n, max_blocks);
  std::vector<double> partial(blocks, std::numeric_limits<double>::quiet_NaN());
  Launch(blocks, opt::kThreads, [&] { opt::SumSquaresKernel(x.data(), n, partial.data()); });
  double sum = 0.0;
  for (double s : partial) sum += s;
  return sum;
}

TEST(OptimizerEmulationTest, SumSquaresEqualsTheCpu) {
  // One element, a block less one, just past 16 elements per thread (two blocks), 18 blocks,
  // and past a cap of 4 blocks (each thread loops 21 or 22 times; the .cu's cap of 1024
  // blocks would take 1024 CTAs).
  const std::vector<Sized> sizes = {
      {1, 0}, {255, 0}, {opt::kThreads * 16 + 1, 0}, {70000, 0}, {opt::kThreads * 16 * 5 + 999, 4}};
  uint64_t stream = 600;
  for (const Sized& s : sizes) {
    const int64_t n = s.n;
    const std::string name = "SumSquares n " + std::to_string(n) + " cap " +
                             std::to_string(s.max_blocks);
    std::vector<float> exact = Sixteenths(n, ++stream);
    EXPECT_EQ(EmulatedSumSquares(exact, s.max_blocks), SumSquares(Wrap(exact.data(), n)))
        << name << " exact";
    std::vector<float> x = Uniform(n, ++stream, -3.0f, 3.0f);
    const double got = EmulatedSumSquares(x, s.max_blocks);
    ExpectSumWithinBound(got, SumSquares(Wrap(x.data(), n)), n, name);
    EXPECT_EQ(EmulatedSumSquares(x, s.max_blocks), got) << name << " run to run";
  }
}

// SumSquaresChunksKernel over the chunks of tensors of kChunked's sizes; per tensor,
// 0.0 + its partials in order (SumSquaresMany, and SumSquaresPartials' documented use).
std::vector<double> EmulatedSumSquaresMany(std::vector<std::vector<float>>& tensors) {
  std::vector<opt::Span> chunks;
  std::vector<size_t> first{0};
  for (std::vector<float>& t : tensors) {
    opt::AppendSpans(t.data(), static_cast<int64_t>(t.size()), chunks);
    first.push_back(chunks.size());
  }
  std::vector<double> partial(chunks.size(), std::numeric_limits<double>::quiet_NaN());
  Launch(static_cast<unsigned>(chunks.size()), opt::kChunkThreads,
         [&] { opt::SumSquaresChunksKernel(chunks.data(), partial.data()); });
  std::vector<double> sums(tensors.size(), 0.0);
  for (size_t k = 0; k < tensors.size(); ++k) {
    for (size_t c = first[k]; c < first[k + 1]; ++c) sums[k] += partial[c];
  }
  return sums;
}

TEST(OptimizerEmulationTest, SumSquaresChunkedEqualsTheCpu) {
  for (bool exact : {true, false}) {
    std::vector<std::vector<float>> tensors;
    std::vector<Tensor> cpu;
    for (size_t k = 0; k < kChunked.size(); ++k) {
      tensors.push_back(exact ? Sixteenths(kChunked[k], 700 + k)
                              : Uniform(kChunked[k], 800 + k, -2.0f, 2.0f));
      cpu.push_back(Wrap(tensors.back().data(), kChunked[k]));
    }
    const std::vector<double> got = EmulatedSumSquaresMany(tensors);
    const std::vector<double> want = SumSquaresMany(cpu);
    for (size_t k = 0; k < tensors.size(); ++k) {
      const std::string name = "SumSquaresChunks tensor " + std::to_string(k);
      if (exact) {
        EXPECT_EQ(got[k], want[k]) << name << " exact";
      } else {
        ExpectSumWithinBound(got[k], want[k], kChunked[k], name);
      }
    }
  }
}

}  // namespace
}  // namespace switchyard::kernels
