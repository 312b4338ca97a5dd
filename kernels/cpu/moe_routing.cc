// CPU reference implementation of kernels/moe_routing.h: the MoE router's loops, one token
// (or one assignment) at a time. Arguments are checked by kernels/moe_routing.cc. These are
// the numerics the CUDA kernels are measured against; keep them bit for bit.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/core/thread_pool.h"
#include "kernels/cpu/router_rows.h"
#include "kernels/cpu/rows.h"
#include "kernels/moe_routing.h"

namespace switchyard::kernels::cpu {

void RouterTopK(const Tensor& logits, const Tensor& bias_t, bool normalize, bool random_second,
                RngKey second_key, int64_t first_token, Tensor& probs, Tensor& indices,
                Tensor& gates, Tensor& keep) {
  // The softmax router without groups: kernels/cpu/moe_scoring.cc's loop (softmax rows, top-k
  // of probs + bias, the gates, GShard's second expert) serves both.
  RouterScoring softmax;
  softmax.normalize = normalize;
  Tensor no_scores;  // softmax: the scores are the probs
  cpu::RouterTopKScored(logits, bias_t, softmax, random_second, second_key, first_token, probs,
                        no_scores, indices, gates, keep);
}

void AddGateShare(const float* s, const int32_t* idx, const float* g, const float* dg, int64_t k,
                  bool normalize, double* ds) {
  if (normalize) {
    double sum_chosen = 0.0, dot = 0.0;
    for (int64_t j = 0; j < k; ++j) {
      sum_chosen += s[idx[j]];
      dot += static_cast<double>(dg[j]) * g[j];
    }
    for (int64_t j = 0; j < k; ++j) ds[idx[j]] += (dg[j] - dot) / sum_chosen;
  } else {
    for (int64_t j = 0; j < k; ++j) ds[idx[j]] += dg[j];
  }
}

void RouterBackwardLogits(const Tensor& probs, const Tensor& indices, const Tensor& gates,
                          const Tensor& dgates, const Tensor& dprobs,
                          const Tensor& dlogits_extra, bool normalize, Tensor& dlogits) {
  const int64_t T = probs.dim(0), E = probs.dim(1), k = indices.dim(1);
  const float* extra_p = dprobs.defined() ? dprobs.data<float>() : nullptr;
  const float* extra_l = dlogits_extra.defined() ? dlogits_extra.data<float>() : nullptr;
  const float* pp = probs.data<float>();
  const int32_t* ip = indices.data<int32_t>();
  const float* gp = gates.data<float>();
  const float* dgp = dgates.data<float>();
  float* dl = dlogits.data<float>();
  std::vector<double> dp(E);
  for (int64_t t = 0; t < T; ++t) {
    const float* p = pp + t * E;
    for (int64_t e = 0; e < E; ++e) dp[e] = extra_p ? extra_p[t * E + e] : 0.0;
    AddGateShare(p, ip + t * k, gp + t * k, dgp + t * k, k, normalize, dp.data());
    // Softmax: dl_e = p_e * (dp_e - sum_j p_j dp_j).
    double dot = 0.0;
    for (int64_t e = 0; e < E; ++e) dot += p[e] * dp[e];
    for (int64_t e = 0; e < E; ++e) {
      double v = p[e] * (dp[e] - dot);
      if (extra_l) v += extra_l[t * E + e];
      dl[t * E + e] = static_cast<float>(v);
    }
  }
}

void CountSlotAssignments(const Tensor& indices, const Tensor& keep, int64_t num_experts,
                          Tensor& counts) {
  const int64_t T = indices.dim(0), k = indices.dim(1), E = num_experts;
  const int32_t* ip = indices.data<int32_t>();
  const uint8_t* kp = keep.defined() ? keep.data<uint8_t>() : nullptr;
  int64_t* c = counts.data<int64_t>();
  std::fill(c, c + k * E + 1, int64_t{0});
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ip[t * k + j];
      if (e < 0 || e >= E) {
        ++c[k * E];
      } else if (kp == nullptr || kp[t * k + j]) {
        ++c[j * E + e];
      }
    }
  }
}

void AddLabelAssignmentCounts(const Tensor& indices, const Tensor& labels, int64_t num_labels,
                              int64_t num_experts, Tensor& counts) {
  const int64_t T = indices.dim(0), k = indices.dim(1), E = num_experts;
  const int32_t* ip = indices.data<int32_t>();
  const int32_t* lp = labels.data<int32_t>();
  double* c = counts.data<double>();
  for (int64_t t = 0; t < T; ++t) {
    if (lp[t] < 0 || lp[t] >= num_labels) continue;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ip[t * k + j];
      c[e < 0 || e >= E ? num_labels * E : lp[t] * E + e] += 1.0;
    }
  }
}

void ProbColumnSums(const Tensor& probs, Tensor& sums) {
  const int64_t T = probs.dim(0), E = probs.dim(1);
  std::vector<double> acc(E, 0.0);
  const float* p = probs.data<float>();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) acc[e] += p[t * E + e];
  }
  float* s = sums.data<float>();
  for (int64_t e = 0; e < E; ++e) s[e] = static_cast<float>(acc[e]);
}

void AddColumnConstants(Tensor& x, std::span<const float> column, Write write) {
  const int64_t T = x.dim(0), E = x.dim(1);
  float* dp = x.data<float>();
  const bool set = write == Write::kSet;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) dp[t * E + e] = (set ? 0.0f : dp[t * E + e]) + column[e];
  }
}

