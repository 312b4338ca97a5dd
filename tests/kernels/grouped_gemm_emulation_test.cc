// The device-sized grouped products' device code (kernels/cuda/grouped_gemm_kernels.cuh) run on
// the CPU, without a GPU, through the host model of CUDA in tests/kernels/cuda_emulation.h (a
// CTA is 256 threads taking turns, CTAs one at a time), against the CPU reference
// (kernels::cpu::GroupedGemm / GroupedGemmWeightGrad with the offsets' differences as rows):
// the CTA's search of its (group, row tile) in the offsets (also past 256 groups), ragged and
// empty groups, groups smaller than a tile and spanning several, k, n and rows that are not
// multiples of the tiles (the 16-byte and the element-wise loads), w transposed or not, bf16
// mode on f32 and on bf16 operands (rounded as they are loaded) and f32 mode (SIMT), alpha
// and beta (beta = 0 over NaN, beta = 1), k = 0, and the rows past offsets[G]: out's keep
// their bits, and x's and dy's are NaN so that reading one shows.
//
// Tolerance, per element, by construction: both sides read the same operand values (bf16 mode
// rounds them the same way and bf16 x bf16 products are exact in f32), so each is within
// gamma(K + 2) (|alpha| sum_p |a_p b_p| + |beta c|) of the exact result, gamma(m) =
// m u / (1 - m u), u = 2^-24 (K - 1 sums or K fmas, then alpha, beta and their sum), and they
// differ by at most twice that. K = k for the forward, the group's rows for the weight
// gradient; the magnitudes are summed in double from the rounded operands. alpha is a power of
// two, so a BLAS that scales an operand by it first rounds nothing more.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/dtype.h"
#include "engine/core/philox.h"
#include "engine/core/tensor.h"
#include "kernels/gemm.h"
#include "kernels/random.h"
#include "tests/kernels/grouped_gemm_bound.h"
// Last: the host model defines CUDA's qualifiers as macros.
#include "tests/kernels/cuda_emulation.h"

namespace switchyard::kernels::cuda::grouped {
alignas(128) unsigned char smem[emu::kSharedBytes];  // the kernels' shared memory
}  // namespace switchyard::kernels::cuda::grouped

#include "kernels/cuda/grouped_gemm_kernels.cuh"

