// The MoE router's and the load-balancing loss's device code (kernels/cuda/
// moe_routing_kernels.cuh, kernels/cuda/balance_loss_kernels.cuh) run on the CPU, without a
// GPU, through the host model of CUDA in tests/kernels/cuda_emulation.h, with the .cu files'
// launch shapes (one warp per token in 128-thread blocks; (32, 8) blocks over (column tiles,
// chunks) for the column sums; 256-thread grid-stride kernels; one 1024-thread block for the
// double sum; one thread for the loss values), against the CPU ops of kernels/moe_routing.h
// and kernels/balance_loss.h.
//
// Bit-equal where the device does the CPU's operations in the CPU's order: the top-k choice,
// gates and keep draw given the probs, the counts, the column adds, the bias update, the
// balance values and column. Elsewhere a bound that holds by construction (u = 2^-24, the
// f32 unit roundoff; gamma53(m) = m 2^-53 / (1 - m 2^-53) for m double additions):
//  - probs: both round the exact exp to f32 (expf within 0.502 ulp, exp(double) rounded
//    once within 0.5 ulp), sum them in double (exactly or nearly) and round 1 / sum and the
//    product: |d| <= 10 u |cpu|;
//  - dlogits, z-loss and column sums: double sums of the same terms in another order, each
//    rounded to f32 once: |d| <= u (|gpu| + |cpu|) + the double sums' order bound.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/philox.h"
#include "engine/core/tensor.h"
#include "kernels/balance_loss.h"
#include "kernels/moe_routing.h"
#include "kernels/random.h"
// Last: the host model defines CUDA's qualifiers as macros. The kernels declare their shared
// arrays inside the kernel: static, they are one array for the CTA's threads.
#include "tests/kernels/cuda_emulation.h"
#undef __shared__
#define __shared__ static

#include "kernels/cuda/balance_loss_kernels.cuh"
#include "kernels/cuda/moe_routing_kernels.cuh"

namespace switchyard::kernels {
namespace {

namespace rt = cuda::routing;
namespace bl = cuda::balance_loss;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kU = 0x1p-24;         // f32 unit roundoff
constexpr double kTiny = 0x1p-148;     // two f32 subnormal steps
constexpr int kThreads = 256;          // the .cu files' grid-stride blocks

double Gamma53(int64_t m) {
  const double u = 0x1p-53;
  return m * u / (1.0 - m * u);
}

std::vector<float> Uniform(int64_t n, uint64_t stream, float lo, float hi) {
  Tensor t = Tensor::Empty({n}, DType::kF32);
  FillUniform(t, RngKey{43, stream}, 0, lo, hi);
  return t.ToVector<float>();
}

// The .cu's grid for 256 threads (its cap is never reached here; the grid-stride loops are
// run with smaller grids instead).
unsigned GridFor(int64_t n) { return cuda::GridFor(n, kThreads); }

unsigned char no_smem[1];  // the kernels' shared arrays are static: no dynamic shared memory

template <typename Kernel>
void Launch(unsigned blocks, int threads, Kernel kernel) {
  emu::Launch(EmuDim3{blocks, 1, 1}, threads, no_smem, 0, 0, kernel);
}

// A <<<1, 1>>> launch, run on this thread (the host model's CTAs are whole warps; these
// kernels have no barrier and no shuffle).
template <typename Kernel>
void RunOneThread(Kernel kernel) {
  threadIdx = {0, 0, 0};
  blockIdx = {0, 0, 0};
  blockDim = {1, 1, 1};
  gridDim = {1, 1, 1};
  kernel();
}

template <typename T>
void ExpectBits(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(&got[i], &want[i], sizeof(T)))
        << what << " element " << i << ": " << +got[i] << " vs " << +want[i];
  }
}

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

// ---- Counts, column sums, column adds ----------------------------------------------------

// indices (T, k) in [0, E) with some outside it (E, -1, INT_MAX, INT_MIN); keep ~1/4 zeros.
void MakeAssignments(int64_t T, int64_t k, int64_t E, uint64_t stream,
                     std::vector<int32_t>& idx, std::vector<uint8_t>& keep) {
  const std::vector<float> u = Uniform(2 * T * k, stream, 0.0f, 1.0f);
  idx.resize(T * k);
  keep.resize(T * k);
  for (int64_t i = 0; i < T * k; ++i) {
    idx[i] = static_cast<int32_t>(u[i] * u[i] * E);  // skewed to low experts
    keep[i] = u[T * k + i] < 0.75f ? 1 : 0;
  }
  const int32_t bad[] = {static_cast<int32_t>(E), -1, std::numeric_limits<int32_t>::max(),
                         std::numeric_limits<int32_t>::min()};
  for (int b = 0; b < 4 && b * 37 + 5 < T * k; ++b) idx[b * 37 + 5] = bad[b];
}

