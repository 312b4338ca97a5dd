// The row loops of kernels/cpu/rows.h.
#include "kernels/cpu/rows.h"

#include "kernels/cpu/vec_math.h"

namespace switchyard::kernels::cpu {
namespace {
constexpr int kRowLanes = 16;
}  // namespace

SY_VECTOR_CLONES float RowMax(const float* x, int64_t n) {
  float max = x[0];
  for (int64_t j = 1; j < n; ++j) max = x[j] > max ? x[j] : max;
  return max;
}

SY_VECTOR_CLONES double ExpShiftRow(const float* x, float shift, float* e, int64_t n) {
  float lane[kRowLanes] = {};
  int64_t j = 0;
  for (; j + kRowLanes <= n; j += kRowLanes) {
    for (int l = 0; l < kRowLanes; ++l) {
      const float y = VecExp(x[j + l] - shift);
      e[j + l] = y;
      lane[l] += y;
    }
  }
  double sum = 0.0;
  for (int l = 0; l < kRowLanes; ++l) sum += lane[l];
  for (; j < n; ++j) {
    const float y = VecExp(x[j] - shift);
    e[j] = y;
    sum += y;
  }
  return sum;
}

SY_VECTOR_CLONES void ScaleRow(float* x, float scale, int64_t n) {
  for (int64_t j = 0; j < n; ++j) x[j] *= scale;
}

SY_VECTOR_CLONES double DotRow(const float* a, const float* b, int64_t n) {
  float lane[kRowLanes] = {};
  int64_t j = 0;
  for (; j + kRowLanes <= n; j += kRowLanes) {
    for (int l = 0; l < kRowLanes; ++l) lane[l] += a[j + l] * b[j + l];
  }
  double sum = 0.0;
  for (int l = 0; l < kRowLanes; ++l) sum += lane[l];
  for (; j < n; ++j) sum += static_cast<double>(a[j]) * b[j];
  return sum;
}

}  // namespace switchyard::kernels::cpu
