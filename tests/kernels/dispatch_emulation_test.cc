// The dispatch family's permutation and entropy kernels run on the CPU, without a GPU,
// through the host model of CUDA in tests/kernels/cuda_emulation.h, with the launch shapes of
// permute.cu (taken from the .cuh helpers it launches with), against the CPU twins (the
// admission's kernels: admission_emulation_test):
//  - permute (kernels/cuda/permute_kernels.cuh): GatherRows (f32 rows as float or float4,
//    i32 rows as words, u8 rows as bytes, a misaligned view), ScatterAddRows, Combine (with
//    and without extra, nothing kept) and CombineBackward (rows = A, and a device-sized plan
//    whose rows past A are dropped, with NaN outputs there) on routings with dropped slots,
//    widths not a multiple of 4 or 32 and wider than a block's 256 lanes, k <= 8 (the sorted
//    sums) and k = 10, capped grids; outputs pre-filled with NaN, and what must not be
//    written checked unchanged. Bit-equal to the CPU where permute.h says so (k <= 8, dout);
//    otherwise bounds by construction: a sum of m f32 (or f64) terms in two orders differs by
//    at most 2 gamma(m) sum|terms| (gamma(m) = m u / (1 - m u)), and dgates, an f64 dot
//    rounded to f32 once, adds u_f32 (|gpu| + |cpu|) to that;
//  - the entropy: EntropyKernel's partials (with its shape, and a grid capped at 3 blocks for
//    the grid-stride loop past its 1024-block cap, too slow to emulate) summed in block order
//    against the CPU's sequential sum (the same f64 terms: the bound above), and
//    SumInOrderKernel bit-equal to EntropySum's host loop.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/tensor.h"
#include "kernels/moe_routing.h"
#include "kernels/permute.h"
#include "tests/kernels/dispatch_emulation.h"

#include "kernels/cuda/permute_kernels.cuh"