TEST(RoutingEmulationTest, SlotCountsEqualTheCpu) {
  struct Case {
    int64_t T, k, E;
    unsigned blocks;  // 0: the .cu's GridFor(n)
  };
  const Case cases[] = {{0, 2, 8, 0},     {1, 1, 1, 0},     {333, 2, 12, 0},
                        {1000, 4, 40, 0}, {1000, 4, 40, 3}, {77, 8, 300, 1}};
  uint64_t stream = 900;
  for (const Case& c : cases) {
    for (bool with_keep : {false, true}) {
      const std::string name = "T=" + std::to_string(c.T) + " k=" + std::to_string(c.k) +
                               " E=" + std::to_string(c.E) + " blocks " +
                               std::to_string(c.blocks) + (with_keep ? " keep" : "");
      std::vector<int32_t> idx;
      std::vector<uint8_t> keep;
      MakeAssignments(c.T, c.k, c.E, stream += 10, idx, keep);
      // moe_routing.cu's CountSlotAssignments: counts zeroed, then the kernel when n > 0.
      std::vector<unsigned long long> got(c.k * c.E + 1, 0);
      const int64_t n = c.T * c.k;
      if (n > 0) {
        Launch(c.blocks > 0 ? c.blocks : GridFor(n), kThreads, [&] {
          rt::CountSlotAssignmentsKernel(idx.data(), with_keep ? keep.data() : nullptr, n,
                                         static_cast<int>(c.k), static_cast<int>(c.E),
                                         got.data());
        });
      }
      Tensor want = Tensor::Empty({c.k * c.E + 1}, DType::kI64);
      CountSlotAssignments(Tensor::FromVector(idx, {c.T, c.k}),
                           with_keep ? Tensor::FromVector(keep, {c.T, c.k}) : Tensor(), c.E,
                           want);
      const std::vector<int64_t> w = want.ToVector<int64_t>();
      ASSERT_EQ(got.size(), w.size());
      for (size_t i = 0; i < w.size(); ++i) {
        ASSERT_EQ(static_cast<int64_t>(got[i]), w[i]) << name << " count " << i;
      }
      if (n > 8) {
        EXPECT_GT(w.back(), 0) << name << ": the bad indices are counted";
      }
    }
  }
}

// moe_routing.cu's AddLabelAssignmentCounts: the kernel adds to what the counts hold (a step's
// micro-batches add into one range), so both start from the same nonzero values; labels
// include -1 and L (not counted), the indices MakeAssignments' bad ones (counted apart).
TEST(RoutingEmulationTest, LabelCountsEqualTheCpu) {
  struct Case {
    int64_t T, k, E, L;
    unsigned blocks;  // 0: the .cu's GridFor(n)
  };
  const Case cases[] = {{0, 2, 8, 3, 0}, {1, 1, 1, 1, 0}, {333, 2, 12, 5, 0},
                        {1000, 4, 40, 2, 3}, {77, 8, 300, 7, 1}};
  uint64_t stream = 1900;
  for (const Case& c : cases) {
    const std::string name = "T=" + std::to_string(c.T) + " k=" + std::to_string(c.k) +
                             " E=" + std::to_string(c.E) + " L=" + std::to_string(c.L);
    std::vector<int32_t> idx;
    std::vector<uint8_t> unused;
    MakeAssignments(c.T, c.k, c.E, stream += 10, idx, unused);
    std::vector<int32_t> labels(c.T);
    const std::vector<float> u = Uniform(std::max<int64_t>(c.T, 1), stream + 1, 0.0f, 1.0f);
    for (int64_t t = 0; t < c.T; ++t) {
      labels[t] = static_cast<int32_t>(u[t] * (c.L + 2)) - 1;  // -1 .. L
    }
    std::vector<double> got(c.L * c.E + 1);
    for (size_t i = 0; i < got.size(); ++i) got[i] = static_cast<double>(i % 7);
    Tensor want = Tensor::FromVector(got, {c.L * c.E + 1});
    const int64_t n = c.T * c.k;
    if (n > 0) {
      Launch(c.blocks > 0 ? c.blocks : GridFor(n), kThreads, [&] {
        rt::AddLabelAssignmentCountsKernel(idx.data(), labels.data(), n, static_cast<int>(c.k),
                                           static_cast<int>(c.L), static_cast<int>(c.E),
                                           got.data());
      });
    }
    AddLabelAssignmentCounts(Tensor::FromVector(idx, {c.T, c.k}),
                             Tensor::FromVector(labels, {c.T}), c.L, c.E, want);
    const std::vector<double> w = want.ToVector<double>();
    ASSERT_EQ(got.size(), w.size());
    double added = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      ASSERT_EQ(got[i], w[i]) << name << " count " << i;
      added += w[i] - static_cast<double>(i % 7);
    }
    if (n > 100) {
      const double bad_start = static_cast<double>((w.size() - 1) % 7);
      EXPECT_GT(w.back(), bad_start) << name << ": a labelled bad index is counted apart";
      EXPECT_LT(added, static_cast<double>(n)) << name << ": labels -1 and L are not counted";
      EXPECT_GT(added, 0.0) << name;
    }
  }
}

