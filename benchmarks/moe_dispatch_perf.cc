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
#include <cmath>
#include <map>

#include "benchmarks/harness.h"
#include "benchmarks/routing.h"
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

int Main(int argc, char** argv) {
  Harness h("moe_dispatch_perf",
            "MoE token dispatch + combine over ep = all ranks: time per phase, bytes, bandwidth.",
            {});
  int tokens = 4096, hidden = 1024, experts = 8, topk = 2, hot = 0, seed = 1;
  std::string skew_text, hot_share_text = "0.75", capacity_text = "0", gates = "unit";
  h.flags().AddInt("tokens", &tokens, "tokens per rank (default 4096)");
  h.flags().AddInt("hidden", &hidden, "d, elements per token (default 1024)");
  h.flags().AddInt("experts", &experts, "E, a multiple of the ranks (default 8)");
  h.flags().AddInt("topk", &topk, "k experts per token (default 2)");
  h.flags().AddString("skew", &skew_text, "Zipf routing: expert e chosen ~ 1/(e+1)^s");
  h.flags().AddInt("hot", &hot, "1: expert 0 gets --hot_share of the assignments");
  h.flags().AddString("hot_share", &hot_share_text, "the hot expert's share (default 0.75)");
  h.flags().AddString("capacity", &capacity_text,
                      "capacity factor per rank's tokens; 0 = dropless (default)");
  h.flags().AddString("gates", &gates, "unit (y = k h) or mean (gates 1/k, y = h) (default unit)");
  h.flags().AddInt("seed", &seed, "seed of the routing draws (default 1)");
  if (auto code = h.Start(argc, argv)) return *code;

  dist::Communicator& ep = h.world();
  const int n = ep.size(), me = ep.rank();
  if (tokens < 1 || hidden < 1) return h.Fail("--tokens and --hidden must be >= 1");
  if (experts < 1 || experts % n != 0) {
    return h.Fail(
        StrCat("--experts=", experts, " must be a positive multiple of the ", n, " ranks"));
  }
  if (topk < 1 || topk > experts)
    return h.Fail(StrCat("--topk=", topk, " must be in [1, ", experts, "]"));
  if (gates != "unit" && gates != "mean") return h.Fail("--gates must be unit or mean");
  StatusOr<double> cf = ParseDouble("capacity", capacity_text);
  if (!cf.ok()) return h.Fail(Message(cf.status()));
  StatusOr<RoutingSpec> spec = RoutingSpecFromFlags(skew_text, hot, hot_share_text, experts, seed);
  if (!spec.ok()) return h.Fail(Message(spec.status()));

  // Routing of this rank's tokens, and capacity admission as one group.
  const int64_t t = tokens, d = hidden, k = topk, e = experts;
  std::vector<int32_t> choice = DrawTopK(*spec, t, k, me);
  std::vector<uint8_t> kept(t * k, 1);
  if (*cf > 0) {
    moe::Admission adm =
        moe::AdmitToCapacity(Tensor::FromVector(choice, {t, k}), Tensor(), Tensor(), e,
                             moe::ExpertCapacity(*cf, t, k, e), moe::DropPolicy::kPosition);
    kept = adm.kept.ToVector<uint8_t>();
  }
  // Small integers, so identity experts and unit gates make combine exact.
  Tensor x = Tensor::Empty({t, d}, DType::kF32);
  for (int64_t i = 0; i < t * d; ++i) {
    x.data<float>()[i] = static_cast<float>(((me * t + i / d) * 7 + (i % d) * 3) % 17) - 8.0f;
  }
  const float g = gates == "unit" ? 1.0f : 1.0f / static_cast<float>(k);
  Tensor gate = Tensor::FromVector(std::vector<float>(t * k, g), {t, k});

  // The whole dispatch + combine, phase by phase: per_phase[name][i] seconds of timed
  // iteration i on this rank.
  std::map<std::string, std::vector<double>> per_phase;
  std::vector<double> per_iter;
  Tensor y;
  auto iteration = [&](bool timed) {
    const double start = Now();
    double t0 = start;
    auto mark = [&](const char* name) {
      const double t1 = Now();
      if (timed) per_phase[name].push_back(t1 - t0);
      t0 = t1;
    };
    moe::DispatchPlan plan(choice, kept, t, k, e, n);
    mark("plan");
    Tensor rows = moe::Permute(x, plan);
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
    y = moe::Combine(returned, gate, plan);
    mark("combine");
    if (timed) per_iter.push_back(t0 - start);
  };
  for (int i = 0; i < h.options().warmup; ++i) iteration(false);
  for (int i = 0; i < h.options().iters; ++i) {
    ep.Barrier();
    iteration(true);
  }
  // Medians over iterations of the slowest rank, for the whole and for each phase.
  const double total = h.MedianOfMax(per_iter);
  std::map<std::string, double> phase_time;
  double phase_sum = 0;
  for (const char* name : kPhases) phase_sum += phase_time[name] = h.MedianOfMax(per_phase[name]);

  // The two exchanges alone on a fixed plan: as the dispatcher does them (a new output
  // tensor per call), through the Communicator into preallocated outputs, and raw MPI.
  moe::DispatchPlan plan(choice, kept, t, k, e, n);
  plan.ExchangeCounts(ep);
  Tensor rows = moe::Permute(x, plan);
  Tensor recv = moe::ExchangeRows(rows, plan, ep);
  Tensor pre_recv = Tensor::Empty(recv.shape(), DType::kF32),
         pre_back = Tensor::Empty(rows.shape(), DType::kF32);
  std::vector<std::function<void()>> ops = {
      [&] { moe::ExchangeRows(rows, plan, ep); }, [&] { moe::ReturnRows(recv, plan, ep); },
      [&] { ep.AllToAllV(rows, plan.send_rows(), pre_recv, plan.recv_rows()); },
      [&] { ep.AllToAllV(recv, plan.recv_rows(), pre_back, plan.send_rows()); }};
  double mpi = std::nan("");
#if SY_HAVE_MPI
  auto* mpi_comm = dynamic_cast<dist::MpiCommunicator*>(&ep);
  std::vector<int> sc(n), sd(n), rc(n), rd(n);
  for (int p = 0, so = 0, ro = 0; p < n; ++p) {
    sc[p] = static_cast<int>(plan.send_rows()[p] * d),
    rc[p] = static_cast<int>(plan.recv_rows()[p] * d);
    sd[p] = so, rd[p] = ro, so += sc[p], ro += rc[p];
  }
  if (mpi_comm != nullptr) {
    ops.push_back([&] {
      SY_MPI_CHECK(MPI_Alltoallv(rows.raw_data(), sc.data(), sd.data(), MPI_FLOAT,
                                 pre_recv.raw_data(), rc.data(), rd.data(), MPI_FLOAT,
                                 mpi_comm->comm()));
    });
    ops.push_back([&] {
      SY_MPI_CHECK(MPI_Alltoallv(recv.raw_data(), rc.data(), rd.data(), MPI_FLOAT,
                                 pre_back.raw_data(), sc.data(), sd.data(), MPI_FLOAT,
                                 mpi_comm->comm()));
    });
  }
#endif
  const std::vector<double> a2a = h.TimeInterleaved(ops);
  if (a2a.size() == 6) mpi = a2a[4] + a2a[5];
  const double pre = a2a[2] + a2a[3];

  // Correctness of the last timed iteration: y_t = g * kept_t * x_t.
  int64_t wrong = 0;
  if (h.options().check) {
    for (int64_t i = 0; i < t; ++i) {
      int kept_slots = 0;
      for (int64_t j = 0; j < k; ++j) kept_slots += kept[i * k + j];
      for (int64_t c = 0; c < d; ++c) {
        const float want = g * kept_slots * x.data<float>()[i * d + c];
        wrong += std::fabs(y.data<float>()[i * d + c] - want) > 1e-5f * (1.0f + std::fabs(want));
      }
    }
  }
  wrong = h.Sum(wrong);
  const int64_t all_rows = h.Sum(plan.num_assignments());
  const double size = 2.0 * double(all_rows) * d * 4 / n, factor = double(n - 1) / n;
  const double dropped = 1.0 - double(all_rows) / (double(t) * k * n);

  Table table = h.StandardTable({{"split", "", 9, 0}, {"dropped", "(%)", 7, 1}},
                                {{"a2a_time", "(us)", 10, 1},
                                 {"a2a_busbw", "(GB/s)", 9, 2},
                                 {"mpi_time", "(us)", 10, 1},
                                 {"mpi_busbw", "(GB/s)", 9, 2},
                                 {"ratio", "a2a/mpi", 8, 3},
                                 {"prealloc", "(us)", 10, 1},
                                 {"pre_ratio", "pre/mpi", 9, 3}});
  if (h.printing()) {
    std::printf(
        "# tokens %d per rank, d %d, E %d (%lld per rank), top-%d, capacity %s, gates %s, "
        "identity experts\n#\n",
        tokens, hidden, experts, static_cast<long long>(e / n), topk,
        *cf > 0 ? capacity_text.c_str() : "dropless", gates.c_str());
  }
  table.PrintHeader();
  const double a2a_time = a2a[0] + a2a[1];
  table.AddRow({static_cast<int64_t>(size), all_rows / n, std::string("float"), spec->Name(),
                100 * dropped, total * 1e6, size / total / 1e9, size / total / 1e9 * factor, wrong,
                a2a_time * 1e6, size / a2a_time / 1e9 * factor, mpi * 1e6,
                size / mpi / 1e9 * factor, a2a_time / mpi, pre * 1e6, pre / mpi});
  nlohmann::json phases = nlohmann::json::object();
  if (h.printing()) std::printf("#\n#        phase   time(us)  share(%%)\n");
  for (const char* name : kPhases) {
    const double s = phase_time[name];
    phases[name] = {{"time_us", s * 1e6}, {"share", s / phase_sum}};
    if (h.printing()) std::printf("  %12s %10.1f %9.1f\n", name, s * 1e6, 100 * s / phase_sum);
  }
  if (h.printing()) std::printf("#\n");
  return h.Finish(table, wrong,
                  {{"tokens", tokens},
                   {"hidden", hidden},
                   {"experts", experts},
                   {"topk", topk},
                   {"capacity", *cf},
                   {"gates", gates},
                   {"split", spec->Name()},
                   {"phases", phases}});
}

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) { return switchyard::bench::Main(argc, argv); }