namespace switchyard::kernels {
namespace {

namespace pm = cuda::dispatch::permute;
using dispatch_emu::Gamma;
using dispatch_emu::kNan;
using dispatch_emu::kNoCap;
using dispatch_emu::kU32;
using dispatch_emu::kU64;
using dispatch_emu::kUnwritten;
using dispatch_emu::no_smem;
using dispatch_emu::Rng;
using emu::ExpectSameBits;

// ---- Permutation --------------------------------------------------------------------------

// A routing of N tokens, k slots, E experts, and SortAssignments' permutation of it.
struct Plan {
  int64_t N = 0, k = 0, A = 0;
  std::vector<int64_t> token, slot, inverse;  // (N k), (N k), (N, k)
  std::vector<uint8_t> kept;                  // (N, k)
};

// keep_one_in: 0 keeps nothing, 1 everything, m > 1 drops about one slot in m.
Plan MakePlan(int64_t N, int64_t k, int64_t E, int keep_one_in, Rng& rng) {
  Plan p{N, k, 0, {}, {}, {}, std::vector<uint8_t>(N * k)};
  std::vector<int32_t> experts(N * k);
  for (int64_t i = 0; i < N * k; ++i) {
    experts[i] = static_cast<int32_t>(rng.Int(E));
    p.kept[i] = keep_one_in == 1 || (keep_one_in > 1 && rng.Int(keep_one_in) != 0);
  }
  Tensor token = Tensor::Empty({N * k}, DType::kI64), slot = Tensor::Empty({N * k}, DType::kI64);
  Tensor inverse = Tensor::Empty({N * k}, DType::kI64);
  const std::vector<int64_t> counts =
      SortAssignments(Tensor::FromVector(experts, {N, k}), Tensor::FromVector(p.kept, {N, k}),
                      E, token, slot, inverse);
  p.A = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  p.token = token.ToVector<int64_t>();
  p.slot = slot.ToVector<int64_t>();
  p.inverse = inverse.ToVector<int64_t>();
  return p;
}

// A row kernel over `rows` with permute.cu's layout for `width` vectors, its grid capped.
template <typename Body>
void LaunchRowKernel(int64_t rows, int64_t width, unsigned grid_cap, Body body) {
  const pm::RowLayout l = pm::LayoutFor(rows, width);
  emu::Launch(EmuDim3{std::min(l.blocks, grid_cap), 1, 1}, pm::kThreads, no_smem, 0, 0,
              [&] { body(l.log2); });
}

// permute.cu's GatherRows; returns whether the rows moved as float4.
bool RunGather(const void* src, const int64_t* index, void* dst, int64_t rows, int64_t d,
               bool bytes, unsigned grid_cap) {
  if (rows == 0 || d == 0) return false;
  if (bytes) {
    LaunchRowKernel(rows, d, grid_cap, [&](int log2) {
      pm::GatherRowsKernel<uint8_t>(static_cast<const uint8_t*>(src), index,
                                    static_cast<uint8_t*>(dst), rows, d, log2);
    });
    return false;
  }
  bool vec4 = false;
  pm::LaunchRows(d, {src, dst}, [&](auto tag, int64_t width) {
    using V = decltype(tag);
    vec4 = std::is_same_v<V, float4>;
    LaunchRowKernel(rows, width, grid_cap, [&](int log2) {
      pm::GatherRowsKernel<V>(static_cast<const V*>(src), index, static_cast<V*>(dst), rows,
                              width, log2);
    });
  });
  return vec4;
}

// permute.cu's ScatterAddRows over the plan's A rows.
bool RunScatterAdd(const Plan& p, const float* drows, float* dh, int64_t d, unsigned grid_cap,
                   bool set = false) {
  if (p.N == 0 || d == 0) return false;
  if (p.A == 0) {  // the host side's memset
    if (set) std::fill(dh, dh + p.N * d, 0.0f);
    return false;
  }
  const int k = static_cast<int>(p.k);
  bool vec4 = false;
  pm::LaunchRows(d, {drows, dh}, [&](auto tag, int64_t width) {
    using V = decltype(tag);
    vec4 = std::is_same_v<V, float4>;
    auto* in = reinterpret_cast<const V*>(drows);
    auto* out = reinterpret_cast<V*>(dh);
    LaunchRowKernel(p.N, width, grid_cap, [&](int log2) {
      const auto run = [&](auto kernel) { kernel(in, p.inverse.data(), out, p.N, k, width, log2); };
      const bool sorted = k <= pm::kMaxSortedK;
      if (sorted && set) run(pm::ScatterAddKernel<V, true, true>);
      if (sorted && !set) run(pm::ScatterAddKernel<V, true, false>);
      if (!sorted && set) run(pm::ScatterAddKernel<V, false, true>);
      if (!sorted && !set) run(pm::ScatterAddKernel<V, false, false>);
    });
  });
  return vec4;
}

// permute.cu's Combine; out may be null (nothing kept), extra null (none), kept null (no
// bf16 copy of the rows).
void RunCombine(const Plan& p, const float* out, const float* gates, const float* extra,
                float* y, int64_t d, unsigned grid_cap, BFloat16* kept = nullptr) {
  if (p.N == 0 || d == 0) return;
  const int k = static_cast<int>(p.k);
  pm::LaunchRows(d, {out, extra, y}, [&](auto tag, int64_t width) {
    using V = decltype(tag);
    auto* o = reinterpret_cast<const V*>(out);
    auto* x = reinterpret_cast<const V*>(extra);
    auto* dst = reinterpret_cast<V*>(y);
    LaunchRowKernel(p.N, width, grid_cap, [&](int log2) {
      if (k <= pm::kMaxSortedK) {
        pm::CombineKernel<V, true>(o, gates, p.inverse.data(), x, dst, p.N, k, width, log2,
                                   kept);
      } else {
        pm::CombineKernel<V, false>(o, gates, p.inverse.data(), x, dst, p.N, k, width, log2,
                                    kept);
      }
    });
  });
}

// permute.cu's CombineBackward over `rows` permuted rows (dgates' memset left out: the
// caller fills it, to see which slots the kernel writes). out: f32 rows, or (O = BFloat16)
// the combine's kept bf16 rows; dout: f32, or (D = BFloat16) the experts' bf16 operand; bf16
// rows take no part in the float4 choice (as permute.cu).
template <typename O, typename D = float>
void RunCombineBackward(const Plan& p, int64_t rows, const float* dy, const O* out,
                        const float* gates, const int64_t* inverse, D* dout, float* dgates,
                        int64_t d, unsigned grid_cap) {
  if (rows == 0) return;
  constexpr bool kOut16 = std::is_same_v<O, BFloat16>, kDout16 = std::is_same_v<D, BFloat16>;
  pm::LaunchRows(d, {dy, kOut16 ? nullptr : static_cast<const void*>(out),
                     kDout16 ? nullptr : static_cast<const void*>(dout)},
                 [&](auto tag, int64_t width) {
    using V = decltype(tag);
    using TO = std::conditional_t<kOut16, BFloat16, V>;
    using TD = std::conditional_t<kDout16, BFloat16, V>;
    const unsigned blocks = std::min(pm::CombineBackwardBlocks(rows), grid_cap);
    emu::Launch(EmuDim3{blocks, 1, 1}, pm::kThreads, no_smem, 0, 0, [&] {
      pm::CombineBackwardKernel<V, TO, TD>(reinterpret_cast<const V*>(dy),
                                           reinterpret_cast<const TO*>(out), gates,
                                           p.slot.data(), inverse, reinterpret_cast<TD*>(dout),
                                           dgates, rows, p.k, width);
    });
  });
}

struct PlanCase {
  int64_t N, k, E;
  int keep_one_in;
};
const std::vector<PlanCase> kPlans = {
    {37, 2, 5, 4},   // top-2 with drops
    {300, 1, 8, 3},  // top-1 with drops, tokens past one block of narrow rows
    {1, 2, 3, 1},    // one token, everything kept
    {20, 2, 4, 0},   // nothing kept
    {24, 10, 6, 4},  // k = 10: the slot-order sums
    {16, 8, 3, 5},   // k = 8: the widest sorted sums
};
// Row widths: float rows (not multiples of 4 or 32, past the block's 256 lanes) and float4
// rows (width d / 4: 1, 2, 16, 129).
const std::vector<int64_t> kWidths = {1, 3, 4, 8, 33, 64, 130, 300, 516};

std::string Name(const PlanCase& c, int64_t d) {
  return "N " + std::to_string(c.N) + " k " + std::to_string(c.k) + " E " +
         std::to_string(c.E) + " keep 1/" + std::to_string(c.keep_one_in) + " d " +
         std::to_string(d);
}

TEST(DispatchEmulationTest, GatherRowsCopiesRowsExactly) {
  Rng rng(21);
  int vec4_runs = 0;
  for (const PlanCase& c : kPlans) {
    const Plan p = MakePlan(c.N, c.k, c.E, c.keep_one_in, rng);
    for (int64_t d : kWidths) {
      const std::string what = Name(c, d);
      const unsigned cap = d % 2 == 0 ? 2u : kNoCap;  // some launches grid-stride
      // The permute (h -> rows, index = token) of f32 rows.
      const std::vector<float> h = rng.Floats(c.N * d);
      std::vector<float> rows(p.A * d, kNan);
      vec4_runs += RunGather(h.data(), p.token.data(), rows.data(), p.A, d, false, cap);
      Tensor want = Tensor::Empty({p.A, d}, DType::kF32);
      GatherRows(Tensor::FromVector(h, {c.N, d}),
                 Tensor::FromVector(std::vector<int64_t>(p.token.begin(), p.token.begin() + p.A),
                                    {p.A}),
                 want);
      ExpectSameBits(rows, want.ToVector<float>(), what + ": f32 gather");
      // The same rows rounded into bf16 (the experts' operand under bf16 storage): the f32
      // gather's values rounded, and the CPU op's bits; then bf16 rows copied as 2-byte words.
      if (p.A > 0) {
        std::vector<BFloat16> rows16(p.A * d, BFloat16(kNan));
        LaunchRowKernel(p.A, d, cap, [&](int log2) {
          pm::GatherRowsToBf16Kernel(h.data(), p.token.data(), rows16.data(), p.A, d, log2);
        });
        Tensor want16 = Tensor::Empty({p.A, d}, DType::kBF16);
        GatherRows(Tensor::FromVector(h, {c.N, d}),
                   Tensor::FromVector(std::vector<int64_t>(p.token.begin(), p.token.begin() + p.A),
                                      {p.A}),
                   want16);
        const std::vector<BFloat16> w16 = want16.ToVector<BFloat16>();
        for (int64_t i = 0; i < p.A * d; ++i) {
          ASSERT_EQ(rows16[i].bits, BFloat16(rows[i]).bits) << what << ": bf16 gather " << i;
          ASSERT_EQ(rows16[i].bits, w16[i].bits) << what << ": the CPU's bf16 gather " << i;
        }
        std::vector<int64_t> reversed(p.A);  // the rows in reverse order
        for (int64_t r = 0; r < p.A; ++r) reversed[r] = p.A - 1 - r;
        std::vector<uint16_t> again(p.A * d, 0xEEEE);
        LaunchRowKernel(p.A, d, cap, [&](int log2) {
          pm::GatherRowsKernel<uint16_t>(reinterpret_cast<const uint16_t*>(rows16.data()),
                                         reversed.data(), again.data(), p.A, d, log2);
        });
        for (int64_t r = 0; r < p.A; ++r) {
          for (int64_t j = 0; j < d; ++j) {
            ASSERT_EQ(again[r * d + j], rows16[reversed[r] * d + j].bits)
                << what << ": bf16 copy row " << r;
          }
        }
      }
      // Any index (repeats, more rows than the source) of i32 and u8 rows.
      const int64_t R = 2 * c.N + 1;
      std::vector<int64_t> index(R);
      for (int64_t& i : index) i = rng.Int(c.N);
      std::vector<int32_t> words(c.N * d), got_words(R * d, -1);
      for (int32_t& w : words) w = static_cast<int32_t>(rng.g());  // NaN patterns included
      RunGather(words.data(), index.data(), got_words.data(), R, d, false, cap);
      std::vector<uint8_t> bytes(c.N * d), got_bytes(R * d, 0xEE);
      for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng.g());
      RunGather(bytes.data(), index.data(), got_bytes.data(), R, d, true, cap);
      for (int64_t r = 0; r < R; ++r) {
        for (int64_t j = 0; j < d; ++j) {
          ASSERT_EQ(got_words[r * d + j], words[index[r] * d + j]) << what << " i32 row " << r;
          ASSERT_EQ(got_bytes[r * d + j], bytes[index[r] * d + j]) << what << " u8 row " << r;
        }
      }
      // A misaligned view (one float in): float rows even when d % 4 == 0.
      std::vector<float> shifted(c.N * d + 1, 0.0f), got_shifted(p.A * d + 1, kNan);
      std::copy(h.begin(), h.end(), shifted.begin() + 1);
      EXPECT_FALSE(RunGather(shifted.data() + 1, p.token.data(), got_shifted.data() + 1, p.A, d,
                             false, cap));
      EXPECT_TRUE(std::isnan(got_shifted[0])) << what << ": written before the view";
      got_shifted.erase(got_shifted.begin());
      ExpectSameBits(got_shifted, rows, what + ": misaligned gather");
    }
  }
  EXPECT_GT(vec4_runs, 10) << "the float4 path was not exercised";
}

TEST(DispatchEmulationTest, ScatterAddAndCombineMatchTheCpu) {
  Rng rng(22);
  for (const PlanCase& c : kPlans) {
    const Plan p = MakePlan(c.N, c.k, c.E, c.keep_one_in, rng);
    const bool sorted = c.k <= pm::kMaxSortedK;
    const std::vector<float> gates = rng.Floats(c.N * c.k, 0.0f, 1.0f);
    for (int64_t d : kWidths) {
      const std::string what = Name(c, d);
      const unsigned cap = d % 3 == 0 ? 3u : kNoCap;
      const std::vector<float> drows = rng.Floats(p.A * d), dh0 = rng.Floats(c.N * d);
      const Tensor inverse = Tensor::FromVector(p.inverse, {c.N, c.k});

      // ScatterAddRows: dh += each token's kept rows, or (kSet) dh = them, dh not read.
      for (Write write : {Write::kAdd, Write::kSet}) {
        const bool set = write == Write::kSet;
        const std::vector<float> before = set ? std::vector<float>(c.N * d, kNan) : dh0;
        std::vector<float> dh = before;
        RunScatterAdd(p, drows.empty() ? nullptr : drows.data(), dh.data(), d, cap, set);
        Tensor want = Tensor::FromVector(before, {c.N, d});
        ScatterAddRows(Tensor::FromVector(drows, {p.A, d}), inverse, want, write);
        const std::vector<float> w = want.ToVector<float>();
        const std::string sw = what + (set ? " scatter(set) " : " scatter ");
        for (int64_t t = 0; t < c.N; ++t) {
          for (int64_t j = 0; j < d; ++j) {
            const int64_t i = t * d + j;
            double mag = set ? 0.0 : std::fabs(dh0[i]);
            int64_t terms = 1;
            for (int64_t s = t * c.k; s < (t + 1) * c.k; ++s) {
              if (p.inverse[s] >= 0) mag += std::fabs(drows[p.inverse[s] * d + j]), ++terms;
            }
            if (sorted || terms == 1) {  // nothing kept: the row untouched, or +0
              ASSERT_EQ(0, std::memcmp(&dh[i], &w[i], 4)) << sw << t << "," << j << ": "
                                                          << dh[i] << " vs " << w[i];
            } else {
              ASSERT_LE(std::fabs(double(dh[i]) - w[i]), 2 * Gamma(terms, kU32) * mag)
                  << sw << t << "," << j;
            }
          }
        }
      }

      // Combine, with and without extra: y written whole.
      for (bool with_extra : {false, true}) {
        const std::vector<float> out = rng.Floats(p.A * d);
        const std::vector<float> extra = with_extra ? rng.Floats(c.N * d) : std::vector<float>();
        std::vector<float> y(c.N * d, kNan);
        RunCombine(p, p.A > 0 ? out.data() : nullptr, gates.data(),
                   with_extra ? extra.data() : nullptr, y.data(), d, cap);
        Tensor want_y = Tensor::Empty({c.N, d}, DType::kF32);
        Combine(Tensor::FromVector(out, {p.A, d}), Tensor::FromVector(gates, {c.N, c.k}), inverse,
                with_extra ? Tensor::FromVector(extra, {c.N, d}) : Tensor(), want_y);
        const std::vector<float> wy = want_y.ToVector<float>();
        const std::string cw = what + (with_extra ? " combine+extra " : " combine ");
        if (sorted) {
          ExpectSameBits(y, wy, cw);
          continue;
        }
        for (int64_t t = 0; t < c.N; ++t) {
          for (int64_t j = 0; j < d; ++j) {
            const int64_t i = t * d + j;
            double mag = with_extra ? std::fabs(extra[i]) : 0.0;
            int64_t terms = 1;
            for (int64_t s = t * c.k; s < (t + 1) * c.k; ++s) {
              if (p.inverse[s] < 0) continue;
              mag += std::fabs(gates[s] * out[p.inverse[s] * d + j]);
              ++terms;
            }
            ASSERT_LE(std::fabs(double(y[i]) - wy[i]), 2 * Gamma(terms, kU32) * mag)
                << cw << t << "," << j << ": " << y[i] << " vs " << wy[i];
          }
        }
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(DispatchEmulationTest, CombineBackwardMatchesTheCpu) {
  Rng rng(23);
  for (const PlanCase& c : kPlans) {
    const Plan p = MakePlan(c.N, c.k, c.E, c.keep_one_in, rng);
    const int64_t nk = c.N * c.k;
    const std::vector<float> gates = rng.Floats(nk, 0.0f, 1.0f);
    // One warp per row, whatever the width: fewer widths (float rows narrower than a warp
    // and wider than 4 warps, float4 rows of 2 and of 129 vectors).
    for (int64_t d : {3, 8, 130, 516}) {
      const std::vector<float> dy = rng.Floats(c.N * d);
      // rows = A (the host knows A), then every slot's row with the inverse (a device-sized
      // plan: rows past A are dropped ones, their out never written: NaN).
      for (bool device_sized : {false, true}) {
        if (device_sized && (d == 3 || d == 516)) continue;  // run time: two widths suffice
        const std::string what = Name(c, d) + (device_sized ? " device-sized" : " rows A");
        const unsigned cap = d % 2 == 1 ? 2u : kNoCap;
        const int64_t rows = device_sized ? nk : p.A;
        std::vector<float> out = rng.Floats(rows * d);
        std::fill(out.begin() + p.A * d, out.end(), kNan);
        std::vector<float> dout(rows * d, kNan), dgates(nk, kUnwritten);
        const std::vector<int64_t> slot(p.slot.begin(), p.slot.begin() + rows);
        RunCombineBackward(p, rows, dy.data(), out.data(), gates.data(),
                           device_sized ? p.inverse.data() : nullptr, dout.data(),
                           dgates.data(), d, cap);
        // The CPU op, its dout in `dtype`; returns dout, the gates' gradient filled in.
        Tensor want_dg = Tensor::Empty({c.N, c.k}, DType::kF32);
        auto on_cpu = [&](DType dtype) {
          Tensor dout_cpu = Tensor::Empty({rows, d}, dtype);
          CombineBackward(Tensor::FromVector(dy, {c.N, d}), Tensor::FromVector(out, {rows, d}),
                          Tensor::FromVector(gates, {c.N, c.k}), Tensor::FromVector(slot, {rows}),
                          dout_cpu, want_dg, nullptr,
                          device_sized ? Tensor::FromVector(p.inverse, {c.N, c.k}) : Tensor());
          return dout_cpu;
        };
        ExpectSameBits(dout, on_cpu(DType::kF32).ToVector<float>(), what + ": dout");
        // dout written as the experts' bf16 operand: the f32 dout rounded (dropped rows 0),
        // on the CPU op as in the kernel; the same dgates.
        {
          std::vector<BFloat16> dout16(rows * d, BFloat16(kNan)), rounded;
          std::vector<float> dgates16(nk, kUnwritten);
          RunCombineBackward(p, rows, dy.data(), out.data(), gates.data(),
                             device_sized ? p.inverse.data() : nullptr, dout16.data(),
                             dgates16.data(), d, cap);
          for (float v : dout) rounded.push_back(BFloat16(v));
          ExpectSameBits(dout16, rounded, what + ": bf16 dout");
          ExpectSameBits(dgates16, dgates, what + ": dgates with a bf16 dout");
          ExpectSameBits(on_cpu(DType::kBF16).ToVector<BFloat16>(), rounded,
                         what + ": CPU bf16 dout");
        }
        const std::vector<float> wg = want_dg.ToVector<float>();
        for (int64_t s = 0; s < nk; ++s) {
          const int64_t a = p.inverse[s];
          if (a < 0) {  // dropped: the kernel must not write it (the host zeroes it first)
            ASSERT_EQ(dgates[s], kUnwritten) << what << ": dropped slot " << s << " written";
            ASSERT_EQ(wg[s], 0.0f);
            continue;
          }
          double mag = 0.0;
          for (int64_t j = 0; j < d; ++j) {
            mag += std::fabs(double(dy[(s / c.k) * d + j]) * out[a * d + j]);
          }
          const double bound = 2 * Gamma(d, kU64) * mag +
                               kU32 / (1 - kU32) * (std::fabs(dgates[s]) + std::fabs(wg[s]));
          ASSERT_LE(std::fabs(double(dgates[s]) - wg[s]), bound)
              << what << " dgates " << s << ": " << dgates[s] << " vs " << wg[s];
        }
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// bf16 activation storage: the combine keeps each kept row rounded in its pass (y
// unchanged, rows no slot points to untouched), on the CPU as in the kernel; the backward
// reads those bf16 rows as the f32 op reads their widened values (dout bit for bit, dgates
// the CPU's own bits, the kernel's within CombineBackwardMatchesTheCpu's bound).
TEST(DispatchEmulationTest, CombineKeepsItsRowsInBf16) {
  Rng rng(25);
  BFloat16 sentinel;
  sentinel.bits = 0x7fc1;  // a NaN no rounding produces here
  for (const PlanCase& c : kPlans) {
    const Plan p = MakePlan(c.N, c.k, c.E, c.keep_one_in, rng);
    const int64_t nk = c.N * c.k;
    const std::vector<float> gates = rng.Floats(nk, 0.0f, 1.0f);
    for (int64_t d : {3, 8, 130}) {
      const std::string what = Name(c, d);
      const unsigned cap = d % 2 == 1 ? 2u : kNoCap;
      const int64_t rows = p.A + 1;  // one row no slot points to
      const std::vector<float> out = rng.Floats(rows * d), dy = rng.Floats(c.N * d);
      std::vector<float> y_plain(c.N * d, kNan), y_kept(c.N * d, kNan);
      std::vector<BFloat16> kept(rows * d, sentinel);
      RunCombine(p, out.data(), gates.data(), nullptr, y_plain.data(), d, cap);
      RunCombine(p, out.data(), gates.data(), nullptr, y_kept.data(), d, cap, kept.data());
      ExpectSameBits(y_kept, y_plain, what + ": y with kept rows");
      for (int64_t i = 0; i < rows * d; ++i) {
        const uint16_t want = i < p.A * d ? BFloat16(out[i]).bits : sentinel.bits;
        ASSERT_EQ(kept[i].bits, want) << what << ": kept element " << i;
      }
      // The CPU op.
      Tensor y_cpu = Tensor::Empty({c.N, d}, DType::kF32);
      Tensor kept_cpu = Tensor::Zeros({rows, d}, DType::kBF16);
      Combine(Tensor::FromVector(out, {rows, d}), Tensor::FromVector(gates, {c.N, c.k}),
              Tensor::FromVector(p.inverse, {c.N, c.k}), Tensor(), y_cpu, nullptr, &kept_cpu);
      const std::vector<BFloat16> kc = kept_cpu.ToVector<BFloat16>();
      for (int64_t i = 0; i < p.A * d; ++i) {
        ASSERT_EQ(kc[i].bits, kept[i].bits) << what << ": the CPU's kept element " << i;
      }
      // Backward on the kept rows (the first A: the host-sized plan's rows).
      std::vector<float> wide(p.A * d);
      for (int64_t i = 0; i < p.A * d; ++i) wide[i] = float(kept[i]);
      const std::vector<int64_t> slot(p.slot.begin(), p.slot.begin() + p.A);
      std::vector<float> dout(p.A * d, kNan), dgates(nk, kUnwritten);
      RunCombineBackward(p, p.A, dy.data(), kept.data(), gates.data(), nullptr, dout.data(),
                         dgates.data(), d, cap);
      Tensor d16 = Tensor::Empty({p.A, d}, DType::kF32), g16 = Tensor::Empty({c.N, c.k}, DType::kF32);
      Tensor dw = Tensor::Empty({p.A, d}, DType::kF32), gw = Tensor::Empty({c.N, c.k}, DType::kF32);
      const Tensor dyt = Tensor::FromVector(dy, {c.N, d}), gt = Tensor::FromVector(gates, {c.N, c.k});
      const Tensor st = Tensor::FromVector(slot, {p.A});
      CombineBackward(dyt, Tensor::FromVector(std::vector<BFloat16>(kept.begin(), kept.begin() + p.A * d),
                                              {p.A, d}),
                      gt, st, d16, g16);
      CombineBackward(dyt, Tensor::FromVector(wide, {p.A, d}), gt, st, dw, gw);
      ExpectSameBits(d16.ToVector<float>(), dw.ToVector<float>(), what + ": CPU dout, bf16 rows");
      ExpectSameBits(g16.ToVector<float>(), gw.ToVector<float>(), what + ": CPU dgates, bf16 rows");
      ExpectSameBits(dout, dw.ToVector<float>(), what + ": dout, bf16 rows");
      const std::vector<float> wg = gw.ToVector<float>();
      for (int64_t s = 0; s < nk; ++s) {
        const int64_t a = p.inverse[s];
        if (a < 0) continue;
        double mag = 0.0;
        for (int64_t j = 0; j < d; ++j) mag += std::fabs(double(dy[(s / c.k) * d + j]) * wide[a * d + j]);
        const double bound = 2 * Gamma(d, kU64) * mag +
                             kU32 / (1 - kU32) * (std::fabs(dgates[s]) + std::fabs(wg[s]));
        ASSERT_LE(std::fabs(double(dgates[s]) - wg[s]), bound) << what << " dgates " << s;
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(DispatchEmulationTest, EntropyPartialsSumToTheCpuEntropy) {
  Rng rng(24);
  // Past the 1024-block cap the grid strides; emulating 1024 blocks takes too long here, so
  // a grid capped at 3 blocks strides instead (n = 5000: 20 blocks uncapped).
  EXPECT_EQ(pm::EntropyBlocks(int64_t{pm::kMaxEntropyBlocks} * pm::kThreads + 1),
            pm::kMaxEntropyBlocks);
  EXPECT_EQ(pm::EntropyBlocks(int64_t{pm::kMaxEntropyBlocks} * pm::kThreads),
            pm::kMaxEntropyBlocks);
  // One element, tails of a block, several blocks, and the capped grid.
  for (int64_t n : {int64_t{1}, int64_t{255}, int64_t{257}, int64_t{5000}, int64_t{-5000}}) {
    const unsigned grid_cap = n < 0 ? 3u : kNoCap;
    n = n < 0 ? -n : n;
    std::vector<float> p = rng.Floats(n, 0.0f, 1.0f);
    // Zeros, negatives (not summed), ones, subnormals and tiny values.
    for (int64_t i = 0; i < n; i += 7) p[i] = 0.0f;
    for (int64_t i = 3; i < n; i += 11) p[i] = -p[i];
    for (int64_t i = 5; i < n; i += 13) p[i] = 1.0f;
    for (int64_t i = 2; i < n; i += 17) p[i] = 1e-41f;
    for (int64_t i = 9; i < n; i += 19) p[i] = 3e-30f;
    EXPECT_EQ(pm::EntropyBlocks(n), (n + 255) / 256);
    const unsigned blocks = std::min(pm::EntropyBlocks(n), grid_cap);
    std::vector<double> partial(blocks, std::numeric_limits<double>::quiet_NaN());
    emu::Launch(EmuDim3{blocks, 1, 1}, pm::kThreads, no_smem, 0, 0,
                [&] { pm::EntropyKernel(p.data(), n, partial.data()); });
    double sum = 0.0;  // EntropySum's host loop
    for (unsigned b = 0; b < blocks; ++b) sum += partial[b];
    // EntropySumInto's <<<1, 1>>> launch: one thread, which a launch of the host model
    // (whole warps) cannot express, so called directly.
    double into = std::numeric_limits<double>::quiet_NaN();
    pm::SumInOrderKernel(partial.data(), blocks, &into);
    EXPECT_EQ(0, std::memcmp(&into, &sum, sizeof(double)))
        << "n " << n << ": " << into << " vs " << sum;

    const double want = EntropySum(Tensor::FromVector(p, {n}));
    double mag = 0.0;
    for (float v : p) {
      if (v > 0.0f) mag += std::fabs(static_cast<double>(v) * static_cast<double>(logf(v)));
    }
    EXPECT_LE(std::fabs(sum - want), 2 * Gamma(n + blocks, kU64) * mag)
        << "n " << n << ": " << sum << " vs " << want;
  }
}

}  // namespace
}  // namespace switchyard::kernels
