// Vectorised loops over one row of f32 values that several CPU kernels share (the softmax,
// the cross-entropy, attention). Each is compiled for AVX-512, AVX2 and plain x86-64
// (SY_VECTOR_CLONES). Sums are kept in 16 f32 lanes and finished in double, so a row's
// result does not depend on anything but the row.
#pragma once

#include <cstdint>

namespace switchyard::kernels::cpu {

// Rows of `width` elements per chunk handed to another thread (ParallelFor's min_chunk):
// about `elements` elements, at least one row.
inline int64_t RowsPerChunk(int64_t width, int64_t elements = 16384) {
  return width >= elements ? 1 : elements / (width > 0 ? width : 1);
}

// max over x[0, n), n >= 1.
float RowMax(const float* x, int64_t n);
// e[j] = exp(x[j] - shift) for j < n (e may be x), and the sum of the e[j].
double ExpShiftRow(const float* x, float shift, float* e, int64_t n);
// x[j] *= scale.
void ScaleRow(float* x, float scale, int64_t n);
// sum of a[j] * b[j].
double DotRow(const float* a, const float* b, int64_t n);

}  // namespace switchyard::kernels::cpu