// moe_routing.cu's ProbColumnSums: partial sums over the (capped) chunks, then the final sums
// (on `final_blocks` blocks when not 0, else GridFor(E)).
std::vector<float> RunColumnSums(const std::vector<float>& probs, int64_t T, int64_t E,
                                 int64_t max_chunks, unsigned final_blocks = 0) {
  const rt::ColumnSumShape shape = rt::ColumnSumShapeOf(T, E, max_chunks);
  std::vector<double> partial(std::max<int64_t>(shape.chunks * E, 1),
                              std::numeric_limits<double>::quiet_NaN());
  if (shape.chunks > 0) {
    emu::Launch(EmuDim3{shape.col_tiles, static_cast<unsigned>(shape.chunks), 1},
                EmuDim3{rt::kSumCols, rt::kSumRowLanes, 1}, no_smem, 0, 0, [&] {
                  rt::ColumnPartialSumsKernel(probs.data(), T, static_cast<int>(E),
                                              shape.rows_per_chunk, partial.data());
                });
  }
  std::vector<float> sums(E, kNaN);
  Launch(final_blocks > 0 ? final_blocks : GridFor(E), kThreads, [&] {
    rt::ColumnFinalSumsKernel(partial.data(), shape.chunks, static_cast<int>(E), sums.data());
  });
  return sums;
}

TEST(RoutingEmulationTest, ProbColumnSumsWithinTheOrderBound) {
  struct Case {
    int64_t T, E, max_chunks;
    unsigned final_blocks;
  };
  // One row; chunks with a partial last one; chunks capped (lanes of many rows, a last chunk
  // short, chunks past T empty); more columns than one tile and than one final block.
  const Case cases[] = {{0, 5, rt::kMaxSumChunks, 0},   {1, 1, rt::kMaxSumChunks, 0},
                        {257, 33, rt::kMaxSumChunks, 0}, {1000, 70, 3, 0},
                        {1001, 7, 1000, 0},             {300, 300, rt::kMaxSumChunks, 0},
                        {300, 300, rt::kMaxSumChunks, 1}};
  uint64_t stream = 1300;
  for (const Case& c : cases) {
    const std::string name = "T=" + std::to_string(c.T) + " E=" + std::to_string(c.E) +
                             " max chunks " + std::to_string(c.max_chunks);
    for (bool integers : {false, true}) {
      // Integer values: every sum exact, so the sums must be the CPU's bits (each element
      // added once); else within the bound of double sums in another order, rounded once.
      std::vector<float> probs = Uniform(c.T * c.E, stream += 10, 0.0f, 1.0f);
      if (integers) {
        for (float& v : probs) v = std::floor(v * 64.0f);
      }
      const std::vector<float> got = RunColumnSums(probs, c.T, c.E, c.max_chunks,
                                                   c.final_blocks);
      Tensor want = Tensor::Empty({c.E}, DType::kF32);
      ProbColumnSums(Tensor::FromVector(probs, {c.T, c.E}), want);
      const std::vector<float> w = want.ToVector<float>();
      for (int64_t e = 0; e < c.E; ++e) {
        double mag = 0.0;
        for (int64_t t = 0; t < c.T; ++t) mag += probs[t * c.E + e];
        const double bound = integers ? 0.0
                                      : kU * (std::fabs(got[e]) + std::fabs(w[e])) +
                                            2 * Gamma53(c.T) * mag + kTiny;
        ASSERT_LE(std::fabs(double(got[e]) - w[e]), bound)
            << name << (integers ? " integers" : "") << " column " << e << ": " << got[e]
            << " vs " << w[e];
      }
    }
  }
}

