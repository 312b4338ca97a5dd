// The bias gradient's device code (kernels/cuda/bias_grad_kernels.cuh: stage 1's chunk column
// sums, with a fused gelu' written as it sums, and stage 2's per-group sums in chunk lanes) run
// on the CPU, without a GPU, through the host model of CUDA in tests/kernels/cuda_emulation.h,
// with bias.cu's launch shapes: (32, 8) blocks over (column tiles, chunks), then (32, 32)
// blocks over (column tiles, groups).
//
// What it checks:
//  - device-sized chunks (found from the offsets by both stages) give the bits of the same
//    groups' chunks listed by the host, with empty groups, groups of one row, groups of many
//    chunks (more than stage 2's 32 lanes), rows past offsets[G] (NaN: neither summed nor
//    written) and more chunk slots launched than used;
//  - chunks whose lanes hold four or more rows (stage 1's batched loads) and fewer (its tail);
//  - the sums against the CPU's GroupedBiasGrad, within a bound by construction: both add the
//    same f32 values in some order, so each is within gamma(R_g) sum_r |dy[r, j]| of the exact
//    sum (gamma(m) = m u / (1 - m u), u = 2^-24), and they differ by at most twice that
//    (plus |beta dbias| rounding: the beta term enters both the same way);
//  - fused gelu: dx written over dy on the groups' rows only, and dbias the column sums of
//    exactly the dx written (same bound, against a double sum of those values);
//  - kCast (BiasGradCast): the plain sums' bits, and dy rounded to bf16 on the groups' rows.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/philox.h"
#include "engine/core/tensor.h"
#include "kernels/activation.h"
#include "kernels/random.h"
// Last: the host model defines CUDA's qualifiers as macros. The bias kernels declare their
// shared arrays inside the kernel: static, they are one array for the CTA's threads.
#include "tests/kernels/cuda_emulation.h"
#undef __shared__
#define __shared__ static

#include "kernels/cuda/activation_math.cuh"
#include "kernels/cuda/bias_grad_kernels.cuh"

