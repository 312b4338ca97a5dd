#include "moe/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/core/status.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/moe_routing.h"
#include "kernels/random.h"

namespace switchyard::moe {
namespace {

// `t` is defined, of `dtype`, and on `device` (the router input's).
void CheckOn(const Tensor& t, DType dtype, Device device, const char* what) {
  SY_CHECK(t.defined()) << what << " is undefined";
  SY_CHECK(t.device() == device) << what << " on " << t.device() << ", the router input on "
                                 << device;
  SY_CHECK_EQ(t.dtype(), dtype) << what;
}

// The router's backward matrix products in f32 whatever ctx's matmul_dtype (MODEL.md
// section 2: the router runs in fp32 on every backend). The forward logits are row-exact.
void RouterGemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
                float alpha, float beta, DeviceContext* ctx) {
  if (ctx == nullptr || ctx->matmul_dtype() == DType::kF32) {
    kernels::Gemm(a, trans_a, b, trans_b, c, alpha, beta, ctx);
    return;
  }
  const DType saved = ctx->matmul_dtype();
  ctx->set_matmul_dtype(DType::kF32);
  kernels::Gemm(a, trans_a, b, trans_b, c, alpha, beta, ctx);
  ctx->set_matmul_dtype(saved);
}

kernels::RouterScoring ScoringOf(const MoEConfig& config) {
  return kernels::RouterScoring{.sigmoid = config.score == ScoreFunction::kSigmoid,
                                .normalize = config.normalize_gates,
                                .groups = config.route_groups,
                                .group_topk = config.route_group_topk};
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

std::vector<int64_t> RouterRngValues(uint64_t seed, int64_t step, int64_t n_layers,
                                     int64_t first_token) {
  std::vector<int64_t> values;
  values.reserve(4 * n_layers);
  for (int64_t l = 0; l < n_layers; ++l) {
    values.push_back(static_cast<int64_t>(JitterRngKey(seed, step, l).stream));
    values.push_back(first_token);
    values.push_back(static_cast<int64_t>(SecondExpertRngKey(seed, step, l).stream));
    values.push_back(first_token);
  }
  return values;
}

void MulJitter(const JitterDraw& draw, const Tensor& x, Tensor& out, kernels::Write write,
               DeviceContext* ctx) {
  SY_CHECK(draw.on) << "MulJitter without a jitter draw";
  SY_CHECK(x.ndim() == 2 && out.shape() == x.shape())
      << "MulJitter: x " << ShapeString(x.shape()) << ", out " << ShapeString(out.shape());
  const int64_t T = x.dim(0), d = x.dim(1);
  const RouterRng& rng = draw.rng;
  const RngKey key = JitterRngKey(rng.seed, rng.step, rng.layer);
  // Rows from `token` on: with the host's key, or the step's read from device memory.
  auto rows = [&](int64_t row, int64_t n, int64_t token) {
    const Tensor in = x.Slice(row, row + n);
    Tensor o = out.Slice(row, row + n);
    if (rng.device_values.defined()) {
      kernels::MulUniform(in, o,
                          kernels::DeviceRng{.seed = rng.seed,
                                             .values = rng.device_values.Slice(0, 2),
                                             .token_offset = token - rng.device_base,
                                             .per_token = d},
                          draw.lo, draw.hi, write, ctx);
    } else {
      kernels::MulUniform(in, o, key, token * d, draw.lo, draw.hi, write, ctx);
    }
  };
  if (draw.runs.empty()) {
    rows(0, T, rng.first_token);
    return;
  }
  int64_t row = 0;
  for (const TokenRun& run : draw.runs) {
    rows(row, run.rows, rng.first_token + run.token);
    row += run.rows;
  }
  SY_CHECK_EQ(row, T) << "router runs cover " << row << " of " << T << " rows";
}

Tensor JitterNoise(const RouterOutput& out, DeviceContext* ctx) {
  if (!out.jitter.on) return Tensor();
  Tensor ones = Tensor::Empty(out.input.shape(), DType::kF32, out.input.device());
  kernels::Fill(ones, 1.0f, ctx);
  Tensor noise = Tensor::Empty(out.input.shape(), DType::kF32, out.input.device());
  MulJitter(out.jitter, ones, noise, kernels::Write::kSet, ctx);  // 1 * u = u exactly
  return noise;
}

RouterOutput RouterLogits(const Tensor& h, const Tensor& wr, const MoEConfig& config,
                          bool training, const RouterRng& rng, DeviceContext* ctx,
                          std::span<const TokenRun> runs) {
  SY_CHECK(h.defined()) << "router h is undefined";
  const Device dev = h.device();
  CheckOn(h, DType::kF32, dev, "router h");
  CheckOn(wr, DType::kF32, dev, "router Wr");
  SY_CHECK_EQ(h.ndim(), 2) << "router h " << ShapeString(h.shape());
  const int64_t T = h.dim(0), d = h.dim(1);
  const int64_t E = config.num_experts;
  SY_CHECK(wr.ndim() == 2 && wr.dim(0) == d && wr.dim(1) == E)
      << "router Wr " << ShapeString(wr.shape()) << " for d=" << d << ", E=" << E;

  RouterOutput out;
  // x = h * noise, noise element (first_token + t) * d + j.
  if (training && config.jitter_eps > 0.0f) {
    out.jitter = JitterDraw{.on = true,
                            .lo = 1.0f - config.jitter_eps,
                            .hi = 1.0f + config.jitter_eps,
                            .rng = rng,
                            .runs = std::vector<TokenRun>(runs.begin(), runs.end())};
    out.input = Tensor::Empty({T, d}, DType::kF32, dev);
    MulJitter(out.jitter, h, out.input, kernels::Write::kSet, ctx);
  } else {
    out.input = h;
  }
  // Row-exact: a token's logits have the same bits whichever rows share the product (one
  // rank's whole batch, a tp rank's block, a replica's micro-batch), so its routing does too.
  out.logits = Tensor::Empty({T, E}, DType::kF32, dev);
  kernels::RowExactGemm(out.input, wr, out.logits, ctx);
  return out;
}

void RouterChoose(RouterOutput& out, const Tensor& expert_bias, const MoEConfig& config,
                  const RouterRng& rng, DeviceContext* ctx) {
  const Device dev = out.logits.device();
  CheckOn(out.logits, DType::kF32, dev, "router logits");
  const int64_t T = out.logits.dim(0), E = config.num_experts, k = config.top_k;
  SY_CHECK(out.logits.ndim() == 2 && out.logits.dim(1) == E)
      << "router logits " << ShapeString(out.logits.shape()) << " for E=" << E;
  SY_CHECK(k >= 1 && k <= E) << "top_k=" << k << ", E=" << E;
  if (expert_bias.defined()) {
    CheckOn(expert_bias, DType::kF32, dev, "router expert bias");
    SY_CHECK_EQ(expert_bias.numel(), E) << "router expert bias";
  }
  const bool random_second = config.second_expert_policy == SecondExpertPolicy::kRandom;
  SY_CHECK(!random_second || k == 2) << "second_expert_policy=random needs top_k=2, got " << k;
  out.probs = Tensor::Empty({T, E}, DType::kF32, dev);
  const kernels::RouterScoring scoring = ScoringOf(config);
  Tensor scores = scoring.sigmoid ? Tensor::Empty({T, E}, DType::kF32, dev) : Tensor();
  out.indices = Tensor::Empty({T, k}, DType::kI32, dev);
  out.gates = Tensor::Empty({T, k}, DType::kF32, dev);
  out.keep = Tensor::Empty({T, k}, DType::kU8, dev);
  const Tensor bias = expert_bias.defined() ? expert_bias.View({E}) : Tensor();
  if (rng.device_values.defined()) {
    kernels::RouterTopKScored(out.logits, bias, scoring, random_second,
                              kernels::DeviceRng{.seed = rng.seed,
                                                 .values = rng.device_values.Slice(2, 4),
                                                 .token_offset = rng.first_token - rng.device_base},
                              out.probs, scores, out.indices, out.gates, out.keep, ctx);
  } else {
    kernels::RouterTopKScored(out.logits, bias, scoring, random_second,
                              SecondExpertRngKey(rng.seed, rng.step, rng.layer), rng.first_token,
                              out.probs, scores, out.indices, out.gates, out.keep, ctx);
  }
  out.scores = scoring.sigmoid ? scores : out.probs;
}

RouterOutput RouterForward(const Tensor& h, const Tensor& wr, const Tensor& expert_bias,
                           const MoEConfig& config, bool training, const RouterRng& rng,
                           DeviceContext* ctx) {
  RouterOutput out = RouterLogits(h, wr, config, training, rng, ctx);
  RouterChoose(out, expert_bias, config, rng, ctx);
  return out;
}

Tensor RouterBackward(const RouterOutput& out, const Tensor& wr, const MoEConfig& config,
                      const Tensor& dgates, const Tensor& dprobs, const Tensor& dlogits_extra,
                      Tensor& dh, Tensor& dwr, DeviceContext* ctx) {
  const int64_t T = out.probs.dim(0), E = out.probs.dim(1), k = out.indices.dim(1);
  const int64_t d = out.input.dim(1);
  const Device dev = out.probs.device();
  CheckOn(dgates, DType::kF32, dev, "router dgates");
  SY_CHECK(dgates.ndim() == 2 && dgates.dim(0) == T && dgates.dim(1) == k)
      << "router dgates " << ShapeString(dgates.shape());
  CheckOn(dh, DType::kF32, dev, "router dh");
  SY_CHECK(dh.ndim() == 2 && dh.dim(0) == T && dh.dim(1) == d) << "router dh";
  CheckOn(dwr, DType::kF32, dev, "router dWr");
  SY_CHECK(dwr.ndim() == 2 && dwr.dim(0) == d && dwr.dim(1) == E) << "router dWr";
  Tensor extra_p, extra_l;
  if (dprobs.defined()) {
    CheckOn(dprobs, DType::kF32, dev, "router dprobs");
    SY_CHECK_EQ(dprobs.numel(), T * E) << "router dprobs";
    extra_p = dprobs.View({T, E});
  }
  if (dlogits_extra.defined()) {
    CheckOn(dlogits_extra, DType::kF32, dev, "router dlogits_extra");
    SY_CHECK_EQ(dlogits_extra.numel(), T * E) << "router dlogits_extra";
    extra_l = dlogits_extra.View({T, E});
  }

  Tensor dlogits = Tensor::Empty({T, E}, DType::kF32, dev);
  const kernels::RouterScoring scoring = ScoringOf(config);
  kernels::RouterBackwardScored(out.probs, scoring.sigmoid ? out.scores : Tensor(), out.indices,
                                out.gates, dgates, extra_p, extra_l, scoring, dlogits, ctx);

  if (T == 0) return dlogits;
  // dWr += x^T @ dlogits.
  RouterGemm(out.input, true, dlogits, false, dwr, 1.0f, 1.0f, ctx);
  // dh += (dlogits @ Wr^T) * noise, the forward's noise drawn again.
  if (!out.jitter.on) {
    RouterGemm(dlogits, false, wr, true, dh, 1.0f, 1.0f, ctx);
  } else {
    Tensor dx = Tensor::Empty({T, d}, DType::kF32, dev);  // beta 0: the product never reads it
    RouterGemm(dlogits, false, wr, true, dx, 1.0f, 0.0f, ctx);
    MulJitter(out.jitter, dx, dh, kernels::Write::kAdd, ctx);
  }
  return dlogits;
}

void CountAssignments(const Tensor& indices, std::span<int64_t> counts, DeviceContext* ctx) {
  SY_CHECK(indices.defined()) << "expert indices is undefined";
  SY_CHECK_EQ(indices.dtype(), DType::kI32) << "expert indices";
  const int64_t E = static_cast<int64_t>(counts.size()), n = indices.numel();
  if (E == 0) {
    SY_CHECK_EQ(n, 0) << "expert indices for 0 experts";
    return;
  }
  // Every (token, slot) alike: indices as (n, 1).
  Tensor slot_counts = Tensor::Empty({E + 1}, DType::kI64, indices.device());
  kernels::CountSlotAssignments(indices.View({n, 1}), Tensor(), E, slot_counts, ctx);
  const Tensor host = slot_counts.ToHost("moe.assignment_counts", ctx);
  const int64_t* c = host.data<int64_t>();
  SY_CHECK_EQ(c[E], 0) << "expert indices outside [0, " << E << ")";
  for (int64_t e = 0; e < E; ++e) counts[e] += c[e];
}

void UpdateExpertBias(Tensor& bias, std::span<const int64_t> counts, float rate,
                      DeviceContext* ctx) {
  SY_CHECK(bias.defined()) << "expert bias is undefined";
  SY_CHECK_EQ(bias.dtype(), DType::kF32) << "expert bias";
  SY_CHECK_EQ(static_cast<int64_t>(counts.size()), bias.numel()) << "UpdateExpertBias counts";
  Tensor flat = bias.View({bias.numel()});
  kernels::UpdateExpertBias(flat, counts, rate, ctx);
}

void UpdateExpertBiasProportional(Tensor& bias, std::span<const int64_t> counts, float rate,
                                  DeviceContext* ctx) {
  SY_CHECK(bias.defined()) << "expert bias is undefined";
  SY_CHECK_EQ(bias.dtype(), DType::kF32) << "expert bias";
  const int64_t e = bias.numel();
  SY_CHECK_EQ(static_cast<int64_t>(counts.size()), e) << "UpdateExpertBiasProportional counts";
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  if (total == 0) return;
  const double mean = static_cast<double>(total) / static_cast<double>(e);
  std::vector<float> b = bias.ToHost("moe.expert_bias", ctx).ToVector<float>();
  for (int64_t i = 0; i < e; ++i) {
    const double err = (mean - static_cast<double>(counts[i])) / mean;
    b[i] = static_cast<float>(static_cast<double>(b[i]) + static_cast<double>(rate) * err);
  }
  bias.CopyFrom(Tensor::FromVector(b, bias.shape()), ctx);
}

}  // namespace switchyard::moe
