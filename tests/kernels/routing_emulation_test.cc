// The MoE router's device code (kernels/cuda/moe_routing_kernels.cuh: the top-k choice, the
// router's backward, the expert-bias update) run on the CPU, without a GPU, through the host
// model of CUDA in tests/kernels/cuda_emulation.h, with moe_routing.cu's launch shapes (one
// warp per token in 128-thread blocks; 256-thread grid-stride kernels), against the CPU ops of
// kernels/moe_routing.h. (The counts, column sums, z-loss and load-balancing loss:
// routing_sums_emulation_test.cc.)
//
// Bit-equal where the device does the CPU's operations in the CPU's order: the top-k choice,
// gates and keep draw given the probs, and the bias update. Elsewhere a bound that holds by
// construction (u = 2^-24, the f32 unit roundoff; gamma53(m) = m 2^-53 / (1 - m 2^-53) for m
// double additions):
//  - probs: both round the exact exp to f32 (expf within 0.502 ulp, exp(double) rounded
//    once within 0.5 ulp), sum them in double (exactly or nearly) and round 1 / sum and the
//    product: |d| <= 10 u |cpu|;
//  - dlogits: double sums of the same terms in another order, each rounded to f32 once:
//    |d| <= u (|gpu| + |cpu|) + the double sums' order bound.
#include "tests/kernels/routing_emulation.h"

