// The MoE token permutation on CUDA (kernels/permute.h, and moe/dispatcher.h's plan on top
// of it) against the CPU reference on the same inputs: random routings with drops, nothing
// kept, everything kept, one expert taking every assignment, N = 0 and 1, k = 1..4 (and
// 10, past the sorted-sum path), E up to 256, widths that do and do not allow float4 rows,
// and a misaligned view.
//
// Tolerances:
//  - SortAssignments (counts, token, slot, inverse) and GatherRows: EXACT (integers, copies).
//  - ScatterAddRows, Combine, CombineBackward's dout: BIT-IDENTICAL for k <= 8 — per token
//    the CUDA kernels add the same rows in the same order (increasing permuted row) as the
//    CPU loop, with separately rounded multiplies and adds (__fmul_rn / __fadd_rn, no FMA).
//    For k > 8 they add in slot order: |d| <= 1e-5 (1 + |cpu|) (a reordered f32 sum of ~k
//    terms of size ~1 with partial sums up to ~3: each order's roundings are ~1e-7 each,
//    a few 1e-7 apart in all; 1e-6 would leave only ~3.5 sigma on results near 0).
//  - CombineBackward's dgates: double dot products summed in another order (lane-strided,
//    then a warp tree), rounded to f32 once: |d| <= 1e-30 + 1e-6 |cpu| (<= 1 ulp + rounding).
//  - EntropySum: CUDA logf vs glibc logf (<= 1 ulp each), double sums in another order:
//    relative 1e-6.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/philox.h"
#include "engine/core/status.h"
#include "kernels/permute.h"
#include "kernels/random.h"
#include "moe/dispatcher.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard::kernels {
namespace {

using gpu_test::ExpectBitEqual;
using gpu_test::ExpectNear;
using gpu_test::ValuesOf;

const Device kCuda = Device::Cuda(0);

enum class Pattern { kRandomDrops, kAllKept, kAllDropped, kOneExpert };

const char* PatternName(Pattern p) {
  switch (p) {
    case Pattern::kRandomDrops: return "random drops";
    case Pattern::kAllKept: return "all kept";
    case Pattern::kAllDropped: return "all dropped";
    case Pattern::kOneExpert: return "one expert takes all";
  }
  return "?";
}

struct Routing {
  Tensor experts;  // (N, k) i32, host
  Tensor kept;     // (N, k) u8, host
};

// A routing of n tokens: distinct random experts per token (as top-k gives), then the
// pattern's drops.
Routing MakeRouting(int64_t n, int64_t k, int64_t e, Pattern pattern, uint64_t seed) {
  Tensor bits = Tensor::Empty({std::max<int64_t>(2 * n * k, 1)}, DType::kI32);
  FillRandomBits(bits, RngKey{seed, 77}, 0);
  const std::vector<int32_t> r = bits.ToVector<int32_t>();
  std::vector<int32_t> experts(n * k);
  std::vector<uint8_t> kept(n * k);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      int32_t x = static_cast<int32_t>(static_cast<uint32_t>(r[t * k + j]) % e);
      for (bool clash = true; clash;) {  // distinct experts inside a token
        clash = false;
        for (int64_t i = 0; i < j; ++i) clash |= experts[t * k + i] == x;
        if (clash) x = static_cast<int32_t>((x + 1) % e);
      }
      experts[t * k + j] = pattern == Pattern::kOneExpert ? static_cast<int32_t>(e - 1) : x;
      const bool drop = static_cast<uint32_t>(r[n * k + t * k + j]) % 4 == 0;
      kept[t * k + j] = pattern == Pattern::kAllDropped ? 0
                        : pattern == Pattern::kRandomDrops ? !drop
                                                            : 1;
    }
  }
  return {Tensor::FromVector(experts, {n, k}), Tensor::FromVector(kept, {n, k})};
}

