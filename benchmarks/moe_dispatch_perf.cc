// moe_dispatch_perf: one whole token dispatch and combine over the ep group (ep = the
// world) with identity experts, phase by phase (moe/dispatcher.h):
//   plan, permute, counts (all_to_all), dispatch_a2a (all_to_all_v), regroup,
//   ungroup, return_a2a (all_to_all_v), combine.
// Routing is synthetic (benchmarks/routing.h): --skew s or --hot 1 for MoE-like imbalance,
// capacity admission as the layer does it with --capacity cf (0: dropless).
//
//   size    bytes this rank sends in both all-to-alls, mean over ranks; count = rows
//           dispatched per rank (kept assignments), mean over ranks
//   time    one dispatch + combine, all phases (median over iterations of the slowest
//           rank; each phase likewise, share = phase / sum of phases);
//           algbw = size / time, busbw = algbw (n-1)/n
//   a2a     the two row exchanges alone (ExchangeRows + ReturnRows on a fixed plan), and
//   mpi     raw MPI_Alltoallv with the same counts on preallocated buffers, timed in the
//           same blocks; ratio = a2a / mpi (the "within 10%" target)
//   prealloc  Communicator::AllToAllV into preallocated outputs (what a2a costs without
//           the dispatcher's fresh output tensor per call); pre_ratio = prealloc / mpi
//   #wrong  with identity experts and gates g, combine must give y_t = g * kept_t * h_t
//           (k h with unit gates and nothing dropped, h with --gates mean)
// Node-limited routing (--route_groups G --route_group_topk M, docs/model.md): the ranks
// form G simulated nodes of n/G ranks (E/G experts each, one routing group per node) and
// the choice is the router's own (kernels::RouterTopKScored) on logits ln(weight_e) +
// Gumbel noise, so the routing spec's popularity still applies. Printed beside the bound
// of the page: nodes a token reaches <= min(k, M); inter-node bytes per token, one row per
// (token, other node) as a node-aggregating (hierarchical) exchange sends them,
// <= min(k, M) d 4, and the flat all_to_all_v's one row per assignment beside it.
#include <algorithm>
#include <cmath>
#include <map>

#include "benchmarks/benchmark.h"
#include "benchmarks/routing.h"
#include "engine/core/philox.h"
#include "kernels/moe_routing.h"
#include "moe/capacity.h"
#include "moe/dispatcher.h"
#if SY_HAVE_MPI
#include "engine/dist/mpi_check.h"
#include "engine/dist/mpi_communicator.h"
#endif

namespace switchyard::bench {
namespace {

constexpr const char* kPhases[] = {"plan",    "permute", "counts",     "dispatch_a2a",
                                   "regroup", "ungroup", "return_a2a", "combine"};

class MoEDispatchPerf final : public Benchmark {
 public:
  void AddFlags(cli::FlagSet& flags) override {
    flags.AddInt("tokens", &tokens_, "tokens per rank (default 4096)");
    flags.AddInt("hidden", &hidden_, "d, elements per token (default 1024)");
    flags.AddInt("experts", &experts_, "E, a multiple of the ranks (default 8)");
    flags.AddInt("topk", &topk_, "k experts per token (default 2)");
    flags.AddString("skew", &skew_text_, "Zipf routing: expert e chosen ~ 1/(e+1)^s");
    flags.AddInt("hot", &hot_, "1: expert 0 gets --hot_share of the assignments");
    flags.AddString("hot_share", &hot_share_text_, "the hot expert's share (default 0.75)");
    flags.AddString("capacity", &capacity_text_,
                    "capacity factor per rank's tokens; 0 = dropless (default)");
    flags.AddString("gates", &gates_, "unit (y = k h) or mean (gates 1/k, y = h) (default unit)");
    flags.AddInt("seed", &seed_, "seed of the routing draws (default 1)");
    flags.AddInt("route_groups", &groups_,
                 "G > 0: node-limited routing over G simulated nodes of ranks/G ranks");
    flags.AddInt("route_group_topk", &group_topk_, "M: the nodes a token may use (1..G)");
  }