namespace switchyard::kernels {
namespace {

using namespace routing_emulation;  // NOLINT: the shared helpers of routing_emulation.h

// ---- RouterTopK ----------------------------------------------------------------------

struct TopKCase {
  int64_t T, E, k;
  bool ties, bias, normalize, random_second;
};

struct TopKOut {
  std::vector<float> probs, gates;
  std::vector<int32_t> indices;
  std::vector<uint8_t> keep;
};

// moe_routing.cu's RouterTopK launches; outputs start as NaN, -7 and 0xEE.
TopKOut RunTopKKernel(const std::vector<float>& logits, const std::vector<float>& bias,
                      const TopKCase& c, RngKey key, int64_t first_token,
                      const int64_t* at = nullptr, int64_t token_offset = 0) {
  TopKOut o{std::vector<float>(c.T * c.E, kNaN), std::vector<float>(c.T * c.k, kNaN),
            std::vector<int32_t>(c.T * c.k, -7), std::vector<uint8_t>(c.T * c.k, 0xEE)};
  Launch(rt::TokenBlocks(c.T), rt::kTokenThreads, [&] {
    rt::RouterTopKKernel(logits.data(), c.bias ? bias.data() : nullptr, c.T,
                         static_cast<int>(c.E), static_cast<int>(c.k), c.normalize,
                         c.random_second, key, first_token, o.probs.data(), o.indices.data(),
                         o.gates.data(), o.keep.data(), at, token_offset);
  });
  return o;
}

TopKOut RunTopKCpu(const std::vector<float>& logits, const std::vector<float>& bias,
                   const TopKCase& c, RngKey key, int64_t first_token) {
  Tensor probs = Tensor::Empty({c.T, c.E}, DType::kF32);
  Tensor indices = Tensor::Empty({c.T, c.k}, DType::kI32);
  Tensor gates = Tensor::Empty({c.T, c.k}, DType::kF32);
  Tensor keep = Tensor::Empty({c.T, c.k}, DType::kU8);
  RouterTopK(Tensor::FromVector(logits, {c.T, c.E}),
             c.bias ? Tensor::FromVector(bias, {c.E}) : Tensor(), c.normalize, c.random_second,
             key, first_token, probs, indices, gates, keep);
  return {probs.ToVector<float>(), gates.ToVector<float>(), indices.ToVector<int32_t>(),
          keep.ToVector<uint8_t>()};
}

// Token t's choice from probs p by the CPU's rule (kernels/cpu/moe_scoring.cc): the k largest
// p + bias, ties to the smaller expert; gates (normalised by their f32 sum in order); the
// GShard keep of the second.
void ChooseLikeCpu(const TopKCase& c, const std::vector<float>& bias, RngKey key,
                   int64_t first_token, int64_t t, TopKOut& o) {
  const float* p = o.probs.data() + t * c.E;
  std::vector<float> s(c.E);
  for (int64_t e = 0; e < c.E; ++e) s[e] = c.bias ? p[e] + bias[e] : p[e];
  std::vector<int32_t> order(c.E);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + c.k, order.end(), [&](int32_t a, int32_t b) {
    return s[a] > s[b] || (s[a] == s[b] && a < b);
  });
  float sum = 0.0f;
  for (int64_t j = 0; j < c.k; ++j) {
    o.indices[t * c.k + j] = order[j];
    o.gates[t * c.k + j] = p[order[j]];
    sum += p[order[j]];
    o.keep[t * c.k + j] = 1;
  }
  if (c.normalize) {
    for (int64_t j = 0; j < c.k; ++j) o.gates[t * c.k + j] /= sum;
  }
  if (c.random_second) {
    const float p1 = p[order[0]], p2 = p[order[1]];
    const float u = UniformAt(key, static_cast<uint64_t>(first_token + t));
    o.keep[t * c.k + 1] = u < 2.0f * (p2 / (p1 + p2)) ? 1 : 0;
  }
}

// Whether token t's choice could differ between probs within 10 u of the CPU's: two of its
// top k + 1 scores (not an exact tie of equal logit and bias, which both resolve alike) or
// the GShard draw and its threshold closer than that bound can move them.
bool ChoiceCanDiffer(const TopKCase& c, const std::vector<float>& logits,
                     const std::vector<float>& bias, const TopKOut& cpu, RngKey key,
                     int64_t first_token, int64_t t) {
  const float* p = cpu.probs.data() + t * c.E;
  const float* l = logits.data() + t * c.E;
  auto score = [&](int32_t e) { return c.bias ? p[e] + bias[e] : p[e]; };
  std::vector<int32_t> order(c.E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return score(a) > score(b); });
  const double margin = 1e-5;  // relative, against 10 u + the add's rounding (~1e-6)
  for (int64_t r = 0; r + 1 < std::min<int64_t>(c.k + 1, c.E); ++r) {
    const int32_t x = order[r], y = order[r + 1];
    if (l[x] == l[y] && (!c.bias || bias[x] == bias[y])) continue;
    const double scale = std::fabs(score(x)) + std::fabs(score(y)) + p[x] + p[y];
    if (score(x) - score(y) <= margin * scale) return true;
  }
  if (c.random_second) {
    const float p1 = p[cpu.indices[t * c.k]], p2 = p[cpu.indices[t * c.k + 1]];
    const double u = UniformAt(key, static_cast<uint64_t>(first_token + t));
    if (std::fabs(u - 2.0 * p2 / (p1 + p2)) <= margin) return true;
  }
  return false;
}

std::string Name(const TopKCase& c) {
  return "T=" + std::to_string(c.T) + " E=" + std::to_string(c.E) + " k=" +
         std::to_string(c.k) + (c.ties ? " ties" : "") + (c.bias ? " bias" : "") +
         (c.normalize ? " norm" : "") + (c.random_second ? " random2" : "");
}

