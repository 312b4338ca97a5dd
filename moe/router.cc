#include "moe/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/core/status.h"
#include "kernels/gemm.h"
#include "kernels/random.h"

namespace switchyard::moe {
namespace {

void CheckCpu(const Tensor& t, DType dtype, const char* what) {
  SY_CHECK(t.defined()) << what << " is undefined";
  SY_CHECK(t.device().is_cpu()) << what << " on " << t.device()
                                << ": the CUDA router lands with the CUDA backend";
  SY_CHECK_EQ(t.dtype(), dtype) << what;
}

uint64_t RouterStream(const char* what, int64_t step, int64_t layer) {
  return StreamId(StrCat("layers.", layer, ".moe.router.", what, ".step.", step));
}

}  // namespace

RngKey JitterRngKey(uint64_t seed, int64_t step, int64_t layer) {
  return RngKey{seed, RouterStream("jitter", step, layer)};
}

RngKey SecondExpertRngKey(uint64_t seed, int64_t step, int64_t layer) {
  return RngKey{seed, RouterStream("second_expert", step, layer)};
}

RouterOutput RouterForward(const Tensor& h, const Tensor& wr, const Tensor& expert_bias,
                           const MoEConfig& config, bool training, const RouterRng& rng) {
  CheckCpu(h, DType::kF32, "router h");
  CheckCpu(wr, DType::kF32, "router Wr");
  SY_CHECK_EQ(h.ndim(), 2) << "router h " << ShapeString(h.shape());
  const int64_t T = h.dim(0), d = h.dim(1);
  const int64_t E = config.num_experts, k = config.top_k;
  SY_CHECK(wr.ndim() == 2 && wr.dim(0) == d && wr.dim(1) == E)
      << "router Wr " << ShapeString(wr.shape()) << " for d=" << d << ", E=" << E;
  SY_CHECK(k >= 1 && k <= E) << "top_k=" << k << ", E=" << E;
  const float* bias = nullptr;
  if (expert_bias.defined()) {
    CheckCpu(expert_bias, DType::kF32, "router expert bias");
    SY_CHECK_EQ(expert_bias.numel(), E) << "router expert bias";
    bias = expert_bias.data<float>();
  }

  RouterOutput out;
  // x = h * noise, noise element (first_token + t) * d + j.
  if (training && config.jitter_eps > 0.0f) {
    out.noise = Tensor::Empty({T, d}, DType::kF32);
    kernels::FillUniform(out.noise, JitterRngKey(rng.seed, rng.step, rng.layer),
                         rng.first_token * d, 1.0f - config.jitter_eps, 1.0f + config.jitter_eps);
    out.input = Tensor::Empty({T, d}, DType::kF32);
    const float* hp = h.data<float>();
    const float* np = out.noise.data<float>();
    float* xp = out.input.data<float>();
    for (int64_t i = 0; i < T * d; ++i) xp[i] = hp[i] * np[i];
  } else {
    out.input = h;
  }

  out.logits = Tensor::Zeros({T, E}, DType::kF32);
  if (T > 0 && d > 0) kernels::Gemm(out.input, false, wr, false, out.logits);

  out.probs = Tensor::Empty({T, E}, DType::kF32);
  out.indices = Tensor::Empty({T, k}, DType::kI32);
  out.gates = Tensor::Empty({T, k}, DType::kF32);
  out.keep = Tensor::Empty({T, k}, DType::kU8);
  const float* lp = out.logits.data<float>();
  float* pp = out.probs.data<float>();
  int32_t* ip = out.indices.data<int32_t>();
  float* gp = out.gates.data<float>();
  uint8_t* kp = out.keep.data<uint8_t>();
  const bool random_second = config.second_expert_policy == SecondExpertPolicy::kRandom;
  SY_CHECK(!random_second || k == 2) << "second_expert_policy=random needs top_k=2, got " << k;
  const RngKey second_key = SecondExpertRngKey(rng.seed, rng.step, rng.layer);

  std::vector<int32_t> order(E);
  std::vector<float> score(E);
  for (int64_t t = 0; t < T; ++t) {
    const float* l = lp + t * E;
    float* p = pp + t * E;
    // Softmax, max-subtracted, the sum accumulated in double.
    const float m = *std::max_element(l, l + E);
    double sum = 0.0;
    for (int64_t e = 0; e < E; ++e) {
      p[e] = std::exp(l[e] - m);
      sum += p[e];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t e = 0; e < E; ++e) p[e] *= inv;

    // Top-k of probs (+ bias); ties to the smaller expert index.
    for (int64_t e = 0; e < E; ++e) score[e] = bias ? p[e] + bias[e] : p[e];
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return score[a] > score[b] || (score[a] == score[b] && a < b);
    });
    int32_t* idx = ip + t * k;
    float* g = gp + t * k;
    float gate_sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      idx[j] = order[j];
      g[j] = p[order[j]];
      gate_sum += g[j];
      kp[t * k + j] = 1;
    }
    if (config.normalize_gates) {
      for (int64_t j = 0; j < k; ++j) g[j] /= gate_sum;
    }
    // GShard (arXiv 2006.16668, Algorithm 1): keep the second expert iff u < 2 * g2,
    // g2 = p2 / (p1 + p2) whether or not the gates themselves are normalised.
    if (random_second) {
      const float p1 = p[idx[0]], p2 = p[idx[1]];
      const float g2 = p2 / (p1 + p2);
      const float u = UniformAt(second_key, static_cast<uint64_t>(rng.first_token + t));
      kp[t * k + 1] = u < 2.0f * g2 ? 1 : 0;
    }
  }
  return out;
}