// Capped chunks with empty ones at the end: T = C * 256 + 1 rows in C chunks of 257 rows,
// the last chunk's rows past T. The real cap C = 1024 does that (its shape checked); the run
// uses C = 300, a third of the CTAs.
TEST(RoutingEmulationTest, ProbColumnSumsWithEmptyChunksPastTheCap) {
  const rt::ColumnSumShape cap = rt::ColumnSumShapeOf(rt::kMaxSumChunks * 256 + 1, 3);
  ASSERT_EQ(cap.chunks, rt::kMaxSumChunks);
  ASSERT_EQ(cap.rows_per_chunk, 257);
  const int64_t max_chunks = 300, T = max_chunks * 256 + 1, E = 3;
  const rt::ColumnSumShape shape = rt::ColumnSumShapeOf(T, E, max_chunks);
  ASSERT_EQ(shape.chunks, max_chunks);
  ASSERT_GE(shape.rows_per_chunk * (shape.chunks - 1), T) << "no empty chunk";
  std::vector<float> probs = Uniform(T * E, 77, 0.0f, 1.0f);
  for (float& v : probs) v = std::floor(v * 64.0f);  // integers: exact sums in any order
  const std::vector<float> got = RunColumnSums(probs, T, E, max_chunks);
  Tensor want = Tensor::Empty({E}, DType::kF32);
  ProbColumnSums(Tensor::FromVector(probs, {T, E}), want);
  ExpectBits(got, want.ToVector<float>(), "T=" + std::to_string(T));
}

TEST(RoutingEmulationTest, AddColumnConstantsEqualsTheCpu) {
  struct Case {
    int64_t T, E;
    unsigned blocks;
  };
  const Case cases[] = {{1, 1, 0}, {5, 7, 0}, {300, 33, 0}, {300, 33, 2}};
  for (const Case& c : cases) {
    const std::vector<float> x0 = Uniform(c.T * c.E, 1700 + c.T + c.blocks, -1.0f, 1.0f);
    const std::vector<float> column = Uniform(c.E, 1800 + c.E, -1.0f, 1.0f);
    std::vector<float> got = x0;
    const int64_t n = c.T * c.E;
    Launch(c.blocks > 0 ? c.blocks : GridFor(n), kThreads, [&] {
      rt::AddColumnConstantsKernel(got.data(), column.data(), n, static_cast<int>(c.E));
    });
    Tensor want = Tensor::FromVector(x0, {c.T, c.E});
    AddColumnConstants(want, column);
    ExpectBits(got, want.ToVector<float>(),
               "T=" + std::to_string(c.T) + " E=" + std::to_string(c.E));
  }
}

// ---- Z-loss ---------------------------------------------------------------------------

// SumDoublesKernel adds every element once: integer values, so the sum is exact in any order.
TEST(RoutingEmulationTest, SumDoublesAddsEveryElementOnce) {
  for (int64_t n : {int64_t{1}, int64_t{31}, int64_t{1024}, int64_t{2500}}) {
    const std::vector<float> u = Uniform(n, 2000 + n, 0.0f, 1.0f);
    std::vector<double> x(n);
    double want = 0.0;
    for (int64_t i = 0; i < n; ++i) want += x[i] = std::floor(u[i] * 1048576.0f) - 1000.0;
    double got = std::numeric_limits<double>::quiet_NaN();
    Launch(1, rt::kSumDoublesThreads, [&] { rt::SumDoublesKernel(x.data(), n, &got); });
    EXPECT_EQ(got, want) << "n=" << n;
  }
}

// The z-loss of the .cu's RouterZLoss (gradient and value) and RouterZLossInto (value).
struct ZLossRun {
  std::vector<float> dlogits;
  std::vector<double> lse_sq;
  double value = 0.0;  // the f32 value as a double (ZLossValueKernel)
};