namespace switchyard::kernels {
namespace {

using grouped_test::Gamma;
using grouped_test::ReadValues;

namespace grouped = cuda::grouped;
template <bool kAKm, bool kBNk>
using TensorCore = grouped::TensorCoreTiles<kAKm, kBNk>;
template <bool kAKm, bool kBNk>
using Simt = grouped::SimtTiles<kAKm, kBNk>;

constexpr uint32_t kSentinel = 0x7fc12345u;  // a NaN payload: out's rows past offsets[G]

// ---- The launches, with grouped_gemm.cu's grids and early returns.

template <typename F>
void Launch(EmuDim3 grid, int64_t shared_bytes, F kernel) {
  emu::Launch(grid, grouped::kThreads, grouped::smem, sizeof(grouped::smem), shared_bytes,
              kernel);
}

template <typename T>
const T* Elements(const Tensor& t) {
  return static_cast<const T*>(t.raw_data());
}

int async_launches = 0;  // launches of the cp.async kernels, which the tests expect to see
// The cp.async kernels' tiles, as grouped_gemm.cu's CopyTiles(): P (128 x 128 on mma.sync, the
// default), P::Wide (128 x 256), P::Hopper (128 x 128 on wgmma) or P::Hopper::Wide (128 x 256).
enum class Tiles { kNarrow, kWide, kHopper, kHopperWide };
Tiles copy_tiles = Tiles::kNarrow;
// The forward's fused bias + GELU epilogue (GroupedGemmBiasGelu) when its h is set.
grouped::BiasGelu fused_epilogue;


template <class P, typename TX, typename TW, bool kTransW, bool kAsync>
void RunForwardOn(const Tensor& x, const Tensor& offsets, const Tensor& w, Tensor& out,
                  const grouped::Dims& d, float alpha, float beta) {
  const int64_t ctas = grouped::MaxRowTiles(d) * grouped::CeilDiv(d.n, P::kTileN);
  async_launches += kAsync;
  Launch({static_cast<unsigned>(ctas), 1, 1}, grouped::Smem<P, kAsync>::kBytes, [&] {
    grouped::GroupedGemmKernel<P, TX, TW, kTransW, kAsync>(
        Elements<TX>(x), offsets.data<int64_t>(), Elements<TW>(w),
        fused_epilogue.h != nullptr ? nullptr : out.data<float>(), d, alpha, beta,
        fused_epilogue);
  });
}

template <class P, typename TX, typename TW, bool kTransW>
void RunForward(const Tensor& x, const Tensor& offsets, const Tensor& w, Tensor& out,
                const grouped::Dims& d, float alpha, float beta) {
  if constexpr (grouped::kBothBf16<TX, TW>) {
    if (grouped::UseCopies(Elements<TX>(x), d.k, Elements<TW>(w), kTransW ? d.k : d.n)) {
      if (copy_tiles == Tiles::kWide) {
        return RunForwardOn<typename P::Wide, TX, TW, kTransW, true>(x, offsets, w, out, d,
                                                                      alpha, beta);
      }
      if (copy_tiles == Tiles::kHopper) {
        return RunForwardOn<typename P::Hopper, TX, TW, kTransW, true>(x, offsets, w, out, d,
                                                                        alpha, beta);
      }
      if (copy_tiles == Tiles::kHopperWide) {
        return RunForwardOn<typename P::Hopper::Wide, TX, TW, kTransW, true>(x, offsets, w, out,
                                                                              d, alpha, beta);
      }
      return RunForwardOn<P, TX, TW, kTransW, true>(x, offsets, w, out, d, alpha, beta);
    }
  }
  RunForwardOn<P, TX, TW, kTransW, false>(x, offsets, w, out, d, alpha, beta);
}

template <class P, typename TX, typename TD, bool kAsync>
void RunWeightGradOn(const Tensor& x, const Tensor& dy, const Tensor& offsets, Tensor& dw,
                     const grouped::Dims& d, float alpha, float beta) {
  const int64_t tiles = grouped::CeilDiv(d.k, grouped::kBM) * grouped::CeilDiv(d.n, P::kTileN);
  const EmuDim3 grid{static_cast<unsigned>(tiles), static_cast<unsigned>(d.groups), 1};
  async_launches += kAsync;
  Launch(grid, grouped::Smem<P, kAsync>::kBytes, [&] {
    grouped::GroupedWeightGradKernel<P, TX, TD, kAsync>(Elements<TX>(x), Elements<TD>(dy),
                                                        offsets.data<int64_t>(), dw.data<float>(),
                                                        d, alpha, beta);
  });
}

template <class P, typename TX, typename TD>
void RunWeightGrad(const Tensor& x, const Tensor& dy, const Tensor& offsets, Tensor& dw,
                   const grouped::Dims& d, float alpha, float beta) {
  if constexpr (grouped::kBothBf16<TX, TD>) {
    if (grouped::UseCopies(Elements<TX>(x), d.k, Elements<TD>(dy), d.n)) {
      if (copy_tiles == Tiles::kWide) {
        return RunWeightGradOn<typename P::Wide, TX, TD, true>(x, dy, offsets, dw, d, alpha, beta);
      }
      if (copy_tiles == Tiles::kHopper) {
        return RunWeightGradOn<typename P::Hopper, TX, TD, true>(x, dy, offsets, dw, d, alpha,
                                                                  beta);
      }
      if (copy_tiles == Tiles::kHopperWide) {
        return RunWeightGradOn<typename P::Hopper::Wide, TX, TD, true>(x, dy, offsets, dw, d,
                                                                        alpha, beta);
      }
      return RunWeightGradOn<P, TX, TD, true>(x, dy, offsets, dw, d, alpha, beta);
    }
  }
  RunWeightGradOn<P, TX, TD, false>(x, dy, offsets, dw, d, alpha, beta);
}

template <typename TX, typename TW>
void ForwardOfTypes(const Tensor& x, const Tensor& offsets, const Tensor& w, bool trans_w,
                    Tensor& out, const grouped::Dims& d, float alpha, float beta, bool bf16) {
  if (bf16) {
    if (trans_w) {
      RunForward<TensorCore<false, true>, TX, TW, true>(x, offsets, w, out, d, alpha, beta);
    } else {
      RunForward<TensorCore<false, false>, TX, TW, false>(x, offsets, w, out, d, alpha, beta);
    }
  } else if constexpr (std::is_same_v<TX, float> && std::is_same_v<TW, float>) {
    if (trans_w) {
      RunForward<Simt<false, true>, float, float, true>(x, offsets, w, out, d, alpha, beta);
    } else {
      RunForward<Simt<false, false>, float, float, false>(x, offsets, w, out, d, alpha, beta);
    }
  } else {
    FAIL() << "a bf16 operand in f32 mode";
  }
}

template <typename TX, typename TD>
void WeightGradOfTypes(const Tensor& x, const Tensor& dy, const Tensor& offsets, Tensor& dw,
                       const grouped::Dims& d, float alpha, float beta, bool bf16) {
  if (bf16) {
    RunWeightGrad<TensorCore<true, false>, TX, TD>(x, dy, offsets, dw, d, alpha, beta);
  } else if constexpr (std::is_same_v<TX, float> && std::is_same_v<TD, float>) {
    RunWeightGrad<Simt<true, false>, float, float>(x, dy, offsets, dw, d, alpha, beta);
  } else {
    FAIL() << "a bf16 operand in f32 mode";
  }
}

// Calls fn(a's element, b's element) with values of the tensors' element types.
template <typename F>
void ForTypes(const Tensor& a, const Tensor& b, F&& fn) {
  const bool a16 = a.dtype() == DType::kBF16, b16 = b.dtype() == DType::kBF16;
  if (a16 && b16) return fn(BFloat16(), BFloat16());
  if (a16) return fn(BFloat16(), 0.0f);
  if (b16) return fn(0.0f, BFloat16());
  fn(0.0f, 0.0f);
}

void EmulatedGroupedGemm(const Tensor& x, const Tensor& offsets, const Tensor& w, bool trans_w,
                         Tensor& out, float alpha, float beta, DType mode) {
  const grouped::Dims d{x.dim(0), x.dim(1), out.dim(1), w.dim(0)};
  if (d.rows == 0 || d.n == 0 || d.groups == 0) return;
  ForTypes(x, w, [&](auto tx, auto tw) {
    ForwardOfTypes<decltype(tx), decltype(tw)>(x, offsets, w, trans_w, out, d, alpha, beta,
                                               mode == DType::kBF16);
  });
}

void EmulatedWeightGrad(const Tensor& x, const Tensor& dy, const Tensor& offsets, Tensor& dw,
                        float alpha, float beta, DType mode) {
  const grouped::Dims d{x.dim(0), x.dim(1), dy.dim(1), dw.dim(0)};
  if (d.k == 0 || d.n == 0 || d.groups == 0) return;
  ForTypes(x, dy, [&](auto tx, auto td) {
    WeightGradOfTypes<decltype(tx), decltype(td)>(x, dy, offsets, dw, d, alpha, beta,
                                                  mode == DType::kBF16);
  });
}

// ---- Inputs, magnitudes and the check.

// Uniform [-1, 1), f32 or bf16; rows from `nan_from` on (of a 2-d tensor) NaN.
Tensor Random(const Shape& shape, uint64_t stream, DType dtype, int64_t nan_from = -1) {
  Tensor t = Tensor::Empty(shape, dtype);
  FillUniform(t, RngKey{47, stream}, 0, -1.0f, 1.0f);
  if (nan_from >= 0) {
    const int64_t cols = shape[1];
    for (int64_t i = nan_from * cols; i < t.numel(); ++i) {
      if (dtype == DType::kBF16) {
        t.data<BFloat16>()[i] = BFloat16(NAN);
      } else {
        t.data<float>()[i] = NAN;
      }
    }
  }
  return t;
}


std::string Name(DType dtype) { return std::string(DTypeName(dtype)); }


// Offsets of consecutive groups of rows[g] rows.
Tensor OffsetsOf(const std::vector<int64_t>& rows) {
  std::vector<int64_t> o(1, 0);
  for (int64_t r : rows) o.push_back(o.back() + r);
  return Tensor::FromVector(o, {static_cast<int64_t>(o.size())});
}

// Expects |got - want| <= bound per element (equality where the bound is 0; NaN fails) on the
// elements [begin, end); returns the largest fraction of the bound used.
double ExpectWithin(const Tensor& got, const Tensor& want, const std::vector<double>& bound,
                    int64_t begin, int64_t end, const std::string& what) {
  const float* g = got.data<float>();
  const float* w = want.data<float>();
  double worst = 0.0;
  int64_t bad = 0, first_bad = -1;
  for (int64_t i = begin; i < end; ++i) {
    const double err = std::fabs(static_cast<double>(g[i]) - w[i]);
    const double b = bound[static_cast<size_t>(i)];
    if (!(err <= b)) {
      if (bad++ == 0) first_bad = i;
      continue;
    }
    if (b > 0) worst = std::max(worst, err / b);
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " elements outside the bound, the first at "
                    << first_bad << ": " << (first_bad >= 0 ? g[first_bad] : 0.0f) << " vs "
                    << (first_bad >= 0 ? w[first_bad] : 0.0f);
  return worst;
}

// Expects out's elements from `from` on to hold the sentinel's bits.
void ExpectSentinel(const Tensor& out, int64_t from, const std::string& what) {
  const uint32_t* p = static_cast<const uint32_t*>(out.raw_data());
  int64_t changed = 0;
  for (int64_t i = from; i < out.numel(); ++i) changed += p[i] != kSentinel;
  EXPECT_EQ(changed, 0) << what << ": rows past offsets[G] written";
}

double worst_used = 0.0;  // over the whole run, printed by the last test

struct Split {
  std::vector<int64_t> rows;  // per group
  int64_t extra;              // rows past offsets[G]
  // "rows=0,5,150, +7", or for many groups "G=300 rows=0:2,255:130, +3" (the non-empty).
  std::string Name() const {
    const bool many = rows.size() > 16;
    std::string s = many ? "G=" + std::to_string(rows.size()) + " rows=" : "rows=";
    for (size_t g = 0; g < rows.size(); ++g) {
      if (many && rows[g] == 0) continue;
      s += (many ? std::to_string(g) + ":" : "") + std::to_string(rows[g]) + ",";
    }
    return s + " +" + std::to_string(extra);
  }
};

// The forward, both orientations of w, against the CPU.
void CheckForward(const Split& split, int64_t k, int64_t n, float alpha, float beta, DType mode,
                  DType x_dtype, DType w_dtype, uint64_t seed) {
  const int64_t g = static_cast<int64_t>(split.rows.size());
  const Tensor offsets = OffsetsOf(split.rows);
  const int64_t used = offsets.data<int64_t>()[g], r = used + split.extra;
  if (x_dtype == DType::kBF16 || w_dtype == DType::kBF16) mode = DType::kBF16;
  const Tensor x = Random({r, k}, seed, x_dtype, used);
  const std::vector<double> xv = ReadValues(x, mode);
  for (bool trans_w : {false, true}) {
    const std::string what = split.Name() + " k=" + std::to_string(k) + " n=" +
                             std::to_string(n) + " trans_w=" + std::to_string(trans_w) +
                             " alpha=" + std::to_string(alpha) + " beta=" +
                             std::to_string(beta) + " mode=" + Name(mode) + " x " + Name(x_dtype) +
                             " w " + Name(w_dtype);
    const Tensor w = Random(trans_w ? Shape{g, n, k} : Shape{g, k, n}, seed + 1, w_dtype);
    const std::vector<double> wv = ReadValues(w, mode);
    Tensor out0 = Random({r, n}, seed + 2, DType::kF32);
    float* o0 = out0.data<float>();
    for (int64_t i = 0; i < used * n; ++i) o0[i] = beta == 0.0f ? NAN : o0[i];
    for (int64_t i = used * n; i < r * n; ++i) std::memcpy(&o0[i], &kSentinel, 4);
    Tensor got = out0.Clone(), want = out0.Clone();
    EmulatedGroupedGemm(x, offsets, w, trans_w, got, alpha, beta, mode);
    cpu::GroupedGemm(x, split.rows, w, trans_w, want, alpha, beta, mode, GroupSchedule::kSplit);
    const std::vector<double> bound = grouped_test::ForwardBound(
        xv, wv, offsets.ToVector<int64_t>(), k, n, trans_w, alpha, beta, o0);
    const double used_frac = ExpectWithin(got, want, bound, 0, used * n, "GroupedGemm " + what);
    ExpectSentinel(got, used * n, "GroupedGemm " + what);
    worst_used = std::max(worst_used, used_frac);
    std::printf("  GroupedGemm %-100s bound used %.4f\n", what.c_str(), used_frac);
  }
}

// The weight gradient against the CPU.
void CheckWeightGrad(const Split& split, int64_t k, int64_t n, float alpha, float beta,
                     DType mode, DType dtype, uint64_t seed) {
  const int64_t g = static_cast<int64_t>(split.rows.size());
  const Tensor offsets = OffsetsOf(split.rows);
  const int64_t used = offsets.data<int64_t>()[g], r = used + split.extra;
  if (dtype == DType::kBF16) mode = DType::kBF16;
  const std::string what = split.Name() + " k=" + std::to_string(k) + " n=" + std::to_string(n) +
                           " alpha=" + std::to_string(alpha) + " beta=" + std::to_string(beta) +
                           " mode=" + Name(mode) + " operands " + Name(dtype);
  const Tensor x = Random({r, k}, seed, dtype, used), dy = Random({r, n}, seed + 1, dtype, used);
  const std::vector<double> xv = ReadValues(x, mode), dyv = ReadValues(dy, mode);
  Tensor dw0 = Random({g, k, n}, seed + 2, DType::kF32);
  float* d0 = dw0.data<float>();
  if (beta == 0.0f) {
    for (int64_t i = 0; i < dw0.numel(); ++i) d0[i] = NAN;
  }
  Tensor got = dw0.Clone(), want = dw0.Clone();
  EmulatedWeightGrad(x, dy, offsets, got, alpha, beta, mode);
  cpu::GroupedGemmWeightGrad(x, dy, split.rows, want, alpha, beta, mode, GroupSchedule::kSplit);
  std::vector<double> bound(static_cast<size_t>(dw0.numel()), 0.0);
  int64_t row = 0;
  for (int64_t e = 0; e < g; ++e) {
    for (int64_t p = 0; p < k; ++p) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0.0;
        for (int64_t i = row; i < row + split.rows[e]; ++i) {
          s += std::fabs(xv[i * k + p] * dyv[i * n + j]);
        }
        const int64_t at = (e * k + p) * n + j;
        const double c = beta == 0.0f ? 0.0 : std::fabs(beta * d0[at]);
        bound[at] = 2.0 * Gamma(split.rows[e] + 2) * (std::fabs(alpha) * s + c);
      }
    }
    row += split.rows[e];
  }
  const double used_frac = ExpectWithin(got, want, bound, 0, dw0.numel(), "WeightGrad " + what);
  worst_used = std::max(worst_used, used_frac);
  std::printf("  WeightGrad  %-100s bound used %.4f\n", what.c_str(), used_frac);
}

// Empty groups first, in the middle and last; groups of 5 and 40 rows (one partial tile) and
// of 150 (two tiles); rows past offsets[G].
const Split kRagged{{0, 5, 150, 0, 40, 0}, 7};

// The fused bias + GELU epilogue (w not transposed, as the experts' W1) against the plain
// product then the bias kernels' expressions, computed here with the device's own Gelu and
// rounding: kept = bf16(a + bias[g]) and h = bf16(gelu(a + bias[g])) bit for bit on the
// groups' rows; the rows past offsets[G] keep their sentinel. Returns the kernels launched on
// the cp.async path (0 or 2: the plain product and the fused).
int CheckFusedBiasGelu(const Split& split, int64_t k, int64_t n, DType mode, DType x_dtype,
                       uint64_t seed) {
  const int launches = async_launches;
  const int64_t g = static_cast<int64_t>(split.rows.size());
  const Tensor offsets = OffsetsOf(split.rows);
  const int64_t used = offsets.data<int64_t>()[g], r = used + split.extra;
  const Tensor x = Random({r, k}, seed, x_dtype, used);
  const Tensor w = Random({g, k, n}, seed + 1, x_dtype);
  const Tensor bias = Random({g, n}, seed + 2, DType::kF32);
  Tensor a = Tensor::Empty({r, n}, DType::kF32);
  EmulatedGroupedGemm(x, offsets, w, false, a, 1.0f, 0.0f, mode);
  Tensor h = Tensor::Empty({r, n}, DType::kBF16), kept = Tensor::Empty({r, n}, DType::kBF16);
  std::memset(h.raw_data(), 0xA5, h.nbytes());
  std::memset(kept.raw_data(), 0xA5, kept.nbytes());
  fused_epilogue = {bias.data<float>(), static_cast<grouped::Bf16*>(h.raw_data()),
                    static_cast<grouped::Bf16*>(kept.raw_data())};
  EmulatedGroupedGemm(x, offsets, w, false, a, 1.0f, 0.0f, mode);
  fused_epilogue = {};
  const std::string what = "fused bias + gelu " + split.Name() + " k=" + std::to_string(k) +
                           " n=" + std::to_string(n) + " mode=" + Name(mode) + " x " +
                           Name(x_dtype);
  const uint16_t* hb = static_cast<const uint16_t*>(h.raw_data());
  const uint16_t* kb = static_cast<const uint16_t*>(kept.raw_data());
  int64_t bad = 0, row = 0;
  for (int64_t e = 0; e < g; ++e) {
    for (int64_t i = row; i < row + split.rows[e]; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const float z = a.data<float>()[i * n + j] + bias.data<float>()[e * n + j];
        bad += kb[i * n + j] != __bfloat16_as_ushort(cuda::ToBf16(z));
        bad += hb[i * n + j] != __bfloat16_as_ushort(cuda::ToBf16(cuda::Gelu(z)));
      }
    }
    row += split.rows[e];
  }
  for (int64_t i = used * n; i < r * n; ++i) bad += hb[i] != 0xA5A5 || kb[i] != 0xA5A5;
  EXPECT_EQ(bad, 0) << what;
  return async_launches - launches;
}