  // The flags, this rank's routing admitted to capacity as one group, the input and gates.
  Status Setup(Harness& h) override {
    const int n = h.ranks(), me = h.rank();
    if (tokens_ < 1 || hidden_ < 1) return InvalidArgument("--tokens and --hidden must be >= 1");
    if (experts_ < 1 || experts_ % n != 0) {
      return InvalidArgument("--experts=", experts_, " must be a positive multiple of the ", n,
                             " ranks");
    }
    if (topk_ < 1 || topk_ > experts_)
      return InvalidArgument("--topk=", topk_, " must be in [1, ", experts_, "]");
    if (gates_ != "unit" && gates_ != "mean") return InvalidArgument("--gates must be unit or mean");
    SY_ASSIGN_OR_RETURN(cf_, ParseDouble("capacity", capacity_text_));
    SY_ASSIGN_OR_RETURN(spec_,
                        RoutingSpecFromFlags(skew_text_, hot_, hot_share_text_, experts_, seed_));
    const int64_t t = tokens_, d = hidden_, k = topk_, e = experts_;
    if (groups_ != 0 && (groups_ < 1 || n % groups_ != 0 || group_topk_ < 1 ||
                         group_topk_ > groups_ || k > group_topk_ * (e / groups_))) {
      return InvalidArgument("--route_groups=", groups_, " must divide the ", n,
                             " ranks, with 1 <= --route_group_topk=", group_topk_,
                             " <= G and --topk <= M E / G");
    }
    choice_ = groups_ > 0 ? NodeLimitedChoice(me) : DrawTopK(spec_, t, k, me);
    kept_.assign(t * k, 1);
    if (cf_ > 0) {
      moe::Admission adm =
          moe::AdmitToCapacity(Tensor::FromVector(choice_, {t, k}), Tensor(), Tensor(), e,
                               moe::ExpertCapacity(cf_, t, k, e), moe::DropPolicy::kPosition);
      kept_ = adm.kept.ToVector<uint8_t>();
    }
    // Small integers, so identity experts and unit gates make combine exact.
    x_ = Tensor::Empty({t, d}, DType::kF32);
    for (int64_t i = 0; i < t * d; ++i) {
      x_.data<float>()[i] = static_cast<float>(((me * t + i / d) * 7 + (i % d) * 3) % 17) - 8.0f;
    }
    g_ = gates_ == "unit" ? 1.0f : 1.0f / static_cast<float>(k);
    gate_ = Tensor::FromVector(std::vector<float>(t * k, g_), {t, k});
    h.Printf(
        "# tokens %d per rank, d %d, E %d (%lld per rank), top-%d, capacity %s, gates %s, "
        "identity experts\n#\n",
        tokens_, hidden_, experts_, static_cast<long long>(e / n), topk_,
        cf_ > 0 ? capacity_text_.c_str() : "dropless", gates_.c_str());
    return OkStatus();
  }

  Table MakeTable(Harness& h) override {
    return h.StandardTable({{"split", "", 9, 0}, {"dropped", "(%)", 7, 1}},
                           {{"a2a_time", "(us)", 10, 1},
                            {"a2a_busbw", "(GB/s)", 9, 2},
                            {"mpi_time", "(us)", 10, 1},
                            {"mpi_busbw", "(GB/s)", 9, 2},
                            {"ratio", "a2a/mpi", 8, 3},
                            {"prealloc", "(us)", 10, 1},
                            {"pre_ratio", "pre/mpi", 9, 3}});
  }

  // The whole dispatch + combine phase by phase, the exchanges alone, the check.
  StatusOr<int64_t> RunCase(Harness& h, int index, Table& table) override {
    const double total = TimePhases(h);
    const std::vector<double> a2a = TimeExchanges(h);
    const double mpi = a2a.size() == 6 ? a2a[4] + a2a[5] : std::nan("");
    const double pre = a2a[2] + a2a[3];
    const int64_t t = tokens_, d = hidden_, k = topk_, n = h.ranks();
    // Correctness of the last timed iteration: y_t = g * kept_t * x_t.
    const int64_t wrong = h.Check([&] {
      int64_t bad = 0;
      for (int64_t i = 0; i < t; ++i) {
        int kept_slots = 0;
        for (int64_t j = 0; j < k; ++j) kept_slots += kept_[i * k + j];
        for (int64_t c = 0; c < d; ++c) {
          const float want = g_ * kept_slots * x_.data<float>()[i * d + c];
          bad += std::fabs(y_.data<float>()[i * d + c] - want) > 1e-5f * (1.0f + std::fabs(want));
        }
      }
      return bad;
    });
    const int64_t all_rows = h.Sum(assignments_);
    const double size = 2.0 * double(all_rows) * d * 4 / n, factor = double(n - 1) / n;
    const double dropped = 1.0 - double(all_rows) / (double(t) * k * n);
    const double a2a_time = a2a[0] + a2a[1];
    table.AddRow({static_cast<int64_t>(size), all_rows / n, std::string("float"), spec_.Name(),
                  100 * dropped, total * 1e6, size / total / 1e9, size / total / 1e9 * factor,
                  wrong, a2a_time * 1e6, size / a2a_time / 1e9 * factor, mpi * 1e6,
                  size / mpi / 1e9 * factor, a2a_time / mpi, pre * 1e6, pre / mpi});
    return wrong;
  }