template <typename T>
void ExpectExact(const Tensor& got, const Tensor& want, DeviceContext* ctx,
                 const std::string& what) {
  const std::vector<T> g = ValuesOf<T>(got, ctx), w = ValuesOf<T>(want, ctx);
  ASSERT_EQ(g.size(), w.size()) << what;
  int64_t mismatches = 0, first = -1;
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i] != w[i] && mismatches++ == 0) first = static_cast<int64_t>(i);
  }
  EXPECT_EQ(mismatches, 0) << what << ": " << mismatches << " of " << g.size()
                           << " differ, the first at " << first;
}

// Everything SortAssignments gives, on one device.
struct Sorted {
  std::vector<int64_t> counts;
  Tensor token, slot, inverse;
  int64_t kept = 0;  // A
};

Sorted SortOn(const Routing& r, int64_t e, Device dev, DeviceContext* ctx) {
  const int64_t nk = r.experts.numel();
  Sorted s;
  s.token = Tensor::Empty({nk}, DType::kI64, dev);
  s.slot = Tensor::Empty({nk}, DType::kI64, dev);
  s.inverse = Tensor::Empty({nk}, DType::kI64, dev);
  s.counts = SortAssignments(r.experts.To(dev, ctx), r.kept.To(dev, ctx), e, s.token, s.slot,
                             s.inverse, ctx);
  for (int64_t c : s.counts) s.kept += c;
  return s;
}

Tensor HostNormal(const Shape& shape, uint64_t stream) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  FillNormal(t, RngKey{2024, stream}, 0, 0.0f, 1.0f);
  return t;
}

TEST(PermuteGpuTest, SortAssignmentsIsExact) {
  SY_REQUIRE_GPU();
  auto ctx = DeviceContext::Create(kCuda);
  uint64_t seed = 1;
  for (int64_t n : {0, 1, 7, 1000, 4099}) {
    for (int64_t k : {1, 2, 3, 4}) {
      for (int64_t e : {1, 2, 8, 64, 256}) {
        if (k > e) continue;
        for (Pattern p : {Pattern::kRandomDrops, Pattern::kAllKept, Pattern::kAllDropped,
                          Pattern::kOneExpert}) {
          const std::string what = StrCat("N=", n, " k=", k, " E=", e, " ", PatternName(p));
          SCOPED_TRACE(what);
          Routing r = MakeRouting(n, k, e, p, seed++);
          Sorted cpu = SortOn(r, e, Device::Cpu(), nullptr);
          Sorted gpu = SortOn(r, e, kCuda, ctx.get());
          EXPECT_EQ(gpu.counts, cpu.counts);
          ExpectExact<int64_t>(gpu.slot, cpu.slot, ctx.get(), what + " slot");
          ExpectExact<int64_t>(gpu.token, cpu.token, ctx.get(), what + " token");
          ExpectExact<int64_t>(gpu.inverse, cpu.inverse, ctx.get(), what + " inverse");
        }
      }
    }
  }
}

TEST(PermuteGpuTest, SortAssignmentsRejectsAnExpertOutOfRange) {
  SY_REQUIRE_GPU();
  // The child re-executes the binary (no CUDA in a forked process).
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto run = [] {
    auto ctx = DeviceContext::Create(kCuda);
    Routing r{Tensor::FromVector<int32_t>({0, 9, 1, 2}, {2, 2}),
              Tensor::FromVector<uint8_t>({1, 1, 1, 1}, {2, 2})};
    SortOn(r, 4, kCuda, ctx.get());
  };
  EXPECT_DEATH(run(), "1 kept assignments have an expert index outside \\[0, 4\\)");
}

