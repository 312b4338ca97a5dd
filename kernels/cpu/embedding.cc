// CPU reference implementation of kernels/embedding.h: row copies and row adds in id order
// (the order fixes the f32 summation order of repeated ids). Shapes were checked by
// kernels/embedding.cc; the ids are checked against the table here.
#include "kernels/embedding.h"

#include <cstring>

#include "engine/core/check.h"

namespace switchyard::kernels::cpu {
namespace {

// Every id in [0, v); a fatal check naming the first that is not.
void CheckIds(const Tensor& ids, int64_t v, const char* op) {
  const int32_t* p = ids.data<int32_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    SY_CHECK(p[i] >= 0 && p[i] < v)
        << op << ": id " << p[i] << " at " << i << " is outside the table of " << v << " rows";
  }
}

}  // namespace

void EmbeddingForward(const Tensor& ids, const Tensor& table, Tensor& out) {
  CheckIds(ids, table.dim(0), "EmbeddingForward");
  const int64_t n = ids.numel(), d = table.dim(1);
  const int32_t* p = ids.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(out.data<float>() + i * d, table.data<float>() + p[i] * d,
                static_cast<size_t>(d) * sizeof(float));
  }
}

void EmbeddingBackward(const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  CheckIds(ids, dtable.dim(0), "EmbeddingBackward");
  const int64_t n = ids.numel(), d = dtable.dim(1);
  const int32_t* p = ids.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    const float* src = dout.data<float>() + i * d;
    float* dst = dtable.data<float>() + p[i] * d;
    for (int64_t j = 0; j < d; ++j) dst[j] += src[j];
  }
}

void AddPositionEmbedding(Tensor& x, const Tensor& wpe, int64_t position_offset) {
  const int64_t nb = x.dim(0), s = x.dim(1), d = x.dim(2);
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t t = 0; t < s; ++t) {
      float* dst = x.data<float>() + (b * s + t) * d;
      const float* src = wpe.data<float>() + (position_offset + t) * d;
      for (int64_t j = 0; j < d; ++j) dst[j] += src[j];
    }
  }
}

void PositionEmbeddingBackward(const Tensor& dx, Tensor& dwpe, int64_t position_offset) {
  const int64_t nb = dx.dim(0), s = dx.dim(1), d = dx.dim(2);
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t t = 0; t < s; ++t) {
      const float* src = dx.data<float>() + (b * s + t) * d;
      float* dst = dwpe.data<float>() + (position_offset + t) * d;
      for (int64_t j = 0; j < d; ++j) dst[j] += src[j];
    }
  }
}

}  // namespace switchyard::kernels::cpu