namespace switchyard::kernels {
namespace {

namespace bg = cuda::bias_grad;

std::vector<float> Uniform(int64_t n, uint64_t stream) {
  Tensor t = Tensor::Empty({n}, DType::kF32);
  FillUniform(t, RngKey{41, stream}, 0, -1.0f, 1.0f);
  return t.ToVector<float>();
}

// Both stages as bias.cu launches them (stage 1 four columns a thread where QuadsFit, counted
// in quad_launches, unless one_column); dbias (G, n) in and out.
int quad_launches = 0;
bool one_column = false;
template <bg::Fused F>
void RunBiasGrad(const std::vector<float>& dy, int64_t n, const bg::Chunks& ch, float beta,
                 std::vector<float>& dbias, bg::FusedArgs fused = {}) {
  std::vector<float> partial(static_cast<size_t>(std::max<int64_t>(ch.count, 1) * n),
                             std::numeric_limits<float>::quiet_NaN());
  unsigned char unused_smem[1];
  const unsigned tiles = static_cast<unsigned>((n + bg::kTileCols - 1) / bg::kTileCols);
  if (ch.count > 0) {
    const EmuDim3 block{bg::kTileCols, bg::kRowLanes, 1};
    if (!one_column && bg::QuadsFit(n, dy.data(), partial.data(), fused)) {
      ++quad_launches;
      const unsigned quad_tiles = static_cast<unsigned>((n + 4 * bg::kTileCols - 1) /
                                                        (4 * bg::kTileCols));
      emu::Launch(EmuDim3{quad_tiles, static_cast<unsigned>(ch.count), 1}, block, unused_smem, 0,
                  0, [&] {
                    bg::ChunkColumnSumKernel<F, 4>(dy.data(), n, ch, partial.data(), fused);
                  });
    } else {
      emu::Launch(EmuDim3{tiles, static_cast<unsigned>(ch.count), 1}, block, unused_smem, 0, 0,
                  [&] {
                    bg::ChunkColumnSumKernel<F, 1>(dy.data(), n, ch, partial.data(), fused);
                  });
    }
  }
  emu::Launch(EmuDim3{tiles, static_cast<unsigned>(ch.groups), 1},
              EmuDim3{bg::kTileCols, bg::kSumLanes, 1}, unused_smem, 0, 0, [&] {
                bg::GroupSumKernel(ch.count > 0 ? partial.data() : nullptr, ch, n, beta,
                                   dbias.data());
              });
}

// bias.cu's host-listed table for these group sizes (chunks of k, each group's in order).
struct HostTable {
  std::vector<int64_t> chunk_begin, bounds;
};
HostTable ListChunks(const std::vector<int64_t>& rows, int64_t k) {
  HostTable t{{0}, {0}};
  int64_t row = 0;
  for (int64_t r : rows) {
    const int64_t end = row + r;
    for (; row < end; row = std::min(end, row + k)) t.bounds.push_back(std::min(end, row + k));
    t.chunk_begin.push_back(static_cast<int64_t>(t.bounds.size()) - 1);
  }
  return t;
}

double Gamma(int64_t m) {
  const double u = std::ldexp(1.0, -24);
  return m * u / (1.0 - m * u);
}

struct Case {
  std::vector<int64_t> rows;
  int64_t n, past, k;  // columns, NaN rows past the groups, rows per chunk
};

TEST(BiasGradEmulationTest, DeviceSizedChunksEqualTheListedOnesAndTheCpu) {
  const std::vector<Case> cases = {
      // lanes of 5 rows (batched loads and the tail), an empty group, a group of one row,
      // a group of 52 chunks (more than stage 2's 32 lanes), 77 columns (a partial tile)
      {{0, 300, 1, 0, 2080, 7}, 77, 5, 40},
      {{3, 0}, 33, 2, 64},     // lanes of at most one row; the last group empty
      {{0, 0, 0}, 5, 3, 64},   // no rows in any group
      {{129}, 1, 0, 32},       // one column, lanes of four rows exactly
      {{0, 300, 1, 0, 70, 7}, 136, 5, 40}};  // four columns a thread: a tile and 8 columns
  uint64_t stream = 1;
  for (const Case& c : cases) {
    const int64_t groups = static_cast<int64_t>(c.rows.size()), n = c.n, k = c.k;
    std::vector<int64_t> offsets{0};
    for (int64_t r : c.rows) offsets.push_back(offsets.back() + r);
    const int64_t used = offsets.back(), total = used + c.past;
    std::vector<float> dy = Uniform(total * n, ++stream);
    for (int64_t i = used * n; i < total * n; ++i) dy[i] = std::numeric_limits<float>::quiet_NaN();
    const HostTable table = ListChunks(c.rows, k);
    const bg::Chunks listed{.bounds = table.bounds.data(), .chunk_begin = table.chunk_begin.data(),
                            .groups = groups, .rows_per_chunk = k, .rows = total,
                            .count = static_cast<int64_t>(table.bounds.size()) - 1};
    const bg::Chunks sized{.offsets = offsets.data(), .groups = groups, .rows_per_chunk = k,
                           .rows = total, .count = (total + groups * (k - 1)) / k};
    const std::string name = "groups of " + std::to_string(used) + " rows, n " + std::to_string(n);
    for (float beta : {0.0f, 1.0f}) {
      const std::vector<float> d0 =
          beta == 0.0f ? std::vector<float>(groups * n, std::numeric_limits<float>::quiet_NaN())
                       : Uniform(groups * n, ++stream);
      std::vector<float> by_list = d0, by_offsets = d0;
      RunBiasGrad<bg::Fused::kNone>(dy, n, listed, beta, by_list);
      RunBiasGrad<bg::Fused::kNone>(dy, n, sized, beta, by_offsets);
      ASSERT_EQ(0, std::memcmp(by_list.data(), by_offsets.data(), by_list.size() * 4)) << name;
      // kCast (BiasGradCast): the same sums, and dy rounded to bf16 on the groups' rows.
      {
        std::vector<float> by_cast = d0;
        std::vector<BFloat16> dy16(dy.size(), BFloat16(7.0f));
        bg::FusedArgs f;
        f.dx16 = dy16.data();
        RunBiasGrad<bg::Fused::kCast>(dy, n, sized, beta, by_cast, f);
        ASSERT_EQ(0, std::memcmp(by_cast.data(), by_offsets.data(), by_cast.size() * 4)) << name;
        for (size_t i = 0; i < dy.size(); ++i) {
          const BFloat16 want =
              static_cast<int64_t>(i) < used * n ? cuda::ToBf16(dy[i]) : BFloat16(7.0f);
          ASSERT_EQ(0, std::memcmp(&dy16[i], &want, 2)) << name << " kCast, element " << i;
        }
      }

      Tensor want = Tensor::FromVector(d0, {groups, n});
      GroupedBiasGrad(Tensor::FromVector(dy, {total, n}).Slice(0, used), c.rows, want, beta);
      const std::vector<float> w = want.ToVector<float>();
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t j = 0; j < n; ++j) {
          double mag = beta == 0.0f ? 0.0 : std::fabs(double(beta) * d0[g * n + j]);
          for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r) mag += std::fabs(dy[r * n + j]);
          const double bound = 2 * Gamma(c.rows[g] + 2) * mag;
          ASSERT_LE(std::fabs(double(by_offsets[g * n + j]) - w[g * n + j]), bound)
              << name << " beta " << beta << " group " << g << " column " << j;
        }
      }
    }