// Logits in [-4, 4) (on a 0.5 grid for ties: many equal probs per row, across lanes and
// across a lane's experts, row 0 all equal); the last row's largest at the last experts of
// lane 31 and of its lane's previous slot (E - 1 and E - 33), then E - 2; bias tiny, or
// (e % 3) * 0.005 with ties.
void TopKInputs(const TopKCase& c, uint64_t stream, std::vector<float>& logits,
                std::vector<float>& bias) {
  logits = Uniform(c.T * c.E, stream, -4.0f, 4.0f);
  bias = Uniform(c.E, stream + 1, -0.01f, 0.01f);
  if (c.T > 0) {
    float* last = logits.data() + (c.T - 1) * c.E;
    last[std::max<int64_t>(c.E - 2, 0)] = 4.5f;
    last[std::max<int64_t>(c.E - 33, 0)] = 5.0f;
    last[c.E - 1] = 5.0f;
  }
  if (!c.ties) return;
  for (float& v : logits) v = std::round(v * 2.0f) / 2.0f;
  for (int64_t e = 0; e < c.E && c.T > 0; ++e) logits[e] = 1.5f;
  for (int64_t e = 0; e < c.E; ++e) bias[e] = static_cast<float>(e % 3) * 0.005f;
}

TEST(RoutingEmulationTest, RouterTopKChoosesAsTheCpu) {
  const TopKCase cases[] = {
      {1, 1, 1, false, false, false, false},  {9, 7, 3, true, false, false, false},
      {13, 40, 2, true, true, true, true},    {6, 64, 4, false, true, false, false},
      {5, 300, 8, true, true, true, false},   {3, 2048, 2, false, true, true, true},
      {2, 2048, 6, true, false, false, false}, {5, 33, 33, true, true, true, false},
      {7, 96, 2, false, false, false, true},
  };
  const RngKey key{11, 22};
  const int64_t first_token = 100;
  uint64_t stream = 10;
  for (const TopKCase& c : cases) {
    const std::string name = Name(c);
    std::vector<float> logits, bias;
    TopKInputs(c, stream += 10, logits, bias);
    const TopKOut got = RunTopKKernel(logits, bias, c, key, first_token);
    const TopKOut cpu = RunTopKCpu(logits, bias, c, key, first_token);
    // probs within the bound of the file comment.
    for (int64_t i = 0; i < c.T * c.E; ++i) {
      ASSERT_LE(std::fabs(double(got.probs[i]) - cpu.probs[i]), 10 * kU * std::fabs(cpu.probs[i]))
          << name << " prob " << i << ": " << got.probs[i] << " vs " << cpu.probs[i];
    }
    // The choice from the kernel's own probs: the CPU's rule, bit for bit.
    TopKOut want = got;
    for (int64_t t = 0; t < c.T; ++t) ChooseLikeCpu(c, bias, key, first_token, t, want);
    ExpectBits(got.indices, want.indices, name + " indices");
    ExpectBits(got.gates, want.gates, name + " gates");
    ExpectBits(got.keep, want.keep, name + " keep");
    // And the CPU op's own outputs: bit-equal on the tokens whose probs came out bit-equal
    // (most: expf and exp(double) rounded to f32 rarely differ); on the others the same
    // indices and keep unless the probs' bound could reorder the choice, and the gates
    // within that bound carried through their normalisation.
    int64_t same = 0, compared = 0;
    for (int64_t t = 0; t < c.T; ++t) {
      const size_t row = static_cast<size_t>(c.E) * sizeof(float);
      const bool equal = std::memcmp(got.probs.data() + t * c.E, cpu.probs.data() + t * c.E,
                                     row) == 0;
      if (!equal && ChoiceCanDiffer(c, logits, bias, cpu, key, first_token, t)) continue;
      ++compared;
      same += equal;
      for (int64_t j = t * c.k; j < (t + 1) * c.k; ++j) {
        ASSERT_EQ(got.indices[j], cpu.indices[j]) << name << " token " << t;
        ASSERT_EQ(got.keep[j], cpu.keep[j]) << name << " token " << t;
        const double bound = equal ? 0.0 : (c.normalize ? 22 + 2 * c.k : 10) * kU;
        ASSERT_LE(std::fabs(double(got.gates[j]) - cpu.gates[j]), bound * std::fabs(cpu.gates[j]))
            << name << " token " << t;
      }
    }
    std::printf("  %-40s CPU's choice on %lld/%lld tokens (probs bit-equal on %lld)\n",
                name.c_str(), static_cast<long long>(compared), static_cast<long long>(c.T),
                static_cast<long long>(same));
    EXPECT_GE(compared + 1, c.T) << name << ": near ties are rare with these inputs";

    // The draw keyed from device memory ({stream, first token} + offset): the same bits.
    if (c.random_second) {
      const int64_t at[2] = {static_cast<int64_t>(key.stream), first_token - 9};
      const TopKOut dev = RunTopKKernel(logits, bias, c, RngKey{key.seed, 0}, 0, at, 9);
      ExpectBits(dev.probs, got.probs, name + " device key probs");
      ExpectBits(dev.indices, got.indices, name + " device key indices");
      ExpectBits(dev.gates, got.gates, name + " device key gates");
      ExpectBits(dev.keep, got.keep, name + " device key keep");
    }
  }
}