ZLossRun RunZLoss(const std::vector<float>& logits, int64_t T, int64_t E, float coef,
                  float grad, int64_t n, const std::vector<float>* dlogits) {
  ZLossRun r;
  if (dlogits != nullptr) r.dlogits = *dlogits;
  r.lse_sq.assign(T, std::numeric_limits<double>::quiet_NaN());
  const double grad_coef = dlogits != nullptr ? rt::ZLossGradCoef(grad, coef) : 0.0;
  Launch(rt::TokenBlocks(T), rt::kTokenThreads, [&] {
    rt::ZLossKernel(logits.data(), T, static_cast<int>(E), grad_coef, n, r.lse_sq.data(),
                    dlogits != nullptr ? r.dlogits.data() : nullptr);
  });
  double total = std::numeric_limits<double>::quiet_NaN();
  Launch(1, rt::kSumDoublesThreads, [&] { rt::SumDoublesKernel(r.lse_sq.data(), T, &total); });
  r.value = std::numeric_limits<double>::quiet_NaN();
  RunOneThread([&] { rt::ZLossValueKernel(&total, coef, n, &r.value); });
  // RouterZLoss's host expression on the same sum: the same f32.
  EXPECT_EQ(r.value, static_cast<double>(static_cast<float>(coef * total / n)));
  return r;
}