    // Fused gelu, dx over dy: the groups' rows get dy gelu'(a), the rows past them keep dy.
    const std::vector<float> a = Uniform(total * n, ++stream);
    std::vector<float> dx_list = dy, dx_sized = dy;
    std::vector<float> db_list(groups * n, 0.0f), db_sized(groups * n, 0.0f);
    RunBiasGrad<bg::Fused::kGelu>(dy, n, listed, 0.0f, db_list,
                                  bg::FusedArgs{a.data(), nullptr, dx_list.data(), nullptr});
    RunBiasGrad<bg::Fused::kGelu>(dx_sized, n, sized, 0.0f, db_sized,
                                  bg::FusedArgs{a.data(), nullptr, dx_sized.data(), nullptr});
    ASSERT_EQ(0, std::memcmp(dx_list.data(), dx_sized.data(), dx_list.size() * 4)) << name;
    ASSERT_EQ(0, std::memcmp(db_list.data(), db_sized.data(), db_list.size() * 4)) << name;
    // a kept in bf16 (FusedArgs::a16): the bits of the f32 kernel on the widened values.
    {
      std::vector<BFloat16> a16(a.size());
      std::vector<float> a_wide(a.size());
      for (size_t i = 0; i < a.size(); ++i) {
        a16[i] = cuda::ToBf16(a[i]);
        a_wide[i] = cuda::FromBf16(a16[i]);
      }
      std::vector<float> dx16 = dy, dxw = dy;
      std::vector<float> db16(groups * n, 0.0f), dbw(groups * n, 0.0f);
      bg::FusedArgs f16{nullptr, nullptr, dx16.data(), nullptr};
      f16.a16 = a16.data();
      RunBiasGrad<bg::Fused::kGelu>(dx16, n, sized, 0.0f, db16, f16);
      RunBiasGrad<bg::Fused::kGelu>(dxw, n, sized, 0.0f, dbw,
                                    bg::FusedArgs{a_wide.data(), nullptr, dxw.data(), nullptr});
      ASSERT_EQ(0, std::memcmp(dx16.data(), dxw.data(), dxw.size() * 4)) << name << " bf16 a";
      ASSERT_EQ(0, std::memcmp(db16.data(), dbw.data(), dbw.size() * 4)) << name << " bf16 a";
      // dx written in bf16 (FusedArgs::dx16, the products' operand) from the kept a: the
      // f32 dx rounded, the same bias gradient (summed in f32); rows past the groups left.
      std::vector<BFloat16> dxh(dy.size(), BFloat16(7.0f));
      std::vector<float> dbh(groups * n, 0.0f);
      bg::FusedArgs fh;
      fh.a16 = a16.data();
      fh.dx16 = dxh.data();
      RunBiasGrad<bg::Fused::kGelu>(dy, n, sized, 0.0f, dbh, fh);
      for (size_t i = 0; i < dy.size(); ++i) {
        const BFloat16 want =
            static_cast<int64_t>(i) < used * n ? cuda::ToBf16(dxw[i]) : BFloat16(7.0f);
        ASSERT_EQ(0, std::memcmp(&dxh[i], &want, 2)) << name << " bf16 dx, element " << i;
      }
      ASSERT_EQ(0, std::memcmp(dbh.data(), dbw.data(), dbw.size() * 4)) << name << " bf16 dx";
    }
    Tensor want_dx = Tensor::Empty({used, n}, DType::kF32);
    const Tensor a_used = Tensor::FromVector(a, {total, n}).Slice(0, used);
    GeluBackward(a_used, Tensor::FromVector(dy, {total, n}).Slice(0, used), want_dx);
    const std::vector<float> wdx = want_dx.ToVector<float>();
    for (int64_t i = 0; i < total * n; ++i) {
      if (i >= used * n) {
        ASSERT_TRUE(std::isnan(dx_sized[i])) << name << ": a row past the groups was written";
        continue;
      }
      // The same expression as the CPU's, expf's ulps apart at most.
      ASSERT_LE(std::fabs(dx_sized[i] - wdx[i]), 1e-6 * std::fabs(dy[i]) + 1e-30) << name << " " << i;
    }
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t j = 0; j < n; ++j) {
        double exact = 0.0, mag = 0.0;
        for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r) {
          exact += dx_sized[r * n + j];
          mag += std::fabs(dx_sized[r * n + j]);
        }
        ASSERT_LE(std::fabs(db_sized[g * n + j] - exact), Gamma(c.rows[g] + 1) * mag)
            << name << " fused group " << g << " column " << j;
      }
    }
  }
}

