// Synthetic MoE routing; see routing.h.
#include "benchmarks/routing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "benchmarks/harness.h"
#include "engine/core/check.h"

namespace switchyard::bench {
namespace {

// The generator of one rank; doubles are formed by hand so that every standard library
// draws the same values.
class Rng {
 public:
  Rng(uint64_t seed, int rank) : engine_(seed * 1000003u + static_cast<uint64_t>(rank)) {}
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

 private:
  std::mt19937_64 engine_;
};

}  // namespace

std::string RoutingSpec::Name() const {
  char buf[32];
  switch (kind) {
    case Kind::kUniform:
      return "uniform";
    case Kind::kZipf:
      std::snprintf(buf, sizeof(buf), "zipf%.2f", skew);
      return buf;
    case Kind::kHot:
      std::snprintf(buf, sizeof(buf), "hot%.0f%%", 100 * hot_share);
      return buf;
  }
  return "?";
}

StatusOr<RoutingSpec> MakeRoutingSpec(bool skew_given, double skew, int hot, double hot_share,
                                      int64_t num_experts, uint64_t seed) {
  RoutingSpec spec;
  spec.num_experts = num_experts;
  spec.seed = seed;
  if (hot != 0 && hot != 1) return InvalidArgument("--hot=", hot, " must be 0 or 1");
  if (skew_given && hot) return InvalidArgument("--skew and --hot 1 exclude each other");
  if (skew_given) {
    if (skew < 0) return InvalidArgument("--skew=", skew, " must be >= 0");
    spec.kind = RoutingSpec::Kind::kZipf;
    spec.skew = skew;
  } else if (hot) {
    if (!(hot_share > 0 && hot_share <= 1)) {
      return InvalidArgument("--hot_share=", hot_share, " must be in (0, 1]");
    }
    spec.kind = RoutingSpec::Kind::kHot;
    spec.hot_share = hot_share;
  }
  return spec;
}

StatusOr<RoutingSpec> RoutingSpecFromFlags(const std::string& skew_text, int hot,
                                           const std::string& hot_share_text,
                                           int64_t num_experts, uint64_t seed) {
  SY_ASSIGN_OR_RETURN(const double skew, ParseDouble("skew", skew_text.empty() ? "0" : skew_text));
  SY_ASSIGN_OR_RETURN(const double share, ParseDouble("hot_share", hot_share_text));
  return MakeRoutingSpec(!skew_text.empty(), skew, hot, share, num_experts, seed);
}

std::vector<double> ExpertWeights(const RoutingSpec& spec) {
  const int64_t e = spec.num_experts;
  std::vector<double> w(e, 1.0 / e);
  if (spec.kind == RoutingSpec::Kind::kZipf) {
    for (int64_t i = 0; i < e; ++i) w[i] = std::pow(1.0 / (i + 1), spec.skew);
  } else if (spec.kind == RoutingSpec::Kind::kHot && e > 1) {
    std::fill(w.begin(), w.end(), (1.0 - spec.hot_share) / (e - 1));
    w[0] = spec.hot_share;
  }
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  for (double& x : w) x /= total;
  return w;
}

std::vector<int64_t> DrawRowsPerExpert(const RoutingSpec& spec, int64_t rows, int rank) {
  const int64_t e = spec.num_experts;
  std::vector<int64_t> counts(e, rows / e);
  if (spec.kind == RoutingSpec::Kind::kUniform) {
    for (int64_t i = 0; i < rows % e; ++i) ++counts[i];
    return counts;
  }
  std::fill(counts.begin(), counts.end(), 0);
  std::vector<double> cdf = ExpertWeights(spec);
  std::partial_sum(cdf.begin(), cdf.end(), cdf.begin());
  Rng rng(spec.seed, rank);
  for (int64_t r = 0; r < rows; ++r) {
    const double u = rng.Uniform() * cdf.back();
    const int64_t i = std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin();
    ++counts[std::min(i, e - 1)];
  }
  return counts;
}

std::vector<int32_t> DrawTopK(const RoutingSpec& spec, int64_t tokens, int64_t top_k, int rank) {
  const int64_t e = spec.num_experts;
  SY_CHECK(top_k >= 1 && top_k <= e) << "top_k=" << top_k << " of " << e << " experts";
  std::vector<int32_t> experts(tokens * top_k);
  if (spec.kind == RoutingSpec::Kind::kUniform) {
    for (int64_t i = 0; i < tokens * top_k; ++i) experts[i] = static_cast<int32_t>(i % e);
    return experts;
  }
  // Gumbel top-k: the k largest log w_e + G_e (G standard Gumbel) are a draw of k experts
  // without replacement with probabilities proportional to w.
  std::vector<double> logw = ExpertWeights(spec);
  for (double& x : logw) x = std::log(x);
  Rng rng(spec.seed, rank);
  std::vector<std::pair<double, int32_t>> keys(e);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < e; ++i) {
      const double u = std::max(rng.Uniform(), 1e-300);
      keys[i] = {logw[i] - std::log(-std::log(u)), static_cast<int32_t>(i)};
    }
    std::partial_sort(keys.begin(), keys.begin() + top_k, keys.end(),
                      [](const auto& a, const auto& b) { return a.first > b.first; });
    for (int64_t j = 0; j < top_k; ++j) experts[t * top_k + j] = keys[j].second;
  }
  return experts;
}

std::vector<int64_t> PerRank(const std::vector<int64_t>& per_expert, int64_t ep) {
  const int64_t e = static_cast<int64_t>(per_expert.size());
  SY_CHECK(ep > 0 && e % ep == 0) << e << " experts over ep=" << ep;
  std::vector<int64_t> out(ep, 0);
  for (int64_t i = 0; i < e; ++i) out[i / (e / ep)] += per_expert[i];
  return out;
}

}  // namespace switchyard::bench
