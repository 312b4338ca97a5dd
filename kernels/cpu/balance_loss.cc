// CPU implementation of kernels/balance_loss.h: moe/aux_loss.cc's host expressions on the
// sums as they lie in (host) memory.
#include "kernels/balance_loss.h"

#include <algorithm>
#include <vector>

#include "kernels/moe_routing.h"

namespace switchyard::kernels {

float BalanceAuxOf(std::span<const int64_t> assignments, const float* prob_sums, int64_t tokens,
                   int64_t top_k, float coef) {
  if (tokens == 0) return 0.0f;
  const int64_t E = static_cast<int64_t>(assignments.size());
  double dot = 0.0;
  for (int64_t e = 0; e < E; ++e) dot += static_cast<double>(assignments[e]) * prob_sums[e];
  const double T = static_cast<double>(tokens);
  return static_cast<float>(coef * (E * dot / (T * top_k * T)));
}

std::vector<float> BalanceColumnOf(std::span<const int64_t> assignments, int64_t tokens,
                                   int64_t top_k, float coef, float grad) {
  const int64_t E = static_cast<int64_t>(assignments.size());
  std::vector<float> col(E, 0.0f);
  if (tokens == 0) return col;
  const double T = static_cast<double>(tokens);
  for (int64_t e = 0; e < E; ++e) {
    const double f = assignments[e] / (T * top_k);
    col[e] = static_cast<float>(static_cast<double>(grad) * coef * E * f / T);
  }
  return col;
}

float GlobalBalanceAuxOf(std::span<const float> load, const float* prob_sums, int64_t tokens,
                         float coef) {
  if (tokens == 0) return 0.0f;
  const int64_t E = static_cast<int64_t>(load.size());
  double dot = 0.0;
  for (int64_t e = 0; e < E; ++e) dot += static_cast<double>(load[e]) * prob_sums[e];
  return static_cast<float>(coef * (E * dot / static_cast<double>(tokens)));
}

std::vector<float> GlobalBalanceColumnOf(std::span<const float> load, int64_t tokens, float coef,
                                         float grad) {
  const int64_t E = static_cast<int64_t>(load.size());
  std::vector<float> col(E, 0.0f);
  for (int64_t e = 0; e < E && tokens > 0; ++e) {
    col[e] = static_cast<float>(static_cast<double>(grad) * coef * E * load[e] /
                                static_cast<double>(tokens));
  }
  return col;
}

namespace cpu {
namespace {

// a_e = sum_j counts[j E + e].
std::vector<int64_t> Assignments(const int64_t* c, int64_t e, int64_t k) {
  std::vector<int64_t> a(e, 0);
  for (int64_t j = 0; j < k; ++j) {
    for (int64_t i = 0; i < e; ++i) a[i] += c[j * e + i];
  }
  return a;
}

// rows [r0, r1) of x (, E) += col (kSet: +0 + col).
void WriteColumn(float* x, int64_t r0, int64_t r1, const std::vector<float>& col, Write write) {
  const int64_t E = static_cast<int64_t>(col.size());
  const bool set = write == Write::kSet;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t e = 0; e < E; ++e) x[r * E + e] = (set ? 0.0f : x[r * E + e]) + col[e];
  }
}

}  // namespace

void BalanceValuesInto(const Tensor& counts, const Tensor& prob_sums, int64_t tokens,
                       int64_t top_k, float coef, Tensor& values) {
  const int64_t E = prob_sums.numel();
  const std::vector<int64_t> a = Assignments(counts.data<int64_t>(), E, top_k);
  double* out = values.data<double>();
  out[0] = BalanceAuxOf(a, prob_sums.data<float>(), tokens, top_k, coef);
  for (int64_t e = 0; e < E; ++e) out[1 + e] = static_cast<double>(a[e]);
  out[E + 1] = static_cast<double>(counts.data<int64_t>()[top_k * E]);
}

void AddBalanceColumn(Tensor& dprobs, const Tensor& counts, int64_t tokens, int64_t top_k,
                      float coef, float grad, Write write) {
  if (tokens == 0 && write == Write::kAdd) return;
  const int64_t E = dprobs.dim(1);
  WriteColumn(dprobs.data<float>(), 0, dprobs.dim(0),
              BalanceColumnOf(Assignments(counts.data<int64_t>(), E, top_k), tokens, top_k, coef,
                              grad),
              write);
}

void PartBalanceSums(const Tensor& probs, const Tensor& indices, int64_t part_tokens,
                     Tensor& counts, Tensor& prob_sums) {
  const int64_t T = probs.dim(0), E = probs.dim(1), P = counts.dim(0), width = counts.dim(1);
  for (int64_t p = 0; p < P; ++p) {
    const int64_t r0 = p * part_tokens, r1 = std::min(T, r0 + part_tokens);
    Tensor c = counts.View({width}, p * width), s = prob_sums.View({E}, p * E);
    CountSlotAssignments(indices.Slice(r0, r1), Tensor(), E, c);
    ProbColumnSums(probs.Slice(r0, r1), s);
  }
}

void PartBalanceValueInto(const Tensor& counts, const Tensor& prob_sums, int64_t tokens,
                          int64_t part_tokens, int64_t top_k, float coef, Tensor& value) {
  const int64_t P = counts.dim(0), width = counts.dim(1), E = prob_sums.dim(1);
  double sum = 0.0;
  for (int64_t p = 0; p < P; ++p) {
    const int64_t rows = std::min(tokens, (p + 1) * part_tokens) - p * part_tokens;
    sum += BalanceAuxOf(Assignments(counts.data<int64_t>() + p * width, E, top_k),
                        prob_sums.data<float>() + p * E, rows, top_k, coef);
  }
  value.data<double>()[0] = P == 0 ? 0.0 : static_cast<float>(sum / static_cast<double>(P));
}

void AddPartBalanceColumns(Tensor& dprobs, const Tensor& counts, int64_t part_tokens,
                           int64_t top_k, float coef, float grad, Write write) {
  const int64_t T = dprobs.dim(0), E = dprobs.dim(1), P = counts.dim(0), width = counts.dim(1);
  const float part_grad = static_cast<float>(static_cast<double>(grad) / P);
  for (int64_t p = 0; p < P; ++p) {
    const int64_t r0 = p * part_tokens, r1 = std::min(T, r0 + part_tokens);
    WriteColumn(dprobs.data<float>(), r0, r1,
                BalanceColumnOf(Assignments(counts.data<int64_t>() + p * width, E, top_k),
                                r1 - r0, top_k, coef, part_grad),
                write);
  }
}

void GlobalBalanceValueInto(const Tensor& load, const Tensor& prob_sums, int64_t tokens,
                            float coef, Tensor& value) {
  value.data<double>()[0] = GlobalBalanceAuxOf(
      std::span<const float>(load.data<float>(), load.numel()), prob_sums.data<float>(), tokens,
      coef);
}

void AddGlobalBalanceColumn(Tensor& dprobs, const Tensor& load, int64_t tokens, float coef,
                            float grad, Write write) {
  if (tokens == 0 && write == Write::kAdd) return;
  WriteColumn(dprobs.data<float>(), 0, dprobs.dim(0),
              GlobalBalanceColumnOf(std::span<const float>(load.data<float>(), load.numel()),
                                    tokens, coef, grad),
              write);
}

}  // namespace cpu
}  // namespace switchyard::kernels