TEST(GroupedGemmEmulationTest, Bf16ModeForward) {
  // k, n not multiples of the tiles nor of 4 (element-wise loads), then multiples of 8 (16-byte
  // loads; n = 136 leaves an 8-column edge tile), then whole tiles.
  CheckForward(kRagged, 70, 150, 1.0f, 0.0f, DType::kBF16, DType::kF32, DType::kF32, 100);
  CheckForward(kRagged, 96, 136, 0.5f, 1.0f, DType::kBF16, DType::kF32, DType::kF32, 110);
  CheckForward({{300, 1}, 0}, 64, 128, -2.0f, 0.25f, DType::kBF16, DType::kF32, DType::kF32, 120);
}

TEST(GroupedGemmEmulationTest, Bf16OperandsForward) {
  CheckForward(kRagged, 72, 40, 1.0f, 0.0f, DType::kF32, DType::kBF16, DType::kF32, 200);
  CheckForward(kRagged, 72, 40, 0.5f, 1.0f, DType::kF32, DType::kF32, DType::kBF16, 210);
  CheckForward(kRagged, 35, 19, 1.0f, 1.0f, DType::kBF16, DType::kBF16, DType::kBF16, 220);
}

// f32 copy of a bf16 tensor: the same values, which the register pipeline rounds exactly.
Tensor Widened(const Tensor& t) {
  Tensor f = Tensor::Empty(t.shape(), DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i) {
    f.data<float>()[i] = static_cast<float>(t.data<BFloat16>()[i]);
  }
  return f;
}

