// CPU reference of kernels/vocab_parallel.h: plain loops in row, then column order, the f32
// arithmetic of kernels/cpu/cross_entropy.cc (exp in double, summed in double, rounded to
// f32), and the embedding backward in position order as kernels/cpu/embedding.cc adds.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/vocab_parallel.h"

namespace switchyard::kernels::cpu {
namespace {

// The local column / table row of global id `id`, or -1 when this shard does not hold it.
int64_t LocalIndex(int32_t id, int64_t start, int64_t count) {
  const int64_t l = static_cast<int64_t>(id) - start;
  return l >= 0 && l < count ? l : -1;
}

}  // namespace

void VocabShardRowMax(const Tensor& logits, int64_t valid_cols, Tensor& out) {
  const int64_t n = logits.dim(0), c = logits.dim(1);
  const float* x = logits.data<float>();
  float* m = out.data<float>();
  for (int64_t r = 0; r < n; ++r) {
    float best = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < valid_cols; ++j) best = std::max(best, x[r * c + j]);
    m[r] = best;
  }
}

void VocabShardExpSum(const Tensor& logits, int64_t valid_cols, const Tensor& row_max,
                      Tensor& out) {
  const int64_t n = logits.dim(0), c = logits.dim(1);
  const float* x = logits.data<float>();
  const float* m = row_max.data<float>();
  float* s = out.data<float>();
  for (int64_t r = 0; r < n; ++r) {
    double sum = 0.0;
    for (int64_t j = 0; j < valid_cols; ++j) {
      sum += std::exp(static_cast<double>(x[r * c + j] - m[r]));
    }
    s[r] = static_cast<float>(sum);
  }
}

void VocabShardTargetLogit(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid_cols, int32_t ignore_index, Tensor& out) {
  const int64_t n = logits.dim(0), c = logits.dim(1);
  const float* x = logits.data<float>();
  const int32_t* t = targets.data<int32_t>();
  float* o = out.data<float>();
  for (int64_t r = 0; r < n; ++r) {
    const int64_t l = t[r] == ignore_index ? -1 : LocalIndex(t[r], vocab_start, valid_cols);
    o[r] = l >= 0 ? x[r * c + l] : 0.0f;
  }
}

void VocabShardSoftmaxGrad(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid_cols, const Tensor& row_max, const Tensor& exp_sum,
                           float grad_scale, int32_t ignore_index, Tensor& dlogits) {
  const int64_t n = logits.dim(0), c = logits.dim(1);
  const float* x = logits.data<float>();
  const int32_t* t = targets.data<int32_t>();
  const float* m = row_max.data<float>();
  const float* s = exp_sum.data<float>();
  float* d = dlogits.data<float>();
  for (int64_t r = 0; r < n; ++r) {
    const bool counted = t[r] != ignore_index;
    const int64_t target = counted ? LocalIndex(t[r], vocab_start, valid_cols) : -1;
    for (int64_t j = 0; j < c; ++j) {
      float g = 0.0f;
      if (counted && j < valid_cols) {
        const float p =
            static_cast<float>(std::exp(static_cast<double>(x[r * c + j] - m[r]))) / s[r];
        g = grad_scale * (p - (j == target ? 1.0f : 0.0f));
      }
      d[r * c + j] = g;  // after reading x[r * c + j]: dlogits may alias logits
    }
  }
}

void VocabShardEmbeddingForward(const Tensor& ids, const Tensor& table_shard,
                                int64_t vocab_start, Tensor& out) {
  const int64_t n = ids.numel(), rows = table_shard.dim(0), d = table_shard.dim(1);
  const int32_t* p = ids.data<int32_t>();
  const float* table = table_shard.data<float>();
  float* o = out.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t l = LocalIndex(p[i], vocab_start, rows);
    if (l >= 0) {
      std::memcpy(o + i * d, table + l * d, static_cast<size_t>(d) * sizeof(float));
    } else {
      std::fill(o + i * d, o + (i + 1) * d, 0.0f);
    }
  }
}

void VocabShardEmbeddingBackward(const Tensor& ids, const Tensor& dout, int64_t vocab_start,
                                 Tensor& dtable_shard) {
  const int64_t n = ids.numel(), rows = dtable_shard.dim(0), d = dtable_shard.dim(1);
  const int32_t* p = ids.data<int32_t>();
  float* dtable = dtable_shard.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t l = LocalIndex(p[i], vocab_start, rows);
    if (l < 0) continue;
    const float* src = dout.data<float>() + i * d;
    float* dst = dtable + l * d;
    for (int64_t j = 0; j < d; ++j) dst[j] += src[j];
  }
}


}  // namespace switchyard::kernels::cpu