// ---- RouterBackwardLogits --------------------------------------------------------------

struct BackwardInputs {
  int64_t T, E, k;
  std::vector<float> probs, gates, dgates, dprobs, extra;
  std::vector<int32_t> indices;
};

BackwardInputs MakeBackwardInputs(int64_t T, int64_t E, int64_t k, bool normalize,
                                  uint64_t stream) {
  const TopKCase c{T, E, k, false, false, normalize, false};
  std::vector<float> logits, bias;
  TopKInputs(c, stream, logits, bias);
  const TopKOut r = RunTopKCpu(logits, bias, c, RngKey{}, 0);
  return {T,       E,        k, r.probs, r.gates, Uniform(T * k, stream + 2, -1.0f, 1.0f),
          Uniform(T * E, stream + 3, -0.1f, 0.1f), Uniform(T * E, stream + 4, -0.1f, 0.1f),
          r.indices};
}

// The bound on |gpu - cpu| of dlogits[t, e]: the same dp_e and p_e dp_e terms (double
// operations in the CPU's order), their sum `dot` in another order (within 2 gamma53(E)
// sum |p dp|), then p (dp - dot) (+ extra) rounded to f32 once each.
std::vector<double> BackwardBounds(const BackwardInputs& in, bool normalize, bool with_dprobs,
                                   bool with_extra, const std::vector<float>& got,
                                   const std::vector<float>& cpu) {
  const int64_t E = in.E, k = in.k;
  std::vector<double> bound(in.T * E);
  for (int64_t t = 0; t < in.T; ++t) {
    const float* p = in.probs.data() + t * E;
    const int32_t* idx = in.indices.data() + t * k;
    std::vector<double> dp(E, 0.0);
    for (int64_t e = 0; e < E; ++e) dp[e] = with_dprobs ? in.dprobs[t * E + e] : 0.0;
    double sum_p = 0.0, dot_g = 0.0;
    for (int64_t j = 0; j < k; ++j) {
      sum_p += p[idx[j]];
      dot_g += double(in.dgates[t * k + j]) * in.gates[t * k + j];
    }
    for (int64_t j = 0; j < k; ++j) {
      const double dg = in.dgates[t * k + j];
      dp[idx[j]] += normalize ? (dg - dot_g) / sum_p : dg;
    }
    double mag = 0.0;
    for (int64_t e = 0; e < E; ++e) mag += std::fabs(p[e] * dp[e]);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t i = t * E + e;
      const double x = with_extra ? std::fabs(in.extra[i]) : 0.0;
      bound[i] = kU * (std::fabs(got[i]) + std::fabs(cpu[i])) +
                 p[e] * 2 * Gamma53(E) * mag * (1 + 1e-12) +
                 1e-14 * (p[e] * (std::fabs(dp[e]) + mag) + x) + kTiny;
    }
  }
  return bound;
}

