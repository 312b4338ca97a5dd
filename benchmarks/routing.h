// Synthetic MoE routing for the benchmarks: how many tokens each expert (hence each
// expert-parallel rank) receives when expert popularity is uniform, follows a Zipf law,
// or has one hot expert. Draws are deterministic: a fixed generator keyed by (seed, rank).
//
//   uniform  exact equal split (no draw at all): the nccl-tests all-to-all
//   zipf s   expert e is chosen with probability proportional to 1 / (e + 1)^s, so expert 0
//            (on ep rank 0) is the most popular; s = 0 draws uniformly (uneven by chance
//            only), s ~ 1 to 1.5 resembles an untrained or badly balanced router
//   hot      expert 0 gets `hot_share` of the tokens, the others share the rest equally
//
// Every rank draws from the same popularity, as a real router would, so the hot experts
// (and the ranks holding them) receive from everyone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace switchyard::bench {

struct RoutingSpec {
  enum class Kind { kUniform, kZipf, kHot };
  Kind kind = Kind::kUniform;
  double skew = 0.0;        // zipf: the exponent s >= 0
  double hot_share = 0.75;  // hot: expert 0's share, in (0, 1]
  int64_t num_experts = 1;  // E
  uint64_t seed = 1;

  // "uniform", "zipf1.20", "hot75%".
  std::string Name() const;
};

// The spec the common flags describe: --skew S (zipf) or --hot 1 (with --hot_share), or
// uniform when neither is given. Rejects both at once, s < 0 and shares outside (0, 1].
StatusOr<RoutingSpec> MakeRoutingSpec(bool skew_given, double skew, int hot, double hot_share,
                                      int64_t num_experts, uint64_t seed);
// The same from the flags' text as the benchmarks take them (--skew empty: not given);
// a value that is not a number is an error naming its flag.
StatusOr<RoutingSpec> RoutingSpecFromFlags(const std::string& skew_text, int hot,
                                           const std::string& hot_share_text,
                                           int64_t num_experts, uint64_t seed);

// (E) each expert's probability of being chosen (they sum to 1).
std::vector<double> ExpertWeights(const RoutingSpec& spec);

// (E) how many of `rows` single-expert choices (top-1 tokens) this rank sends to each
// expert: uniform splits exactly (the remainder to the first experts), the others draw.
std::vector<int64_t> DrawRowsPerExpert(const RoutingSpec& spec, int64_t rows, int rank);

// (T * k) the experts of T tokens, k distinct ones per token (k <= E): uniform gives token
// t experts (t * k + j) mod E, which loads every expert equally; the others draw without
// replacement in proportion to ExpertWeights (Gumbel top-k).
std::vector<int32_t> DrawTopK(const RoutingSpec& spec, int64_t tokens, int64_t top_k, int rank);

// Sums (E) per-expert counts into (ep) per-rank counts, E / ep consecutive experts a rank.
std::vector<int64_t> PerRank(const std::vector<int64_t>& per_expert, int64_t ep);

}  // namespace switchyard::bench