float RouterZLoss(const Tensor& logits, float coef, float grad, int64_t group_tokens,
                  Tensor* dlogits, Write write) {
  const int64_t T = logits.dim(0), E = logits.dim(1);
  const int64_t n = group_tokens > 0 ? group_tokens : T;
  float* dl = dlogits != nullptr ? dlogits->data<float>() : nullptr;
  if (T == 0) return 0.0f;
  const float* lp = logits.data<float>();
  std::vector<double> lse_sq(static_cast<size_t>(T));  // per token, summed in order below
  ParallelFor(T, RowsPerChunk(E, 2048), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* l = lp + t * E;
      const double m = *std::max_element(l, l + E);
      double sum = 0.0;
      for (int64_t e = 0; e < E; ++e) sum += std::exp(l[e] - m);
      const double lse = m + std::log(sum);
      lse_sq[t] = lse * lse;
      if (dl != nullptr) {
        const double scale = static_cast<double>(grad) * coef * 2.0 * lse / n;
        for (int64_t e = 0; e < E; ++e) {
          const float base = write == Write::kSet ? 0.0f : dl[t * E + e];
          dl[t * E + e] = base + static_cast<float>(scale * std::exp(l[e] - m) / sum);
        }
      }
    }
  });
  double total = 0.0;
  for (double v : lse_sq) total += v;
  return static_cast<float>(coef * total / n);
}

void UpdateExpertBias(Tensor& bias, std::span<const int64_t> counts, float rate) {
  const int64_t E = bias.numel();
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  float* b = bias.data<float>();
  for (int64_t i = 0; i < E; ++i) {
    // sign(mean - c_i) = sign(total - E * c_i), exactly.
    const int64_t diff = total - E * counts[i];
    if (diff > 0) b[i] += rate;
    if (diff < 0) b[i] -= rate;
  }
}

AdmissionCounts AdmitAssignments(const Tensor& indices, const Tensor& gates, const Tensor& keep,
                                 int64_t num_experts, int64_t capacity, AdmissionOrder order,
                                 std::span<const int64_t> offsets, Tensor& kept_t,
                                 Tensor& position) {
  const int64_t T = indices.dim(0), k = indices.dim(1), E = num_experts;
  const int32_t* ip = indices.data<int32_t>();
  const uint8_t* kp = keep.defined() ? keep.data<uint8_t>() : nullptr;
  const bool limited = capacity >= 0;

  AdmissionCounts a;
  a.before.assign(E, 0);
  a.after.assign(E, 0);
  uint8_t* kept = kept_t.data<uint8_t>();
  int64_t* pos = position.data<int64_t>();
  std::fill(kept, kept + T * k, uint8_t{0});
  std::fill(pos, pos + T * k, int64_t{-1});

  // Visits the competing assignments (t, j) in priority order; `rank` is the assignment's
  // rank among its expert's competitors, offsets included.
  auto admit = [&](int64_t t, int64_t j, int64_t rank) {
    const int32_t e = ip[t * k + j];
    if (!limited || rank < capacity) {
      kept[t * k + j] = 1;
      pos[t * k + j] = rank;
      ++a.after[e];
    }
  };
  auto competes = [&](int64_t t, int64_t j) {
    const int32_t e = ip[t * k + j];
    SY_CHECK(e >= 0 && e < E) << "expert index " << e << " outside [0, " << E << ")";
    if (kp != nullptr && !kp[t * k + j]) {
      ++a.removed;
      return false;
    }
    return true;
  };

  if (order == AdmissionOrder::kPosition) {
    // A single piece is its own whole group: offsets[j][e] = its slot-j' < j assignments to e.
    std::vector<int64_t> own;
    if (offsets.empty()) {
      Tensor counts = Tensor::Empty({k * E + 1}, DType::kI64);
      CountSlotAssignments(indices, keep, E, counts);
      const int64_t* c = counts.data<int64_t>();
      SY_CHECK_EQ(c[k * E], 0) << "expert indices outside [0, " << E << ")";
      own.assign(k * E, 0);
      for (int64_t j = 1; j < k; ++j) {
        for (int64_t e = 0; e < E; ++e) own[j * E + e] = own[(j - 1) * E + e] + c[(j - 1) * E + e];
      }
      offsets = own;
    }
    std::vector<int64_t> in_slot(E);  // this piece's slot-j assignments to e so far
    for (int64_t j = 0; j < k; ++j) {
      std::fill(in_slot.begin(), in_slot.end(), 0);
      for (int64_t t = 0; t < T; ++t) {
        if (!competes(t, j)) continue;
        const int32_t e = ip[t * k + j];
        admit(t, j, offsets[j * E + e] + in_slot[e]);
        ++in_slot[e];
        ++a.before[e];
      }
    }
  } else {
    const float* gp = gates.data<float>();
    std::vector<int64_t> flat;  // t * k + j, which sorts by token then slot
    flat.reserve(T * k);
    for (int64_t i = 0; i < T * k; ++i) {
      if (competes(i / k, i % k)) flat.push_back(i);
    }
    std::stable_sort(flat.begin(), flat.end(),
                     [&](int64_t x, int64_t y) { return gp[x] > gp[y]; });
    for (int64_t i : flat) {
      const int32_t e = ip[i];
      admit(i / k, i % k, a.before[e]);
      ++a.before[e];
    }
  }
  return a;
}

}  // namespace switchyard::kernels::cpu