// The cp.async pipeline (both operands bf16, aligned) against the register pipeline on the
// same values in f32 (rounded exactly as they are stored): the same shared tiles, so the same
// bits, over one K step, fewer steps than the stages, many steps, a last step of one chunk
// (k = 72), an 8-column edge tile (n = 136) and ragged groups; then against the CPU within
// the bound, which also covers NaN rows past offsets[G] (never copied as in bounds).
// Every tile shape of the copies: the 128 x 128 (K steps of 32) on the shapes above; the wide
// (128 x 256, K steps of 64) on one step, a last step of 8 (k = 72), four steps, and a second
// column tile of 8 columns (n = 264); the weight gradient likewise. The Hopper tiles (wgmma on
// swizzled tiles, K steps of 64, 128 x 128) on one step, a last step of 8, four steps and a
// second column tile of 8 (n = 136); the weight gradient on a second row tile of 8 (k = 136,
// the MN-major A's second column block empty) and a second column tile (n = 200); the ragged
// groups put row tiles across groups and the weight gradient's last K steps part-empty. The
// wide Hopper tiles (m64n256k16) on the wide ones' shapes.
class CopiesPipelineTest : public ::testing::TestWithParam<Tiles> {};

using Shapes = std::vector<std::pair<int64_t, int64_t>>;  // (k, n)

