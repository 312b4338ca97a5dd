// CPU reference of kernels/vocab_parallel.h: plain loops, f32 arithmetic as
// kernels/cpu/cross_entropy.cc writes it (exp in double, rounded to f32).
#include <cmath>
#include <limits>

#include "kernels/vocab_parallel.h"

namespace switchyard::kernels::cpu {

void VocabShardLocalIds(const Tensor& ids, int64_t vocab_start, int64_t valid, int32_t trash,
                        Tensor& local) {
  const int32_t* in = ids.data<int32_t>();
  int32_t* out = local.data<int32_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t l = static_cast<int64_t>(in[i]) - vocab_start;
    out[i] = l >= 0 && l < valid ? static_cast<int32_t>(l) : trash;
  }
}

void VocabShardRowMax(const Tensor& logits, int64_t valid, Tensor& out) {
  const int64_t n = logits.dim(0), c = logits.dim(1);
  const float* x = logits.data<float>();
  float* m = out.data<float>();
  for (int64_t r = 0; r < n; ++r) {
    float best = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < valid; ++j) best = std::max(best, x[r * c + j]);
    m[r] = best;
  }
}

void VocabShardExpSum(const Tensor& logits, int64_t valid, const Tensor& row_max, Tensor& out) {
  const int64_t n = logits.dim(0), c = logits.dim(1);
  const float* x = logits.data<float>();
  const float* m = row_max.data<float>();
  float* s = out.data<float>();
  for (int64_t r = 0; r < n; ++r) {
    double sum = 0;
    for (int64_t j = 0; j < valid; ++j) sum += std::exp(static_cast<double>(x[r * c + j] - m[r]));
    s[r] = static_cast<float>(sum);
  }
}

void VocabShardTargetLogit(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid, Tensor& out) {
  const int64_t n = logits.dim(0), c = logits.dim(1);
  const float* x = logits.data<float>();
  const int32_t* t = targets.data<int32_t>();
  float* o = out.data<float>();
  for (int64_t r = 0; r < n; ++r) {
    const int64_t l = static_cast<int64_t>(t[r]) - vocab_start;
    o[r] = l >= 0 && l < valid ? x[r * c + l] : 0.0f;
  }
}

void VocabShardSoftmaxGrad(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid, const Tensor& row_max, const Tensor& exp_sum,
                           float grad_scale, int32_t ignore_index, Tensor& dlogits) {
  const int64_t n = logits.dim(0), c = logits.dim(1);
  const float* x = logits.data<float>();
  const int32_t* t = targets.data<int32_t>();
  const float* m = row_max.data<float>();
  const float* s = exp_sum.data<float>();
  float* d = dlogits.data<float>();
  for (int64_t r = 0; r < n; ++r) {
    const bool counted = t[r] != ignore_index;
    const int64_t target = static_cast<int64_t>(t[r]) - vocab_start;
    for (int64_t j = 0; j < c; ++j) {
      float g = 0.0f;
      if (counted && j < valid) {
        const float p = static_cast<float>(std::exp(static_cast<double>(x[r * c + j] - m[r]))) / s[r];
        g = grad_scale * (p - (j == target ? 1.0f : 0.0f));
      }
      d[r * c + j] = g;  // after reading x[r * c + j]: dlogits may alias logits
    }
  }
}

}  // namespace switchyard::kernels::cpu
