// moe_replication_perf: hot-expert relief (moe.replicate_hot_experts, moe/replication.h)
// under skewed routing with no balancing loss, over the ep group = the world.
//
// Each step every rank routes --tokens tokens to --topk of --experts experts drawn from a
// Zipf(--skew) popularity (benchmarks/routing.h; as a router trained without an aux loss
// tends to). Step 0's world counts make the plan (ReplicaPlan::Balance with N = each value
// of --hot); step 1's fresh draws are then dispatched for real (ReplicaDestinations,
// DispatchPlan, the count all_to_all) and the rows each rank's experts and replicas
// receive are counted. Columns:
//   hot            N, the experts replicated (0: no replication, the "before")
//   slots          replica slots per rank (S, each a copy of one expert's weights)
//   busiest/mean   the busiest rank's received rows over the mean, measured on step 1
//   planned        the same for the plan's own shares of step 0 (what it aimed at)
//   replica_rows   the share of all rows that replicas ran
// Writes the rows as JSON to --json when given. Counts only: no timing.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "benchmarks/routing.h"
#include "engine/dist/process.h"
#include "moe/dispatcher.h"
#include "moe/replication.h"

namespace switchyard::bench {
namespace {

struct Options {
  int64_t tokens = 4096, experts = 64, top_k = 2;
  double skew = 1.2;
  std::vector<int64_t> hot = {0, 2, 4, 8};
  std::string json;
};

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "moe_replication_perf: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--tokens") o.tokens = std::stoll(value());
    else if (a == "--experts") o.experts = std::stoll(value());
    else if (a == "--topk") o.top_k = std::stoll(value());
    else if (a == "--skew") o.skew = std::stod(value());
    else if (a == "--json") o.json = value();
    else if (a == "--hot") {
      o.hot.clear();
      const std::string list = value();
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        o.hot.push_back(std::stoll(list.substr(at, comma - at)));
        at = comma + 1;
      }
    } else {
      std::fprintf(stderr, "moe_replication_perf: unknown flag %s (--tokens, --experts, "
                           "--topk, --skew, --hot N,N,..., --json PATH)\n", a.c_str());
      std::exit(2);
    }
  }
  return o;
}

double MaxOverMean(const std::vector<double>& v) {
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  return *std::max_element(v.begin(), v.end()) / mean;
}

// Step `step`'s routing of this rank: (T, k) experts.
Tensor Draw(const Options& o, int64_t step, int rank) {
  RoutingSpec spec{.kind = RoutingSpec::Kind::kZipf, .skew = o.skew, .num_experts = o.experts,
                   .seed = static_cast<uint64_t>(1 + step)};
  return Tensor::FromVector(DrawTopK(spec, o.tokens, o.top_k, rank), {o.tokens, o.top_k});
}

int Main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  auto world = dist::WorldCommunicator();
  const int ep = world->size(), rank = world->rank();
  if (o.experts % ep != 0) {
    if (rank == 0) std::fprintf(stderr, "--experts %lld is not divisible by %d ranks\n",
                                static_cast<long long>(o.experts), ep);
    return 2;
  }
  // Step 0: the world's counts plan the replicas.
  std::vector<int64_t> counts(o.experts, 0);
  for (int32_t e : Draw(o, 0, rank).ToVector<int32_t>()) ++counts[e];
  Tensor c = Tensor::FromVector(counts, {o.experts});
  world->AllReduce(c, dist::ReduceOp::kSum);
  counts = c.ToVector<int64_t>();
  // Step 1: dispatched by each plan.
  const Tensor experts = Draw(o, 1, rank);
  const Tensor kept = Tensor::FromVector(std::vector<uint8_t>(o.tokens * o.top_k, 1),
                                         {o.tokens, o.top_k});
  std::vector<int64_t> tokens(o.tokens);
  for (int64_t t = 0; t < o.tokens; ++t) tokens[t] = (int64_t{ep} + rank) * o.tokens + t;

  if (rank == 0) {
    std::printf("# moe_replication_perf: ep %d, %lld experts, top-%lld, %lld tokens a rank, "
                "zipf %.2f, no aux loss\n", ep, static_cast<long long>(o.experts),
                static_cast<long long>(o.top_k), static_cast<long long>(o.tokens), o.skew);
    std::printf("%6s %6s %14s %9s %13s\n", "hot", "slots", "busiest/mean", "planned",
                "replica_rows");
  }
  std::string json = "[";
  for (int64_t n : o.hot) {
    const moe::ReplicaPlan plan = moe::ReplicaPlan::Balance(counts, ep, n);
    moe::DispatchPlan dp =
        plan.empty()
            ? moe::DispatchPlan::Build(experts, kept, o.experts, ep)
            : moe::DispatchPlan::Build(moe::ReplicaDestinations(plan, experts, tokens), kept,
                                       plan.virtual_experts(), ep);
    dp.ExchangeCounts(*world);
    const int64_t el = o.experts / ep;
    int64_t replica_rows = 0;
    for (int64_t s = el; s < static_cast<int64_t>(dp.rows_per_local_expert().size()); ++s)
      replica_rows += dp.rows_per_local_expert()[s];
    Tensor per_rank = Tensor::Zeros({ep + 1}, DType::kI64);
    per_rank.data<int64_t>()[rank] = dp.num_received();
    per_rank.data<int64_t>()[ep] = replica_rows;
    world->AllReduce(per_rank, dist::ReduceOp::kSum);
    const std::vector<int64_t> got = per_rank.ToVector<int64_t>();
    const std::vector<double> loads(got.begin(), got.begin() + ep);
    const double total = std::accumulate(loads.begin(), loads.end(), 0.0);
    const double measured = MaxOverMean(loads), planned = MaxOverMean(plan.empty()
        ? moe::ReplicaPlan(o.experts, ep).PlannedLoads(counts) : plan.PlannedLoads(counts));
    if (rank == 0) {
      std::printf("%6lld %6lld %14.3f %9.3f %12.1f%%\n", static_cast<long long>(n),
                  static_cast<long long>(plan.slots()), measured, planned,
                  100.0 * static_cast<double>(got[ep]) / total);
      char row[256];
      std::snprintf(row, sizeof(row),
                    "%s{\"hot\": %lld, \"slots\": %lld, \"busiest_over_mean\": %.4f, "
                    "\"planned\": %.4f, \"replica_share\": %.4f}",
                    json.size() > 1 ? ", " : "", static_cast<long long>(n),
                    static_cast<long long>(plan.slots()), measured, planned,
                    static_cast<double>(got[ep]) / total);
      json += row;
    }
  }
  if (rank == 0 && !o.json.empty()) std::ofstream(o.json) << json << "]\n";
  return 0;
}

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) {
  using namespace switchyard;
  if (Status s = dist::InitProcess(&argc, &argv); !s.ok()) {
    std::fprintf(stderr, "moe_replication_perf: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  const int rc = bench::Main(argc, argv);
  dist::FinalizeProcess();
  return rc;
}
