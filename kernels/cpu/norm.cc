// CPU reference implementation of kernels/norm.h: one pass per row, statistics in double;
// rows in parallel. dweight / dbias: each chunk of kChunkRows rows sums its columns in
// double in row order, the chunks are added in order, so the sums do not depend on the
// thread count. (The CUDA kernels cut the rows into chunks too, but sum each in 8
// interleaved row lanes and round once at the end: the two agree within a bound, not bit for
// bit.) Every row of x is read before the same row of y is
// written, so y may alias x (and dx dy). The arguments were checked by kernels/norm.cc.
#include "kernels/norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/core/thread_pool.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/vec_math.h"

namespace switchyard::kernels::cpu {
namespace {

// Rows N of a (..., d) tensor.
int64_t RowsOf(const Tensor& x, int64_t d) { return d == 0 ? 0 : x.numel() / d; }

// Rows per chunk of the weight-gradient column sums.
constexpr int64_t kChunkRows = 256;


// column[j] += the sum over chunks, in order, of partial[c * d + j].
void AddChunkSums(const std::vector<double>& partial, int64_t chunks, int64_t d, float* column) {
  for (int64_t j = 0; j < d; ++j) {
    double sum = 0.0;
    for (int64_t c = 0; c < chunks; ++c) sum += partial[c * d + j];
    column[j] += static_cast<float>(sum);
  }
}

// Sums in 8 double lanes (one AVX-512 register), finished in order: vectorised, still in
// double as MODEL.md asks of the statistics.
constexpr int kNormLanes = 8;

SY_VECTOR_CLONES void LayerNormRow(const float* xr, const float* w, const float* b, float eps,
                                   int64_t d, float* yr, float* mean_out, float* rstd_out) {
  double lane[kNormLanes] = {};
  int64_t j = 0;
  for (; j + kNormLanes <= d; j += kNormLanes)
    for (int l = 0; l < kNormLanes; ++l) lane[l] += xr[j + l];
  double sum = 0.0;
  for (int l = 0; l < kNormLanes; ++l) sum += lane[l];
  for (; j < d; ++j) sum += xr[j];
  const double mu = sum / static_cast<double>(d);
  double vlane[kNormLanes] = {};
  for (j = 0; j + kNormLanes <= d; j += kNormLanes) {
    for (int l = 0; l < kNormLanes; ++l) {
      const double c = xr[j + l] - mu;
      vlane[l] += c * c;
    }
  }
  double var = 0.0;
  for (int l = 0; l < kNormLanes; ++l) var += vlane[l];
  for (; j < d; ++j) var += (xr[j] - mu) * (xr[j] - mu);
  var /= static_cast<double>(d);
  const float m = static_cast<float>(mu);
  const float s = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
  if (b) {
    for (j = 0; j < d; ++j) yr[j] = (xr[j] - m) * s * w[j] + b[j];
  } else {
    for (j = 0; j < d; ++j) yr[j] = (xr[j] - m) * s * w[j];
  }
  *mean_out = m;
  *rstd_out = s;
}

void RmsNormRow(const float* xr, const float* w, float eps, int64_t d, float* yr, float* rstd_out) {
  double ss = 0.0;
  for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(xr[j]) * xr[j];
  const float s =
      static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + static_cast<double>(eps)));
  for (int64_t j = 0; j < d; ++j) yr[j] = xr[j] * s * w[j];
  *rstd_out = s;
}

// s = a + b elementwise (sum may be a's memory).
void AddRowsOf(const float* a, const float* b, float* sum, int64_t d) {
  for (int64_t j = 0; j < d; ++j) sum[j] = a[j] + b[j];
}

// One row of the LayerNorm backward: dx, and the row's dweight / dbias terms added to pw / pb.
SY_VECTOR_CLONES void LayerNormBackwardRow(const float* xr, const float* dyr, const float* w,
                                           float m, float s, int64_t d, float* dxr, double* pw,
                                           double* pb, bool add) {
  double glane[kNormLanes] = {}, gxlane[kNormLanes] = {};
  int64_t j = 0;
  for (; j + kNormLanes <= d; j += kNormLanes) {
    for (int l = 0; l < kNormLanes; ++l) {
      const float xhat = (xr[j + l] - m) * s;
      const float g = dyr[j + l] * w[j + l];
      glane[l] += g;
      gxlane[l] += static_cast<double>(g) * xhat;
    }
  }
  double sum_g = 0.0, sum_gx = 0.0;
  for (int l = 0; l < kNormLanes; ++l) sum_g += glane[l], sum_gx += gxlane[l];
  for (; j < d; ++j) {
    const float xhat = (xr[j] - m) * s;
    const float g = dyr[j] * w[j];
    sum_g += g;
    sum_gx += static_cast<double>(g) * xhat;
  }
  for (j = 0; j < d; ++j) pw[j] += static_cast<double>(dyr[j]) * ((xr[j] - m) * s);
  if (pb) {
    for (j = 0; j < d; ++j) pb[j] += dyr[j];
  }
  const float mean_g = static_cast<float>(sum_g / static_cast<double>(d));
  const float mean_gx = static_cast<float>(sum_gx / static_cast<double>(d));
  if (add) {  // dx += the gradient: kernels::Axpy(1, ...)'s one addition
    for (j = 0; j < d; ++j) {
      const float xhat = (xr[j] - m) * s;
      const float v = s * (dyr[j] * w[j] - mean_g - xhat * mean_gx);
      dxr[j] = dxr[j] + v;
    }
    return;
  }
  for (j = 0; j < d; ++j) {
    const float xhat = (xr[j] - m) * s;
    dxr[j] = s * (dyr[j] * w[j] - mean_g - xhat * mean_gx);
  }
}

}  // namespace

void LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                      Tensor& y, Tensor& mean, Tensor& rstd) {
  const int64_t d = weight.numel();
  const int64_t n = RowsOf(x, d);
  const float* w = weight.data<float>();
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
  float* pm = mean.data<float>();
  float* pr = rstd.data<float>();
  ParallelFor(n, RowsPerChunk(d), [&](int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    LayerNormRow(x.data<float>() + r * d, w, b, eps, d, y.data<float>() + r * d, pm + r, pr + r);
  }
  });
}

void LayerNormBackward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                       const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dweight,
                       Tensor& dbias, Write write) {
  const int64_t d = weight.numel();
  const int64_t n = RowsOf(x, d);
  const float* w = weight.data<float>();
  float* dw = dweight.data<float>();
  float* db = dbias.defined() ? dbias.data<float>() : nullptr;
  const int64_t chunks = (n + kChunkRows - 1) / kChunkRows;
  std::vector<double> part_w(static_cast<size_t>(chunks * d), 0.0);
  std::vector<double> part_b(db ? static_cast<size_t>(chunks * d) : 0, 0.0);
  ParallelFor(chunks, 1, [&](int64_t c0, int64_t c1) {
  for (int64_t r = c0 * kChunkRows; r < std::min(n, c1 * kChunkRows); ++r) {
    double* pw = part_w.data() + (r / kChunkRows) * d;
    double* pb = db ? part_b.data() + (r / kChunkRows) * d : nullptr;
    LayerNormBackwardRow(x.data<float>() + r * d, dy.data<float>() + r * d, w,
                         mean.data<float>()[r], rstd.data<float>()[r], d,
                         dx.data<float>() + r * d, pw, pb, write == Write::kAdd);
  }
  });
  AddChunkSums(part_w, chunks, d, dw);
  if (db) AddChunkSums(part_b, chunks, d, db);
}

void RmsNormForward(const Tensor& x, const Tensor& weight, float eps, Tensor& y, Tensor& rstd) {
  const int64_t d = weight.numel();
  const int64_t n = RowsOf(x, d);
  const float* w = weight.data<float>();
  ParallelFor(n, RowsPerChunk(d), [&](int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    RmsNormRow(x.data<float>() + r * d, w, eps, d, y.data<float>() + r * d, rstd.data<float>() + r);
  }
  });
}

// The fused residual add + norm: per row, sum = x + r (the one f32 add kernels::Add does)
// then the row function the plain forward runs on it, so the bits are Add's then the norm's.
void AddLayerNormForward(const Tensor& x, const Tensor& r, const Tensor& weight,
                         const Tensor& bias, float eps, Tensor& sum, Tensor& y, Tensor& mean,
                         Tensor& rstd) {
  const int64_t d = weight.numel();
  const int64_t n = RowsOf(x, d);
  const float* w = weight.data<float>();
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
  ParallelFor(n, RowsPerChunk(d), [&](int64_t r0, int64_t r1) {
  for (int64_t i = r0; i < r1; ++i) {
    float* sr = sum.data<float>() + i * d;
    AddRowsOf(x.data<float>() + i * d, r.data<float>() + i * d, sr, d);
    LayerNormRow(sr, w, b, eps, d, y.data<float>() + i * d, mean.data<float>() + i,
                 rstd.data<float>() + i);
  }
  });
}

void AddRmsNormForward(const Tensor& x, const Tensor& r, const Tensor& weight, float eps,
                       Tensor& sum, Tensor& y, Tensor& rstd) {
  const int64_t d = weight.numel();
  const int64_t n = RowsOf(x, d);
  const float* w = weight.data<float>();
  ParallelFor(n, RowsPerChunk(d), [&](int64_t r0, int64_t r1) {
  for (int64_t i = r0; i < r1; ++i) {
    float* sr = sum.data<float>() + i * d;
    AddRowsOf(x.data<float>() + i * d, r.data<float>() + i * d, sr, d);
    RmsNormRow(sr, w, eps, d, y.data<float>() + i * d, rstd.data<float>() + i);
  }
  });
}

void RmsNormBackward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy,
                     Tensor& dx, Tensor& dweight, Write write) {
  const int64_t d = weight.numel();
  const int64_t n = RowsOf(x, d);
  const float* w = weight.data<float>();
  float* dw = dweight.data<float>();
  const int64_t chunks = (n + kChunkRows - 1) / kChunkRows;
  std::vector<double> part_w(static_cast<size_t>(chunks * d), 0.0);
  ParallelFor(chunks, 1, [&](int64_t c0, int64_t c1) {
  for (int64_t r = c0 * kChunkRows; r < std::min(n, c1 * kChunkRows); ++r) {
    double* pw = part_w.data() + (r / kChunkRows) * d;
    const float* xr = x.data<float>() + r * d;
    const float* dyr = dy.data<float>() + r * d;
    float* dxr = dx.data<float>() + r * d;
    const float s = rstd.data<float>()[r];
    double sum_gx = 0.0;
    for (int64_t j = 0; j < d; ++j) {
      sum_gx += static_cast<double>(dyr[j]) * w[j] * xr[j];
      pw[j] += static_cast<double>(dyr[j] * xr[j] * s);
    }
    const float c = static_cast<float>(sum_gx / static_cast<double>(d)) * s * s;
    if (write == Write::kAdd) {  // dx += the gradient: kernels::Axpy(1, ...)'s addition
      for (int64_t j = 0; j < d; ++j) dxr[j] = dxr[j] + s * (dyr[j] * w[j] - xr[j] * c);
    } else {
      for (int64_t j = 0; j < d; ++j) dxr[j] = s * (dyr[j] * w[j] - xr[j] * c);
    }
  }
  });
  AddChunkSums(part_w, chunks, d, dw);
}

}  // namespace switchyard::kernels::cpu