// Four columns a thread (stage 1's N = 4) against one: the same sums in the same order, so
// the same bits, for the plain sums, gelu (f32 a and dx, bf16 a and dx) and swiglu, over a
// partial column tile (n = 136) and a narrow one (n = 8), lanes with and without the batched
// loads; rows past the groups left alone.
TEST(BiasGradEmulationTest, FourColumnsAThreadGiveTheOneColumnBits) {
  uint64_t stream = 900;
  for (const int64_t n : {136, 8}) {
    const std::vector<int64_t> rows = {0, 130, 3, 0, 41};
    std::vector<int64_t> offsets{0};
    for (int64_t r : rows) offsets.push_back(offsets.back() + r);
    const int64_t groups = static_cast<int64_t>(rows.size()), used = offsets.back();
    const int64_t total = used + 3, k = 40;
    const bg::Chunks ch{.offsets = offsets.data(), .groups = groups, .rows_per_chunk = k,
                        .rows = total, .count = (total + groups * (k - 1)) / k};
    const std::vector<float> dy = Uniform(total * n, ++stream), a = Uniform(total * n, ++stream),
                             b = Uniform(total * n, ++stream);
    std::vector<BFloat16> a16(a.size()), b16(b.size());
    for (size_t i = 0; i < a.size(); ++i) a16[i] = cuda::ToBf16(a[i]), b16[i] = cuda::ToBf16(b[i]);
    // Runs F both ways on copies of the outputs and expects the same bits everywhere.
    auto both = [&](auto fused_kind, const char* what, auto make_args) {
      constexpr bg::Fused F = decltype(fused_kind)::value;
      std::vector<float> db[2], dx[2], dd[2];
      std::vector<BFloat16> dx16[2], dd16[2];
      const int before = quad_launches;
      for (int way = 0; way < 2; ++way) {
        db[way].assign(groups * n, 0.5f);
        dx[way] = dy, dd[way] = dy;
        dx16[way].assign(dy.size(), BFloat16(7.0f)), dd16[way].assign(dy.size(), BFloat16(7.0f));
        one_column = way == 1;
        RunBiasGrad<F>(dy, n, ch, 1.0f, db[way], make_args(dx[way], dd[way], dx16[way], dd16[way]));
      }
      one_column = false;
      EXPECT_EQ(quad_launches, before + 1) << what;
      const std::string name = std::string(what) + " n " + std::to_string(n);
      EXPECT_EQ(0, std::memcmp(db[0].data(), db[1].data(), db[0].size() * 4)) << name << " dbias";
      EXPECT_EQ(0, std::memcmp(dx[0].data(), dx[1].data(), dx[0].size() * 4)) << name << " dx";
      EXPECT_EQ(0, std::memcmp(dd[0].data(), dd[1].data(), dd[0].size() * 4)) << name << " db";
      EXPECT_EQ(0, std::memcmp(dx16[0].data(), dx16[1].data(), dx16[0].size() * 2)) << name;
      EXPECT_EQ(0, std::memcmp(dd16[0].data(), dd16[1].data(), dd16[0].size() * 2)) << name;
    };
    using Kind = bg::Fused;
    both(std::integral_constant<Kind, Kind::kNone>(), "sums", [](auto&, auto&, auto&, auto&) {
      return bg::FusedArgs{};
    });
    both(std::integral_constant<Kind, Kind::kCast>(), "sums with a bf16 copy",
         [&](auto&, auto&, std::vector<BFloat16>& dx16, auto&) {
           bg::FusedArgs f;
           f.dx16 = dx16.data();
           return f;
         });
    both(std::integral_constant<Kind, Kind::kGelu>(), "gelu f32",
         [&](std::vector<float>& dx, auto&, auto&, auto&) {
           return bg::FusedArgs{a.data(), nullptr, dx.data(), nullptr};
         });
    both(std::integral_constant<Kind, Kind::kGelu>(), "gelu bf16",
         [&](auto&, auto&, std::vector<BFloat16>& dx16, auto&) {
           bg::FusedArgs f;
           f.a16 = a16.data(), f.dx16 = dx16.data();
           return f;
         });
    both(std::integral_constant<Kind, Kind::kSwiglu>(), "swiglu f32",
         [&](std::vector<float>& da, std::vector<float>& db, auto&, auto&) {
           return bg::FusedArgs{a.data(), b.data(), da.data(), db.data()};
         });
    both(std::integral_constant<Kind, Kind::kSwiglu>(), "swiglu bf16",
         [&](auto&, auto&, std::vector<BFloat16>& da16, std::vector<BFloat16>& db16) {
           bg::FusedArgs f;
           f.a16 = a16.data(), f.b16 = b16.data(), f.dx16 = da16.data(), f.db16 = db16.data();
           return f;
         });
  }
}

}  // namespace
}  // namespace switchyard::kernels
