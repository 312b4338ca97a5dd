// CPU reference implementation of kernels/rope.h: a (S, hd/2) cos/sin table per call, then
// one rotation per pair. Each pair is read before it is written, so outputs may alias inputs.
// The arguments were checked by kernels/rope.cc.
#include "kernels/rope.h"

#include <cmath>
#include <vector>

namespace switchyard::kernels::cpu {

void RopeRotate(const Tensor& x, Tensor& y, float base, int64_t position_offset, float sign) {
  const int64_t nb = x.dim(0), s = x.dim(1), nh = x.dim(2), hd = x.dim(3), half = hd / 2;
  std::vector<float> cos_table(static_cast<size_t>(s * half)), sin_table(cos_table.size());
  for (int64_t t = 0; t < s; ++t) {
    const double pos = static_cast<double>(position_offset + t);
    for (int64_t i = 0; i < half; ++i) {
      const double theta = std::pow(static_cast<double>(base), -2.0 * i / static_cast<double>(hd));
      cos_table[t * half + i] = static_cast<float>(std::cos(pos * theta));
      sin_table[t * half + i] = sign * static_cast<float>(std::sin(pos * theta));
    }
  }
  const float* px = x.data<float>();
  float* py = y.data<float>();
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t t = 0; t < s; ++t) {
      const float* c = cos_table.data() + t * half;
      const float* sn = sin_table.data() + t * half;
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t base_index = ((b * s + t) * nh + h) * hd;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = px[base_index + i], x2 = px[base_index + i + half];
          py[base_index + i] = x1 * c[i] - x2 * sn[i];
          py[base_index + i + half] = x2 * c[i] + x1 * sn[i];
        }
      }
    }
  }
}

}  // namespace switchyard::kernels::cpu