  // The second table: each phase's time and share (and the node-limited traffic).
  void Conclude(Harness& h, Table& table) override {
    if (groups_ > 0) PrintNodeTraffic(h);
    h.Printf("#\n#        phase   time(us)  share(%%)\n");
    for (const char* name : kPhases) {
      const double s = phase_time_[name];
      phases_[name] = {{"time_us", s * 1e6}, {"share", s / phase_sum_}};
      h.Printf("  %12s %10.1f %9.1f\n", name, s * 1e6, 100 * s / phase_sum_);
    }
    h.Printf("#\n");
  }

  nlohmann::json Extra(const Harness& h) const override {
    return {{"tokens", tokens_}, {"hidden", hidden_}, {"experts", experts_},
            {"topk", topk_},     {"capacity", cf_},   {"gates", gates_},
            {"split", spec_.Name()}, {"phases", phases_}, {"route_groups", groups_},
            {"route_group_topk", group_topk_}, {"node_traffic", node_traffic_}};
  }

 private:
  // The router's node-limited top-k of T tokens on logits ln(weight_e) + Gumbel(0, 1),
  // keyed by (seed, rank, element).
  std::vector<int32_t> NodeLimitedChoice(int rank) const {
    const int64_t t = tokens_, e = experts_, k = topk_;
    const std::vector<double> w = ExpertWeights(spec_);
    const RngKey key{static_cast<uint64_t>(seed_), StreamId(StrCat("node_limited.", rank))};
    std::vector<float> logits(t * e);
    for (int64_t i = 0; i < t * e; ++i) {
      const double u = std::max(static_cast<double>(UniformAt(key, i)), 1e-12);
      logits[i] = static_cast<float>(std::log(std::max(w[i % e], 1e-30)) - std::log(-std::log(u)));
    }
    Tensor probs = Tensor::Empty({t, e}, DType::kF32), idx = Tensor::Empty({t, k}, DType::kI32),
           gates = Tensor::Empty({t, k}, DType::kF32), keep = Tensor::Empty({t, k}, DType::kU8);
    Tensor none;
    kernels::RouterTopKScored(Tensor::FromVector(logits, {t, e}), Tensor(),
                              {.groups = groups_, .group_topk = group_topk_}, false, RngKey{},
                              0, probs, none, idx, gates, keep);
    return idx.ToVector<int32_t>();
  }

  // Nodes reached per token and rows leaving the token's node (kept assignments), summed
  // over every rank, beside the bound min(k, M).
  void PrintNodeTraffic(Harness& h) {
    const int64_t t = tokens_, k = topk_, per_node = experts_ / groups_;
    const int own = h.rank() / (h.ranks() / groups_);
    double nodes_sum = 0, nodes_max = 0, remote_nodes = 0, remote_rows = 0;
    for (int64_t i = 0; i < t; ++i) {
      std::vector<bool> seen(groups_, false);
      for (int64_t j = 0; j < k; ++j) {
        if (!kept_[i * k + j]) continue;
        const int64_t node = choice_[i * k + j] / per_node;
        if (node != own) remote_rows += 1;
        if (!seen[node] && node != own) remote_nodes += 1;
        seen[node] = true;
      }
      const double reached = static_cast<double>(std::count(seen.begin(), seen.end(), true));
      nodes_sum += reached;
      nodes_max = std::max(nodes_max, reached);
    }
    const double all = h.Sum(double(t)), bound = static_cast<double>(std::min<int64_t>(k, group_topk_));
    const double mean_nodes = h.Sum(nodes_sum) / all, max_nodes = h.Max(nodes_max);
    const double agg = h.Sum(remote_nodes) / all, flat = h.Sum(remote_rows) / all;
    const double row_bytes = 4.0 * hidden_;
    h.Printf("# node-limited routing: %d nodes of %d ranks, M = %d, k = %d\n", groups_,
             h.ranks() / groups_, group_topk_, topk_);
    h.Printf("#   nodes per token      mean %.3f  max %.0f   bound min(k, M) = %.0f\n",
             mean_nodes, max_nodes, bound);
    h.Printf("#   inter-node bytes/token, one row per (token, node): %.1f  bound min(k, M) d 4 = "
             "%.0f\n#   inter-node bytes/token, one row per assignment (flat a2a): %.1f "
             "(k d 4 = %.0f)\n#\n",
             agg * row_bytes, bound * row_bytes, flat * row_bytes, k * row_bytes);
    node_traffic_ = {{"nodes_per_token_mean", mean_nodes}, {"nodes_per_token_max", max_nodes},
                     {"bound_nodes", bound}, {"aggregated_bytes_per_token", agg * row_bytes},
                     {"bound_bytes_per_token", bound * row_bytes},
                     {"flat_bytes_per_token", flat * row_bytes}};
  }
  // Times every phase of -n whole dispatches + combines (after -w); returns the median
  // iteration of the slowest rank and keeps each phase's likewise, and the last y.
  double TimePhases(Harness& h) {
    dist::Communicator& ep = h.world();
    const int64_t t = tokens_, k = topk_;
    // per_phase[name][i]: seconds of timed iteration i on this rank.
    std::map<std::string, std::vector<double>> per_phase;
    std::vector<double> per_iter;
    h.Repeat([&](bool timed) {
      const double start = Now();
      double t0 = start;
      auto mark = [&](const char* name) {
        const double t1 = Now();
        if (timed) per_phase[name].push_back(t1 - t0);
        t0 = t1;
      };
      moe::DispatchPlan plan(choice_, kept_, t, k, experts_, ep.size());
      mark("plan");
      Tensor rows = moe::Permute(x_, plan);
      mark("permute");
      plan.ExchangeCounts(ep);
      mark("counts");
      Tensor recv = moe::ExchangeRows(rows, plan, ep);
      mark("dispatch_a2a");
      Tensor grouped = moe::Regroup(recv, plan);
      mark("regroup");
      Tensor back = moe::Ungroup(grouped, plan);  // identity experts: out = grouped
      mark("ungroup");
      Tensor returned = moe::ReturnRows(back, plan, ep);
      mark("return_a2a");
      y_ = moe::Combine(returned, gate_, 1.0f, plan);
      mark("combine");
      if (timed) per_iter.push_back(t0 - start);
    });
    const double total = h.MedianOfMax(per_iter);
    for (const char* name : kPhases) {
      phase_sum_ += phase_time_[name] = h.MedianOfMax(per_phase[name]);
    }
    return total;
  }