TEST_P(CopiesPipelineTest, MatchesRegisterPipeline) {
  copy_tiles = GetParam();
  const int before = async_launches;
  const bool hopper = copy_tiles == Tiles::kHopper || copy_tiles == Tiles::kHopperWide;
  Shapes forward = copy_tiles == Tiles::kNarrow
                       ? Shapes{{16, 40}, {64, 136}, {72, 136}, {200, 24}}
                       : Shapes{{16, 40}, {72, 136}, {200, 24}, {40, 264}};
  // wgmma: 7 K steps (the last of 8), more than the stages, so that a refill of a stage
  // still read by products in flight would show.
  if (hopper) forward[2] = {392, 24};
  const bool wide = copy_tiles == Tiles::kWide || copy_tiles == Tiles::kHopperWide;
  const Shapes weight_grad = wide ? Shapes{{24, 200}, {40, 264}} : Shapes{{136, 64}, {24, 200}};
  for (const auto& [k, n] : forward) {
    const Tensor offsets = OffsetsOf(kRagged.rows);
    const int64_t g = static_cast<int64_t>(kRagged.rows.size());
    const int64_t used = offsets.data<int64_t>()[g], r = used + kRagged.extra;
    const Tensor x = Random({r, k}, 600 + k, DType::kBF16, used);
    for (bool trans_w : {false, true}) {
      const Tensor w = Random(trans_w ? Shape{g, n, k} : Shape{g, k, n}, 601 + k, DType::kBF16);
      Tensor got = Random({r, n}, 602, DType::kF32), want = got.Clone();
      const int launches = async_launches;
      EmulatedGroupedGemm(x, offsets, w, trans_w, got, 0.5f, 1.0f, DType::kBF16);
      EXPECT_EQ(async_launches, launches + 1) << "k=" << k << " n=" << n;
      EmulatedGroupedGemm(Widened(x), offsets, Widened(w), trans_w, want, 0.5f, 1.0f,
                          DType::kBF16);
      emu::ExpectSameBits(got.ToVector<float>(), want.ToVector<float>(),
                          "forward k=" + std::to_string(k) + " n=" + std::to_string(n) +
                              " trans_w=" + std::to_string(trans_w));
    }
    CheckForward(kRagged, k, n, 1.0f, 0.0f, DType::kBF16, DType::kBF16, DType::kBF16, 610 + k);
    EXPECT_EQ(CheckFusedBiasGelu(kRagged, k, n, DType::kBF16, DType::kBF16, 640 + k), 2);
  }
  // The weight gradient: groups of 130 rows (5 K steps of 32), 37 (2), 3 (1) and none; for
  // wgmma (K steps of 64) 330 rows (6 steps) in place of 130.
  const Split split{{0, 37, hopper ? 330 : 130, 3, 0}, 9};
  const Tensor offsets = OffsetsOf(split.rows);
  const int64_t g = static_cast<int64_t>(split.rows.size());
  const int64_t used = offsets.data<int64_t>()[g], r = used + split.extra;
  for (const auto& [k, n] : weight_grad) {
    const Tensor x = Random({r, k}, 620 + k, DType::kBF16, used);
    const Tensor dy = Random({r, n}, 621 + k, DType::kBF16, used);
    Tensor got = Random({g, k, n}, 622, DType::kF32), want = got.Clone();
    EmulatedWeightGrad(x, dy, offsets, got, 1.0f, 1.0f, DType::kBF16);
    EmulatedWeightGrad(Widened(x), Widened(dy), offsets, want, 1.0f, 1.0f, DType::kBF16);
    emu::ExpectSameBits(got.ToVector<float>(), want.ToVector<float>(),
                        "weight grad k=" + std::to_string(k) + " n=" + std::to_string(n));
    CheckWeightGrad(split, k, n, -2.0f, 0.0f, DType::kBF16, DType::kBF16, 630 + k);
  }
  // Every bf16 launch here took the copies: 4 shapes x 2 orientations, twice (the bit check
  // and CheckForward's), 4 shapes of the fused epilogue, twice (plain and fused), and 2 shapes
  // of the weight gradient, twice.
  EXPECT_EQ(async_launches - before, 4 * 2 * 2 + 4 * 2 + 2 * 2);
  copy_tiles = Tiles::kNarrow;
}

