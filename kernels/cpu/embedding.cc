// CPU reference implementation of kernels/embedding.h: row copies and row adds in id order
// (the order fixes the f32 summation order of repeated ids).
#include "kernels/embedding.h"

#include <cstring>

#include "kernels/cpu/cpu_check.h"

namespace switchyard::kernels {
namespace {

// Checks ids (N) i32, table (V, d) and rows (N, d) f32; returns N.
int64_t CheckLookup(const Tensor& ids, const Tensor& table, const Tensor& rows, const char* op,
                    const char* table_name, const char* rows_name) {
  cpu::CheckCpu(ids, DType::kI32, op, "ids");
  cpu::CheckCpuF32(table, op, table_name);
  cpu::CheckCpuF32(rows, op, rows_name);
  SY_CHECK_EQ(table.ndim(), 2) << op << ": " << table_name << " is (V, d), got "
                               << ShapeString(table.shape());
  const int64_t d = table.dim(1), n = ids.numel();
  SY_CHECK(rows.ndim() >= 1 && rows.dim(-1) == d && rows.numel() == n * d)
      << op << ": " << rows_name << " " << ShapeString(rows.shape()) << " for " << n
      << " ids and rows of " << d;
  const int32_t* p = ids.data<int32_t>();
  const int64_t v = table.dim(0);
  for (int64_t i = 0; i < n; ++i) {
    SY_CHECK(p[i] >= 0 && p[i] < v)
        << op << ": id " << p[i] << " at " << i << " is outside the table of " << v << " rows";
  }
  return n;
}

// Checks x (B, S, d) against wpe (S_max, d) at the offset.
void CheckPositions(const Tensor& x, const Tensor& wpe, int64_t offset, const char* op) {
  cpu::CheckCpuF32(x, op, "x");
  cpu::CheckCpuF32(wpe, op, "wpe");
  SY_CHECK(x.ndim() == 3 && wpe.ndim() == 2 && x.dim(2) == wpe.dim(1))
      << op << ": x " << ShapeString(x.shape()) << " is (B, S, d), wpe " << ShapeString(wpe.shape())
      << " is (S_max, d)";
  SY_CHECK(offset >= 0 && offset + x.dim(1) <= wpe.dim(0))
      << op << ": positions [" << offset << ", " << offset + x.dim(1)
      << ") exceed S_max=" << wpe.dim(0);
}

}  // namespace

void EmbeddingForward(const Tensor& ids, const Tensor& table, Tensor& out, DeviceContext* ctx) {
  const int64_t n = CheckLookup(ids, table, out, "EmbeddingForward", "table", "out");
  const int64_t d = table.dim(1);
  const int32_t* p = ids.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(out.data<float>() + i * d, table.data<float>() + p[i] * d,
                static_cast<size_t>(d) * sizeof(float));
  }
}

void EmbeddingBackward(const Tensor& ids, const Tensor& dout, Tensor& dtable, DeviceContext* ctx) {
  const int64_t n = CheckLookup(ids, dtable, dout, "EmbeddingBackward", "dtable", "dout");
  const int64_t d = dtable.dim(1);
  const int32_t* p = ids.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    const float* src = dout.data<float>() + i * d;
    float* dst = dtable.data<float>() + p[i] * d;
    for (int64_t j = 0; j < d; ++j) dst[j] += src[j];
  }
}

void AddPositionEmbedding(Tensor& x, const Tensor& wpe, int64_t position_offset,
                          DeviceContext* ctx) {
  CheckPositions(x, wpe, position_offset, "AddPositionEmbedding");
  const int64_t nb = x.dim(0), s = x.dim(1), d = x.dim(2);
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t t = 0; t < s; ++t) {
      float* dst = x.data<float>() + (b * s + t) * d;
      const float* src = wpe.data<float>() + (position_offset + t) * d;
      for (int64_t j = 0; j < d; ++j) dst[j] += src[j];
    }
  }
}

void PositionEmbeddingBackward(const Tensor& dx, Tensor& dwpe, int64_t position_offset,
                               DeviceContext* ctx) {
  CheckPositions(dx, dwpe, position_offset, "PositionEmbeddingBackward");
  const int64_t nb = dx.dim(0), s = dx.dim(1), d = dx.dim(2);
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t t = 0; t < s; ++t) {
      const float* src = dx.data<float>() + (b * s + t) * d;
      float* dst = dwpe.data<float>() + (position_offset + t) * d;
      for (int64_t j = 0; j < d; ++j) dst[j] += src[j];
    }
  }
}

}  // namespace switchyard::kernels
