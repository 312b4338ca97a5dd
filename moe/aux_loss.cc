#include "moe/aux_loss.h"

#include <algorithm>
#include <cmath>

#include "moe/router.h"

namespace switchyard::moe {
namespace {

void CheckCpu(const Tensor& t, DType dtype, const char* what) {
  SY_CHECK(t.defined()) << what << " is undefined";
  SY_CHECK(t.device().is_cpu()) << what << " on " << t.device()
                                << ": the CUDA aux losses land with the CUDA backend";
  SY_CHECK_EQ(t.dtype(), dtype) << what;
  SY_CHECK_EQ(t.ndim(), 2) << what << " " << ShapeString(t.shape());
}

}  // namespace

LoadBalanceSums LoadBalanceSumsOf(const Tensor& probs, const Tensor& indices) {
  CheckCpu(probs, DType::kF32, "aux probs");
  CheckCpu(indices, DType::kI32, "aux indices");
  const int64_t T = probs.dim(0), E = probs.dim(1);
  SY_CHECK_EQ(indices.dim(0), T) << "aux indices";
  LoadBalanceSums sums;
  sums.tokens = T;
  sums.assignments.assign(E, 0);
  CountAssignments(indices, sums.assignments);
  std::vector<double> prob_sums(E, 0.0);
  const float* p = probs.data<float>();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) prob_sums[e] += p[t * E + e];
  }
  sums.prob_sums.assign(prob_sums.begin(), prob_sums.end());
  return sums;
}

float LoadBalancingLossFromSums(const LoadBalanceSums& group, int64_t top_k, float coef) {
  const int64_t E = static_cast<int64_t>(group.assignments.size());
  SY_CHECK_EQ(static_cast<int64_t>(group.prob_sums.size()), E);
  if (group.tokens == 0) return 0.0f;
  // E * sum_i (c_i / (T k)) (s_i / T).
  double dot = 0.0;
  for (int64_t e = 0; e < E; ++e)
    dot += static_cast<double>(group.assignments[e]) * group.prob_sums[e];
  const double T = static_cast<double>(group.tokens);
  return static_cast<float>(coef * (E * dot / (T * top_k * T)));
}

void LoadBalancingLossBackward(const LoadBalanceSums& group, int64_t top_k, float coef, float grad,
                               Tensor& dprobs) {
  CheckCpu(dprobs, DType::kF32, "aux dprobs");
  const int64_t E = static_cast<int64_t>(group.assignments.size());
  SY_CHECK_EQ(dprobs.dim(1), E) << "aux dprobs";
  if (group.tokens == 0) return;
  const double T = static_cast<double>(group.tokens);
  std::vector<float> col(E);
  for (int64_t e = 0; e < E; ++e) {
    const double f = group.assignments[e] / (T * top_k);
    col[e] = static_cast<float>(static_cast<double>(grad) * coef * E * f / T);
  }
  float* dp = dprobs.data<float>();
  for (int64_t t = 0; t < dprobs.dim(0); ++t) {
    for (int64_t e = 0; e < E; ++e) dp[t * E + e] += col[e];
  }
}

float LoadBalancingLoss(const Tensor& probs, const Tensor& indices, float coef, float grad,
                        Tensor* dprobs) {
  const LoadBalanceSums sums = LoadBalanceSumsOf(probs, indices);
  const int64_t k = indices.dim(1);
  if (dprobs != nullptr) {
    SY_CHECK_EQ(dprobs->dim(0), probs.dim(0)) << "aux dprobs";
    LoadBalancingLossBackward(sums, k, coef, grad, *dprobs);
  }
  return LoadBalancingLossFromSums(sums, k, coef);
}

float ZLoss(const Tensor& logits, float coef, float grad, Tensor* dlogits, int64_t group_tokens) {
  CheckCpu(logits, DType::kF32, "z-loss logits");
  const int64_t T = logits.dim(0), E = logits.dim(1);
  const int64_t n = group_tokens > 0 ? group_tokens : T;
  SY_CHECK_GE(n, T) << "z-loss group_tokens";
  float* dl = nullptr;
  if (dlogits != nullptr) {
    CheckCpu(*dlogits, DType::kF32, "z-loss dlogits");
    SY_CHECK(dlogits->dim(0) == T && dlogits->dim(1) == E) << "z-loss dlogits";
    dl = dlogits->data<float>();
  }
  if (T == 0) return 0.0f;
  const float* lp = logits.data<float>();
  double total = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    const float* l = lp + t * E;
    const double m = *std::max_element(l, l + E);
    double sum = 0.0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(l[e] - m);
    const double lse = m + std::log(sum);
    total += lse * lse;
    if (dl != nullptr) {
      const double scale = static_cast<double>(grad) * coef * 2.0 * lse / n;
      for (int64_t e = 0; e < E; ++e) {
        dl[t * E + e] += static_cast<float>(scale * std::exp(l[e] - m) / sum);
      }
    }
  }
  return static_cast<float>(coef * total / n);
}

}  // namespace switchyard::moe