  // The two exchanges alone on a fixed plan: as the dispatcher does them (a new output
  // tensor per call), through the Communicator into preallocated outputs, and raw MPI
  // (when the world is an MPI communicator). Seconds per call of each, in that order;
  // keeps the plan's kept assignments.
  std::vector<double> TimeExchanges(Harness& h) {
    dist::Communicator& ep = h.world();
    moe::DispatchPlan plan(choice_, kept_, tokens_, topk_, experts_, ep.size());
    plan.ExchangeCounts(ep);
    assignments_ = plan.num_assignments();
    Tensor rows = moe::Permute(x_, plan);
    Tensor recv = moe::ExchangeRows(rows, plan, ep);
    Tensor pre_recv = Tensor::Empty(recv.shape(), DType::kF32),
           pre_back = Tensor::Empty(rows.shape(), DType::kF32);
    std::vector<std::function<void()>> ops = {
        [&] { moe::ExchangeRows(rows, plan, ep); }, [&] { moe::ReturnRows(recv, plan, ep); },
        [&] { ep.AllToAllV(rows, plan.send_rows(), pre_recv, plan.recv_rows()); },
        [&] { ep.AllToAllV(recv, plan.recv_rows(), pre_back, plan.send_rows()); }};
#if SY_HAVE_MPI
    auto* mpi_comm = dynamic_cast<dist::MpiCommunicator*>(&ep);
    const ElementSplits s = ToElementSplits(plan.send_rows(), hidden_),
                        r = ToElementSplits(plan.recv_rows(), hidden_);
    if (mpi_comm != nullptr) {
      ops.push_back([&] {
        SY_MPI_CHECK(MPI_Alltoallv(rows.raw_data(), s.counts.data(), s.displs.data(), MPI_FLOAT,
                                   pre_recv.raw_data(), r.counts.data(), r.displs.data(),
                                   MPI_FLOAT, mpi_comm->comm()));
      });
      ops.push_back([&] {
        SY_MPI_CHECK(MPI_Alltoallv(recv.raw_data(), r.counts.data(), r.displs.data(), MPI_FLOAT,
                                   pre_back.raw_data(), s.counts.data(), s.displs.data(),
                                   MPI_FLOAT, mpi_comm->comm()));
      });
    }
#endif
    return h.TimeInterleaved(ops);
  }

  int tokens_ = 4096, hidden_ = 1024, experts_ = 8, topk_ = 2, hot_ = 0, seed_ = 1;
  int groups_ = 0, group_topk_ = 0;
  nlohmann::json node_traffic_;
  std::string skew_text_, hot_share_text_ = "0.75", capacity_text_ = "0", gates_ = "unit";
  double cf_ = 0;
  RoutingSpec spec_;
  std::vector<int32_t> choice_;
  std::vector<uint8_t> kept_;
  Tensor x_, gate_, y_;
  float g_ = 1;
  std::map<std::string, double> phase_time_;
  double phase_sum_ = 0;
  int64_t assignments_ = 0;
  nlohmann::json phases_ = nlohmann::json::object();
};

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) {
  return switchyard::bench::RunBenchmark<switchyard::bench::MoEDispatchPerf>(
      argc, argv, "moe_dispatch_perf",
      "MoE token dispatch + combine over ep = all ranks: time per phase, bytes, bandwidth.");
}