TEST(PermuteGpuTest, GatherRowsIsExact) {
  SY_REQUIRE_GPU();
  auto ctx = DeviceContext::Create(kCuda);
  uint64_t stream = 100;
  for (int64_t d : {1, 3, 4, 6, 32, 33, 1000, 4096}) {
    for (int64_t n : {1, 5, 300}) {
      for (int64_t rows : {0, 1, 7, 600}) {
        const std::string what = StrCat("d=", d, " N=", n, " R=", rows);
        SCOPED_TRACE(what);
        Tensor src = HostNormal({n, d}, stream++);
        Tensor bits = Tensor::Empty({std::max<int64_t>(rows, 1)}, DType::kI32);
        FillRandomBits(bits, RngKey{3, stream++}, 0);
        std::vector<int64_t> index(rows);
        for (int64_t i = 0; i < rows; ++i)
          index[i] = static_cast<uint32_t>(bits.data<int32_t>()[i]) % n;
        Tensor idx = Tensor::FromVector(index, {rows});
        Tensor want = Tensor::Empty({rows, d}, DType::kF32);
        GatherRows(src, idx, want);
        Tensor got = Tensor::Empty({rows, d}, DType::kF32, kCuda);
        GatherRows(src.To(kCuda, ctx.get()), idx.To(kCuda, ctx.get()), got, ctx.get());
        ExpectBitEqual(got, want, ctx.get(), "GatherRows " + what);
      }
    }
  }
  // A source view 4 bytes off 16-byte alignment (d % 4 == 0): must take the float path.
  const int64_t n = 9, d = 8;
  Tensor storage = HostNormal({n * d + 1}, 999);
  Tensor src = storage.View({n, d}, 1);
  Tensor idx = Tensor::FromVector<int64_t>({8, 0, 3, 3}, {4});
  Tensor want = Tensor::Empty({4, d}, DType::kF32);
  GatherRows(src, idx, want);
  Tensor dev_src = storage.To(kCuda, ctx.get()).View({n, d}, 1);
  Tensor got = Tensor::Empty({4, d}, DType::kF32, kCuda);
  GatherRows(dev_src, idx.To(kCuda, ctx.get()), got, ctx.get());
  ExpectBitEqual(got, want, ctx.get(), "GatherRows from a misaligned view");
}