INSTANTIATE_TEST_SUITE_P(Tiles, CopiesPipelineTest,
                         ::testing::Values(Tiles::kWide, Tiles::kNarrow, Tiles::kHopper,
                                           Tiles::kHopperWide),
                         [](const ::testing::TestParamInfo<Tiles>& info) {
                           switch (info.param) {
                             case Tiles::kWide: return std::string("Wide");
                             case Tiles::kHopper: return std::string("Hopper");
                             case Tiles::kHopperWide: return std::string("HopperWide");
                             default: return std::string("Narrow");
                           }
                         });

// The fused epilogue on the register pipeline (an f32 operand, bf16 mode) and the SIMT
// kernels (f32 mode): partial row and column tiles, ragged groups.
TEST(GroupedGemmEmulationTest, FusedBiasGeluOnEveryPipeline) {
  EXPECT_EQ(CheckFusedBiasGelu(kRagged, 70, 150, DType::kBF16, DType::kF32, 700), 0);
  EXPECT_EQ(CheckFusedBiasGelu(kRagged, 96, 136, DType::kBF16, DType::kF32, 710), 0);
  EXPECT_EQ(CheckFusedBiasGelu(kRagged, 70, 150, DType::kF32, DType::kF32, 720), 0);
}

TEST(GroupedGemmEmulationTest, F32ModeForward) {
  CheckForward(kRagged, 70, 150, 1.0f, 0.0f, DType::kF32, DType::kF32, DType::kF32, 300);
  CheckForward(kRagged, 96, 136, 0.5f, 1.0f, DType::kF32, DType::kF32, DType::kF32, 310);
}