TEST(RoutingEmulationTest, RouterBackwardLogitsWithinTheOrderBound) {
  struct Case {
    int64_t T, E, k;
  };
  const Case cases[] = {{1, 1, 1}, {9, 7, 3}, {13, 40, 2}, {6, 300, 4}, {5, 64, 8}, {3, 2048, 2}};
  uint64_t stream = 500;
  for (const Case& c : cases) {
    for (bool normalize : {false, true}) {
      const BackwardInputs in = MakeBackwardInputs(c.T, c.E, c.k, normalize, stream += 10);
      for (int with : {3, 0, 1, 2}) {
        const bool with_dprobs = with & 1, with_extra = with & 2;
        const std::string name = "T=" + std::to_string(c.T) + " E=" + std::to_string(c.E) +
                                 " k=" + std::to_string(c.k) + (normalize ? " norm" : "") +
                                 (with_dprobs ? " dprobs" : "") + (with_extra ? " extra" : "");
        std::vector<float> got(c.T * c.E, kNaN);
        Launch(rt::TokenBlocks(c.T), rt::kTokenThreads, [&] {
          rt::RouterBackwardLogitsKernel(
              in.probs.data(), in.indices.data(), in.gates.data(), in.dgates.data(),
              with_dprobs ? in.dprobs.data() : nullptr, with_extra ? in.extra.data() : nullptr,
              c.T, static_cast<int>(c.E), static_cast<int>(c.k), normalize, got.data());
        });
        Tensor want = Tensor::Empty({c.T, c.E}, DType::kF32);
        auto opt = [&](bool on, const std::vector<float>& v) {
          return on ? Tensor::FromVector(v, {c.T, c.E}) : Tensor();
        };
        RouterBackwardLogits(Tensor::FromVector(in.probs, {c.T, c.E}),
                             Tensor::FromVector(in.indices, {c.T, c.k}),
                             Tensor::FromVector(in.gates, {c.T, c.k}),
                             Tensor::FromVector(in.dgates, {c.T, c.k}), opt(with_dprobs, in.dprobs),
                             opt(with_extra, in.extra), normalize, want);
        const std::vector<float> cpu = want.ToVector<float>();
        const std::vector<double> bound =
            BackwardBounds(in, normalize, with_dprobs, with_extra, got, cpu);
        for (int64_t i = 0; i < c.T * c.E; ++i) {
          ASSERT_LE(std::fabs(double(got[i]) - cpu[i]), bound[i])
              << name << " dlogits " << i << ": " << got[i] << " vs " << cpu[i];
        }
      }
    }
  }
}

// ---- Expert bias ------------------------------------------------------------------------

TEST(RoutingEmulationTest, UpdateExpertBiasEqualsTheCpu) {
  struct Case {
    std::vector<float> bias;
    std::vector<int64_t> counts;
    unsigned blocks;
  };
  std::vector<Case> cases = {
      // mean 6: up, down, and -0 with a zero difference stays -0
      {{0.1f, 0.0f, -0.2f, 0.5f, -0.0f, 0.0f}, {9, 3, 6, 6, 6, 6}, 0},
      {{0.25f}, {7}, 0}};
  std::vector<float> b = Uniform(300, 3000, -0.1f, 0.1f);
  std::vector<int64_t> counts(300);
  for (int64_t i = 0; i < 300; ++i) counts[i] = (i * 7) % 13;  // some equal to the mean 6
  cases.push_back({b, counts, 0});
  cases.push_back({b, counts, 1});
  for (const Case& c : cases) {
    const int64_t E = static_cast<int64_t>(c.bias.size());
    std::vector<float> got = c.bias;
    const std::vector<int32_t> sign = rt::ExpertBiasSigns(c.counts);
    Launch(c.blocks > 0 ? c.blocks : GridFor(E), kThreads,
           [&] { rt::UpdateExpertBiasKernel(got.data(), sign.data(), E, 0.01f); });
    Tensor want = Tensor::FromVector(c.bias, {E});
    UpdateExpertBias(want, c.counts, 0.01f);
    ExpectBits(got, want.ToVector<float>(), "E=" + std::to_string(E));
  }
}

}  // namespace
}  // namespace switchyard::kernels