// ScatterAddRows, Combine (with and without extra) and CombineBackward on one routing.
void CompareSums(int64_t n, int64_t k, int64_t e, int64_t d, Pattern p, uint64_t seed,
                 DeviceContext* ctx) {
  const std::string what =
      StrCat("N=", n, " k=", k, " E=", e, " d=", d, " ", PatternName(p));
  SCOPED_TRACE(what);
  Routing r = MakeRouting(n, k, e, p, seed);
  Sorted cpu = SortOn(r, e, Device::Cpu(), nullptr);
  Sorted gpu = SortOn(r, e, kCuda, ctx);
  ASSERT_EQ(gpu.counts, cpu.counts);
  const int64_t a = cpu.kept;
  const Tensor inv_cpu = cpu.inverse.Reshape({n, k}), inv_gpu = gpu.inverse.Reshape({n, k});
  const bool exact = k <= 8;
  auto compare = [&](const Tensor& got, const Tensor& want, const std::string& name) {
    if (exact) {
      ExpectBitEqual(got, want, ctx, name + " " + what);
    } else {
      ExpectNear(got, want, 1e-5, 1e-5, ctx, name + " " + what);
    }
  };

  // Backward of the permute.
  Tensor drows = HostNormal({a, d}, seed * 10 + 1);
  Tensor dh_cpu = HostNormal({n, d}, seed * 10 + 2);
  Tensor dh_gpu = dh_cpu.To(kCuda, ctx);
  Tensor drows_gpu = drows.To(kCuda, ctx);
  ScatterAddRows(drows, inv_cpu, dh_cpu, Write::kAdd);
  ScatterAddRows(drows_gpu, inv_gpu, dh_gpu, Write::kAdd, ctx);
  compare(dh_gpu, dh_cpu, "ScatterAddRows");
  // Written, not added: what dh held (the sums above) is not read.
  ScatterAddRows(drows, inv_cpu, dh_cpu, Write::kSet);
  ScatterAddRows(drows_gpu, inv_gpu, dh_gpu, Write::kSet, ctx);
  compare(dh_gpu, dh_cpu, "ScatterAddRows(set)");

  // Combine.
  Tensor out = HostNormal({a, d}, seed * 10 + 3);
  Tensor gates = Tensor::Empty({n, k}, DType::kF32);
  FillUniform(gates, RngKey{2024, seed * 10 + 4}, 0, 0.0f, 1.0f);
  Tensor extra = HostNormal({n, d}, seed * 10 + 5);
  const Tensor out_gpu = out.To(kCuda, ctx), gates_gpu = gates.To(kCuda, ctx);
  for (bool with_extra : {false, true}) {
    Tensor y_cpu = Tensor::Empty({n, d}, DType::kF32);
    Tensor y_gpu = Tensor::Empty({n, d}, DType::kF32, kCuda);
    Combine(out, gates, inv_cpu, with_extra ? extra : Tensor(), y_cpu);
    Combine(out_gpu, gates_gpu, inv_gpu, with_extra ? extra.To(kCuda, ctx) : Tensor(), y_gpu,
            ctx);
    compare(y_gpu, y_cpu, with_extra ? "Combine + extra" : "Combine");
  }

  // Backward of the combine.
  Tensor dy = HostNormal({n, d}, seed * 10 + 6);
  Tensor dout_cpu = Tensor::Empty({a, d}, DType::kF32), dg_cpu = Tensor::Empty({n, k}, DType::kF32);
  Tensor dout_gpu = Tensor::Empty({a, d}, DType::kF32, kCuda);
  Tensor dg_gpu = Tensor::Empty({n, k}, DType::kF32, kCuda);
  CombineBackward(dy, out, gates, cpu.slot.Slice(0, a), dout_cpu, dg_cpu);
  CombineBackward(dy.To(kCuda, ctx), out_gpu, gates_gpu, gpu.slot.Slice(0, a), dout_gpu, dg_gpu,
                  ctx);
  ExpectBitEqual(dout_gpu, dout_cpu, ctx, "CombineBackward dout " + what);
  ExpectNear(dg_gpu, dg_cpu, 1e-30, 1e-6, ctx, "CombineBackward dgates " + what);
}

TEST(PermuteGpuTest, ScatterAddCombineAndBackwardMatchTheCpu) {
  SY_REQUIRE_GPU();
  auto ctx = DeviceContext::Create(kCuda);
  uint64_t seed = 500;
  for (int64_t n : {1, 7, 1000}) {
    for (int64_t k : {1, 2, 3, 4}) {
      for (int64_t e : {4, 64, 256}) {
        for (int64_t d : {1, 6, 32, 1000, 4096}) {
          if (n == 1000 && d >= 1000 && e != 64) continue;  // keep the test quick
          for (Pattern p : {Pattern::kRandomDrops, Pattern::kAllDropped, Pattern::kOneExpert}) {
            CompareSums(n, k, e, d, p, seed++, ctx.get());
          }
        }
      }
    }
  }
  // Wider than the sorted path (k > 8): slot order, within a tolerance.
  CompareSums(100, 10, 16, 33, Pattern::kRandomDrops, seed++, ctx.get());
  CompareSums(100, 10, 16, 64, Pattern::kRandomDrops, seed++, ctx.get());
}

TEST(PermuteGpuTest, EntropySumMatchesTheCpu) {
  SY_REQUIRE_GPU();
  auto ctx = DeviceContext::Create(kCuda);
  for (int64_t n : {0, 1, 255, 4096, 1 << 20}) {
    Tensor p = Tensor::Empty({n}, DType::kF32);
    FillUniform(p, RngKey{9, static_cast<uint64_t>(n)}, 0, 0.0f, 1.0f);
    if (n > 3) p.data<float>()[3] = 0.0f;  // p = 0 contributes nothing
    const double cpu = EntropySum(p);
    const double gpu = EntropySum(p.To(kCuda, ctx.get()), ctx.get());
    EXPECT_NEAR(gpu, cpu, 1e-6 * std::fabs(cpu)) << "n=" << n;
  }
}

}  // namespace
}  // namespace switchyard::kernels