TEST(GroupedGemmEmulationTest, ManyGroupsAndNoInnerDimension) {
  // 300 groups, the CTAs' search crossing its 256-group chunks; rows in groups 0, 255, 256
  // and 299 only.
  Split many{std::vector<int64_t>(300, 0), 3};
  many.rows[0] = 2, many.rows[255] = 130, many.rows[256] = 1, many.rows[299] = 9;
  CheckForward(many, 40, 24, 1.0f, 0.0f, DType::kBF16, DType::kF32, DType::kF32, 400);
  CheckForward(many, 40, 24, 1.0f, 0.0f, DType::kF32, DType::kF32, DType::kF32, 410);
  // k = 0: out = beta out on the groups' rows (0 over NaN for beta = 0), the rest untouched.
  CheckForward(kRagged, 0, 20, 1.0f, 0.5f, DType::kBF16, DType::kF32, DType::kF32, 420);
  CheckForward(kRagged, 0, 20, 1.0f, 0.0f, DType::kF32, DType::kF32, DType::kF32, 430);
}

TEST(GroupedGemmEmulationTest, WeightGrad) {
  const Split split{{0, 37, 130, 3, 0}, 9};
  // k = 150: two k tiles, the second of 22; n = 70: one partial n tile.
  CheckWeightGrad(split, 150, 70, 1.0f, 0.0f, DType::kBF16, DType::kF32, 500);
  CheckWeightGrad(split, 150, 70, 0.5f, 1.0f, DType::kBF16, DType::kF32, 510);
  CheckWeightGrad(split, 136, 64, 1.0f, 0.0f, DType::kBF16, DType::kBF16, 520);  // 16-byte loads
  CheckWeightGrad(split, 150, 70, 1.0f, 0.0f, DType::kF32, DType::kF32, 530);
  CheckWeightGrad(split, 136, 64, -2.0f, 1.0f, DType::kF32, DType::kF32, 540);
  // No rows at all: every dw[g] = beta dw[g].
  CheckWeightGrad({{0, 0}, 0}, 20, 12, 1.0f, 0.5f, DType::kBF16, DType::kF32, 550);
  CheckWeightGrad({{0, 0}, 4}, 20, 12, 1.0f, 0.0f, DType::kF32, DType::kF32, 560);
  std::printf("  largest fraction of the bound used: %.4f\n", worst_used);
}

}  // namespace
}  // namespace switchyard::kernels