TEST(RoutingEmulationTest, ZLossWithinTheOrderBound) {
  struct Case {
    int64_t T, E;
    float range;
  };
  const Case cases[] = {{1, 1, 3.0f},  {9, 7, 3.0f},  {13, 40, 3.0f},
                        {6, 300, 30.0f}, {3, 2048, 3.0f}, {5, 33, 0.01f}};
  const float coef = 0.001f, grad = 1.3f;
  uint64_t stream = 2500;
  for (const Case& c : cases) {
    const std::vector<float> logits = Uniform(c.T * c.E, stream += 10, -c.range, c.range);
    const std::vector<float> start = Uniform(c.T * c.E, stream + 1, -1.0f, 1.0f);
    for (int64_t group : {int64_t{0}, 2 * c.T + 3}) {
      const std::string name = "T=" + std::to_string(c.T) + " E=" + std::to_string(c.E) +
                               " range " + std::to_string(c.range) + " group " +
                               std::to_string(group);
      const int64_t n = group > 0 ? group : c.T;
      const ZLossRun got = RunZLoss(logits, c.T, c.E, coef, grad, n, &start);
      Tensor want = Tensor::FromVector(start, {c.T, c.E});
      Tensor alone = Tensor::Zeros({c.T, c.E}, DType::kF32);  // the CPU's added term
      const Tensor l = Tensor::FromVector(logits, {c.T, c.E});
      const float z = RouterZLoss(l, coef, grad, group, &want);
      RouterZLoss(l, coef, grad, group, &alone);
      const std::vector<float> w = want.ToVector<float>(), b = alone.ToVector<float>();

      // Per token: lse and its share of the error of the double sums (ordered differently).
      double sum_sq = 0.0, sum_dsq = 0.0;
      const double gc = std::fabs(rt::ZLossGradCoef(grad, coef)) / n;
      for (int64_t t = 0; t < c.T; ++t) {
        const float* lt = logits.data() + t * c.E;
        const double m = *std::max_element(lt, lt + c.E);
        double s = 0.0;
        for (int64_t e = 0; e < c.E; ++e) s += std::exp(lt[e] - m);
        const double lse = m + std::log(s);
        const double dlse = 4 * Gamma53(c.E + 2) * (1 + std::fabs(lse));
        sum_sq += lse * lse;
        sum_dsq += 2 * std::fabs(lse) * dlse + dlse * dlse;
        for (int64_t e = 0; e < c.E; ++e) {
          const int64_t i = t * c.E + e;
          // v (double) of both within delta; each rounded to f32, then added to start.
          const double delta = 4 * Gamma53(c.E + 2) * std::fabs(b[i]) +
                               gc * (std::exp(lt[e] - m) / s) * dlse * 2;
          const double bound = delta + kU * (4 * std::fabs(b[i]) + 2 * delta) +
                               kU * (std::fabs(got.dlogits[i]) + std::fabs(w[i])) + kTiny;
          ASSERT_LE(std::fabs(double(got.dlogits[i]) - w[i]), bound)
              << name << " dlogits " << i << ": " << got.dlogits[i] << " vs " << w[i];
        }
      }
      const double dsum = 2 * Gamma53(c.T) * sum_sq + sum_dsq;
      const double zbound = kU * (std::fabs(got.value) + std::fabs(z)) +
                            std::fabs(coef) * dsum / n * (1 + 1e-12) + kTiny;
      EXPECT_LE(std::fabs(got.value - z), zbound) << name << " value " << got.value << " vs " << z;

      // RouterZLossBackward (no lse_sq) and RouterZLossInto (no dlogits): the same bits.
      std::vector<float> grad_only = start;
      Launch(rt::TokenBlocks(c.T), rt::kTokenThreads, [&] {
        rt::ZLossKernel(logits.data(), c.T, static_cast<int>(c.E), rt::ZLossGradCoef(grad, coef),
                        n, nullptr, grad_only.data());
      });
      ExpectBits(grad_only, got.dlogits, name + " gradient without the value");
      if (group == 0) {
        const ZLossRun value_only = RunZLoss(logits, c.T, c.E, coef, grad, n, nullptr);
        ExpectBits(value_only.lse_sq, got.lse_sq, name + " lse^2 without the gradient");
        EXPECT_EQ(value_only.value, got.value) << name;
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

// ---- The load-balancing loss -------------------------------------------------------------

// balance_loss.cu's two ops on counts and prob sums made by the routing kernels (with out-of-
// range indices, which `bad` counts) against the CPU's, bit for bit.
TEST(RoutingEmulationTest, BalanceValuesAndColumnEqualTheCpu) {
  struct Case {
    int64_t T, E, k;
    unsigned blocks;  // AddColumnKernel's grid; 0: GridFor(n)
  };
  const Case cases[] = {{0, 12, 2, 0},   {333, 12, 2, 0}, {5, 1, 1, 0},
                        {100, 300, 4, 0}, {100, 300, 4, 3}, {64, 40, 8, 0}};
  const float coef = 0.01f, grad = 0.37f;
  uint64_t stream = 3300;
  for (const Case& c : cases) {
    const std::string name = "T=" + std::to_string(c.T) + " E=" + std::to_string(c.E) +
                             " k=" + std::to_string(c.k) + " blocks " + std::to_string(c.blocks);
    std::vector<int32_t> idx;
    std::vector<uint8_t> keep;
    MakeAssignments(c.T, c.k, c.E, stream += 10, idx, keep);
    std::vector<int64_t> counts(c.k * c.E + 1, 0);
    const int64_t n_idx = c.T * c.k;
    if (n_idx > 0) {
      Launch(GridFor(n_idx), kThreads, [&] {
        rt::CountSlotAssignmentsKernel(idx.data(), nullptr, n_idx, static_cast<int>(c.k),
                                       static_cast<int>(c.E),
                                       reinterpret_cast<unsigned long long*>(counts.data()));
      });
    }
    const std::vector<float> probs = Uniform(c.T * c.E, stream + 1, 0.0f, 1.0f);
    const std::vector<float> sums = RunColumnSums(probs, c.T, c.E, rt::kMaxSumChunks);
    const Tensor counts_t = Tensor::FromVector(counts, {c.k * c.E + 1});
    const Tensor sums_t = Tensor::FromVector(sums, {c.E});

    std::vector<double> values(c.E + 2, std::numeric_limits<double>::quiet_NaN());
    RunOneThread([&] {
      bl::BalanceValuesKernel(counts.data(), sums.data(), c.E, c.k, c.T, coef, values.data());
    });
    Tensor want = Tensor::Zeros({c.E + 2}, DType::kF64);
    BalanceValuesInto(counts_t, sums_t, c.T, c.k, coef, want);
    ExpectBits(values, want.ToVector<double>(), name + " values");
    if (c.T * c.k > 8) {
      EXPECT_GT(values.back(), 0.0) << name << ": bad indices counted";
    }

    // AddBalanceColumn: the column, then its add to every row (nothing when T = 0).
    const std::vector<float> start = Uniform(c.T * c.E, stream + 2, -1.0f, 1.0f);
    std::vector<float> got = start;
    const int64_t n = c.T * c.E;
    if (c.T > 0) {
      std::vector<float> col(c.E, kNaN);
      Launch(GridFor(c.E), kThreads, [&] {
        bl::BalanceColumnKernel(counts.data(), c.E, c.k, c.T, coef, grad, col.data());
      });
      Launch(c.blocks > 0 ? c.blocks : GridFor(n), kThreads,
             [&] { bl::AddColumnKernel(got.data(), col.data(), n, c.E); });
    }
    Tensor want_dp = Tensor::FromVector(start, {c.T, c.E});
    AddBalanceColumn(want_dp, counts_t, c.T, c.k, coef, grad);
    ExpectBits(got, want_dp.ToVector<float>(), name + " dprobs");
  }
}

}  // namespace
}  // namespace switchyard::kernels
