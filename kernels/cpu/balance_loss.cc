// CPU implementation of kernels/balance_loss.h: moe/aux_loss.cc's host expressions on the
// sums as they lie in (host) memory.
#include "kernels/balance_loss.h"

#include <vector>

namespace switchyard::kernels::cpu {
namespace {

// a_e = sum_j counts[j E + e].
std::vector<int64_t> Assignments(const Tensor& counts, int64_t e, int64_t k) {
  const int64_t* c = counts.data<int64_t>();
  std::vector<int64_t> a(e, 0);
  for (int64_t j = 0; j < k; ++j) {
    for (int64_t i = 0; i < e; ++i) a[i] += c[j * e + i];
  }
  return a;
}

}  // namespace

void BalanceValuesInto(const Tensor& counts, const Tensor& prob_sums, int64_t tokens,
                       int64_t top_k, float coef, Tensor& values) {
  const int64_t E = prob_sums.numel();
  const std::vector<int64_t> a = Assignments(counts, E, top_k);
  const float* s = prob_sums.data<float>();
  double* out = values.data<double>();
  float aux = 0.0f;
  if (tokens != 0) {
    double dot = 0.0;
    for (int64_t e = 0; e < E; ++e) dot += static_cast<double>(a[e]) * s[e];
    const double T = static_cast<double>(tokens);
    aux = static_cast<float>(coef * (E * dot / (T * top_k * T)));
  }
  out[0] = aux;
  for (int64_t e = 0; e < E; ++e) out[1 + e] = static_cast<double>(a[e]);
  out[E + 1] = static_cast<double>(counts.data<int64_t>()[top_k * E]);
}

void AddBalanceColumn(Tensor& dprobs, const Tensor& counts, int64_t tokens, int64_t top_k,
                      float coef, float grad) {
  if (tokens == 0) return;
  const int64_t R = dprobs.dim(0), E = dprobs.dim(1);
  const std::vector<int64_t> a = Assignments(counts, E, top_k);
  const double T = static_cast<double>(tokens);
  std::vector<float> col(E);
  for (int64_t e = 0; e < E; ++e) {
    const double f = a[e] / (T * top_k);
    col[e] = static_cast<float>(static_cast<double>(grad) * coef * E * f / T);
  }
  float* dp = dprobs.data<float>();
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t e = 0; e < E; ++e) dp[r * E + e] += col[e];
  }
}

}  // namespace switchyard::kernels::cpu