namespace switchyard::moe {
namespace {

// The plan on CUDA against the host plan: counts, token/slot/inverse exact, and dispatch
// then combine (ep = 1, identity experts, unit gates) gives back kept_t * h_t exactly.
TEST(DispatchPlanGpuTest, MatchesTheHostPlan) {
  SY_REQUIRE_GPU();
  const Device cuda = Device::Cuda(0);
  auto ctx = DeviceContext::Create(cuda);
  auto ep = dist::MakeLocalCommunicator();  // a host communicator: ep = 1 never uses it
  const int64_t n = 333, k = 2, e = 16, d = 40;
  std::vector<int32_t> experts(n * k);
  std::vector<uint8_t> kept(n * k);
  for (int64_t i = 0; i < n * k; ++i) {
    experts[i] = static_cast<int32_t>((i * 7 + (i % k) * 3) % e);
    kept[i] = (i * 13) % 5 != 0;
  }
  DispatchPlan host(experts, kept, n, k, e, 1);
  DispatchPlan dev = DispatchPlan::Build(Tensor::FromVector(experts, {n, k}).To(cuda, ctx.get()),
                                         Tensor::FromVector(kept, {n, k}).To(cuda, ctx.get()), e,
                                         1, ctx.get());
  EXPECT_EQ(dev.device(), cuda);
  EXPECT_EQ(dev.send_per_expert(), host.send_per_expert());
  EXPECT_EQ(dev.num_assignments(), host.num_assignments());
  EXPECT_EQ(gpu_test::ValuesOf<int64_t>(dev.token_tensor(), ctx.get()), host.token());
  EXPECT_EQ(gpu_test::ValuesOf<int64_t>(dev.slot_tensor(), ctx.get()), host.slot());
  EXPECT_EQ(gpu_test::ValuesOf<int64_t>(dev.inverse(), ctx.get()),
            host.inverse().ToVector<int64_t>());
  dev.ExchangeCounts(*ep, ctx.get());
  EXPECT_EQ(dev.rows_per_local_expert(), host.send_per_expert());

  Tensor h = Tensor::Empty({n, d}, DType::kF32);
  for (int64_t i = 0; i < n * d; ++i) h.data<float>()[i] = static_cast<float>(i % 97) - 48.0f;
  Tensor hd = h.To(cuda, ctx.get());
  Tensor grouped = Regroup(ExchangeRows(Permute(hd, dev, ctx.get()), dev, *ep, ctx.get()), dev,
                           ctx.get());
  Tensor back = ReturnRows(Ungroup(grouped, dev, ctx.get()), dev, *ep, ctx.get());
  Tensor unit = Tensor::FromVector(std::vector<float>(n * k, 1.0f), {n, k}).To(cuda, ctx.get());
  std::vector<float> y = gpu_test::ValuesOf<float>(Combine(back, unit, 1.0f, dev, Tensor(), ctx.get()),
                                                   ctx.get());
  int64_t wrong = 0;
  for (int64_t t = 0; t < n; ++t) {
    const float kept_t = static_cast<float>(kept[t * k] + kept[t * k + 1]);
    for (int64_t c = 0; c < d; ++c) wrong += y[t * d + c] != kept_t * h.data<float>()[t * d + c];
  }
  EXPECT_EQ(wrong, 0);
  // A host plan's token()/slot() only: a CUDA plan says where to look.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(dev.token(), "read token_tensor\\(\\)");
}

}  // namespace
}  // namespace switchyard::moe