Tensor RouterBackward(const RouterOutput& out, const Tensor& wr, const MoEConfig& config,
                      const Tensor& dgates, const Tensor& dprobs, const Tensor& dlogits_extra,
                      Tensor& dh, Tensor& dwr) {
  const int64_t T = out.probs.dim(0), E = out.probs.dim(1), k = out.indices.dim(1);
  const int64_t d = out.input.dim(1);
  CheckCpu(dgates, DType::kF32, "router dgates");
  SY_CHECK(dgates.ndim() == 2 && dgates.dim(0) == T && dgates.dim(1) == k)
      << "router dgates " << ShapeString(dgates.shape());
  CheckCpu(dh, DType::kF32, "router dh");
  SY_CHECK(dh.ndim() == 2 && dh.dim(0) == T && dh.dim(1) == d) << "router dh";
  CheckCpu(dwr, DType::kF32, "router dWr");
  SY_CHECK(dwr.ndim() == 2 && dwr.dim(0) == d && dwr.dim(1) == E) << "router dWr";
  const float* extra_p = nullptr;
  if (dprobs.defined()) {
    CheckCpu(dprobs, DType::kF32, "router dprobs");
    SY_CHECK_EQ(dprobs.numel(), T * E) << "router dprobs";
    extra_p = dprobs.data<float>();
  }
  const float* extra_l = nullptr;
  if (dlogits_extra.defined()) {
    CheckCpu(dlogits_extra, DType::kF32, "router dlogits_extra");
    SY_CHECK_EQ(dlogits_extra.numel(), T * E) << "router dlogits_extra";
    extra_l = dlogits_extra.data<float>();
  }

  const float* pp = out.probs.data<float>();
  const int32_t* ip = out.indices.data<int32_t>();
  const float* gp = out.gates.data<float>();
  const float* dgp = dgates.data<float>();
  Tensor dlogits = Tensor::Empty({T, E}, DType::kF32);
  float* dl = dlogits.data<float>();
  std::vector<double> dp(E);
  for (int64_t t = 0; t < T; ++t) {
    const float* p = pp + t * E;
    for (int64_t e = 0; e < E; ++e) dp[e] = extra_p ? extra_p[t * E + e] : 0.0;
    // Gates -> probs.
    const int32_t* idx = ip + t * k;
    const float* dg = dgp + t * k;
    if (config.normalize_gates) {
      double sum_p = 0.0, dot = 0.0;
      for (int64_t j = 0; j < k; ++j) {
        sum_p += p[idx[j]];
        dot += static_cast<double>(dg[j]) * gp[t * k + j];
      }
      for (int64_t j = 0; j < k; ++j) dp[idx[j]] += (dg[j] - dot) / sum_p;
    } else {
      for (int64_t j = 0; j < k; ++j) dp[idx[j]] += dg[j];
    }
    // Softmax: dl_e = p_e * (dp_e - sum_j p_j dp_j).
    double dot = 0.0;
    for (int64_t e = 0; e < E; ++e) dot += p[e] * dp[e];
    for (int64_t e = 0; e < E; ++e) {
      double v = p[e] * (dp[e] - dot);
      if (extra_l) v += extra_l[t * E + e];
      dl[t * E + e] = static_cast<float>(v);
    }
  }

  if (T == 0) return dlogits;
  // dWr += x^T @ dlogits.
  kernels::Gemm(out.input, true, dlogits, false, dwr, 1.0f, 1.0f);
  // dh += (dlogits @ Wr^T) * noise.
  if (!out.noise.defined()) {
    kernels::Gemm(dlogits, false, wr, true, dh, 1.0f, 1.0f);
  } else {
    Tensor dx = Tensor::Zeros({T, d}, DType::kF32);
    kernels::Gemm(dlogits, false, wr, true, dx, 1.0f, 0.0f);
    const float* dxp = dx.data<float>();
    const float* np = out.noise.data<float>();
    float* dhp = dh.data<float>();
    for (int64_t i = 0; i < T * d; ++i) dhp[i] += dxp[i] * np[i];
  }
  return dlogits;
}

void CountAssignments(const Tensor& indices, std::span<int64_t> counts) {
  CheckCpu(indices, DType::kI32, "expert indices");
  const int32_t* ip = indices.data<int32_t>();
  const int64_t E = static_cast<int64_t>(counts.size());
  for (int64_t i = 0; i < indices.numel(); ++i) {
    SY_CHECK(ip[i] >= 0 && ip[i] < E) << "expert index " << ip[i] << " outside [0, " << E << ")";
    ++counts[ip[i]];
  }
}

void UpdateExpertBias(Tensor& bias, std::span<const int64_t> counts, float rate) {
  CheckCpu(bias, DType::kF32, "expert bias");
  const int64_t E = bias.numel();
  SY_CHECK_EQ(static_cast<int64_t>(counts.size()), E) << "UpdateExpertBias counts";
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  float* b = bias.data<float>();
  for (int64_t i = 0; i < E; ++i) {
    // sign(mean - c_i) = sign(total - E * c_i), exactly.
    const int64_t diff = total - E * counts[i];
    if (diff > 0) b[i] += rate;
    if (diff < 0) b[i] -= rate;
  }
}

}  // namespace switchyard::moe
