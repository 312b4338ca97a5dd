#include "engine/plan/layout_search.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <tuple>

#include "engine/model/param_table.h"

namespace switchyard::plan {
namespace {

std::vector<int> Divisors(int64_t n, int64_t most) {
  std::vector<int> out;
  for (int64_t d = 1; d <= std::min(n, most); ++d)
    if (n % d == 0) out.push_back(static_cast<int>(d));
  return out;
}

// Recompute's extra forward as a fraction of the step's FLOPs: full redoes every layer's
// forward (a third of 6N + 12LSH), selective the attention core (4 L S H of the 12).
double RecomputeFraction(const config::Config& c, model::Recompute r) {
  if (r == model::Recompute::kNone) return 0;
  const model::PieceParams& all = model::ParamTable::Build(c.model, c.moe).Total();
  const double step = 6.0 * all.matmul + 12.0 * all.attention;
  return r == model::Recompute::kFull ? 1.0 / 3.0 : 4.0 * all.attention / step;
}

// What a layout costs besides memory, least first: the step's compute, the ZeRO stage
// (its gathers and scatters), tp (its collectives per layer).
std::tuple<double, int, int> Cost(const LayoutCandidate& c) {
  return {c.work, c.config.parallel.zero_stage, c.config.parallel.tp};
}

// a beats b: no more peak, work, ZeRO stage or tp, and less of one.
bool Dominates(const LayoutCandidate& a, const LayoutCandidate& b) {
  const double pa = a.fit.peak, pb = b.fit.peak;
  const double oa[] = {pa, a.work, double(a.config.parallel.zero_stage), double(a.config.parallel.tp)};
  const double ob[] = {pb, b.work, double(b.config.parallel.zero_stage), double(b.config.parallel.tp)};
  bool better = false;
  for (int i = 0; i < 4; ++i) {
    if (oa[i] > ob[i] * (1 + 1e-9)) return false;
    if (oa[i] < ob[i] * (1 - 1e-9)) better = true;
  }
  return better;
}

// The model-parallel shapes of the world: (tp, pp, virtual stages, etp, ep).
struct Shape {
  int tp, pp, vs, etp, ep;
};

std::vector<Shape> Shapes(const config::Config& c, int world) {
  std::vector<Shape> out;
  bool any_moe = false;
  for (int64_t i = 0; i < c.model.n_layers; ++i) any_moe = any_moe || c.moe.IsMoELayer(i);
  for (int tp : Divisors(world, 8)) {
    // etp: as tp, or 1 (whole experts) beside a split dense part.
    std::vector<int> etps = {tp};
    if (any_moe && tp > 1) etps.push_back(1);
    const std::vector<int> eps = any_moe ? Divisors(c.moe.num_experts, c.moe.num_experts) : std::vector<int>{1};
    for (int pp : Divisors(world / tp, c.model.n_layers)) {
      for (int vs : {1, 2}) {
        if (vs > 1 && (pp == 1 || pp * vs > c.model.n_layers)) continue;
        for (int etp : etps) {
          for (int ep : eps) {
            if (world % (int64_t{etp} * ep * pp) == 0) out.push_back({tp, pp, vs, etp, ep});
          }
        }
      }
    }
  }
  return out;
}

}  // namespace

LayoutSearch SearchLayouts(const config::Config& base, int world) {
  LayoutSearch search;
  const config::ParallelConfig& bp = base.parallel;
  search.global_batch = int64_t{world} / (int64_t{bp.tp} * bp.cp * bp.pp) * base.train.micro_batch_size *
                        base.train.grad_accum;
  const model::Recompute recomputes[] = {model::Recompute::kNone, model::Recompute::kSelective,
                                         model::Recompute::kFull};
  double fraction[3];
  for (int i = 0; i < 3; ++i) fraction[i] = RecomputeFraction(base, recomputes[i]);
  std::vector<LayoutCandidate> fitting;
  for (const Shape& s : Shapes(base, world)) {
    const int64_t dp = world / (s.tp * s.pp);
    if (search.global_batch % dp != 0) continue;
    const int64_t per_replica = search.global_batch / dp;
    auto mesh = dist::Mesh::Create(world, {.tp = s.tp, .cp = 1, .ep = s.ep, .etp = s.etp, .pp = s.pp}, bp.order);
    if (!mesh.ok()) continue;
    std::vector<int> ranks;  // one rank per pipeline rank (tp rank 0 holds the most vocabulary)
    for (int r : DistinctRanks(*mesh))
      if (mesh->Coord(r, dist::View::kDense, dist::Axis::kTp) == 0) ranks.push_back(r);
    for (int64_t mb = 1; mb <= per_replica; mb *= 2) {
      if (per_replica % mb != 0) continue;
      for (int ri = 0; ri < 3; ++ri) {
        for (int zero = 0; zero <= 3; ++zero) {
          LayoutCandidate cand;
          config::Config& c = cand.config;
          c = base;
          c.parallel.tp = s.tp, c.parallel.cp = 1, c.parallel.pp = s.pp, c.parallel.ep = s.ep;
          c.parallel.etp = s.etp == s.tp ? 0 : s.etp;
          c.parallel.virtual_stages = s.vs;
          c.parallel.pipeline_schedule = s.vs > 1 ? parallel::PipelineSchedule::kInterleaved
                                                  : parallel::PipelineSchedule::kOneFOneB;
          c.parallel.pipeline_layers.clear();
          c.parallel.zero_stage = zero;
          c.train.micro_batch_size = mb;
          c.train.grad_accum = per_replica / mb;
          c.train.recompute = recomputes[ri];
          if (!c.Validate(world).ok()) continue;
          ++search.tried;
          cand.fit = PredictDeviceFit(c, *mesh, ranks);
          cand.work = (1 + fraction[ri]) * (1 + double(s.pp - 1) / (s.vs * double(c.train.grad_accum)));
          if (cand.fit.fits()) fitting.push_back(cand);
        }
      }
    }
  }
  for (const LayoutCandidate& c : fitting) {
    bool beaten = false;
    for (const LayoutCandidate& o : fitting) beaten = beaten || Dominates(o, c);
    if (!beaten) search.best.push_back(c);
  }
  std::sort(search.best.begin(), search.best.end(), [&](const auto& a, const auto& b) {
    return std::tuple_cat(Cost(a), std::tuple(a.fit.peak)) < std::tuple_cat(Cost(b), std::tuple(b.fit.peak));
  });
  return search;
}

std::string LayoutSearchReport(const LayoutSearch& s, int world, double device_gib, int rows) {
  std::ostringstream out;
  out << "layout search: world " << world << ", " << device_gib << " GiB per device, global batch "
      << s.global_batch << " sequences; " << s.tried << " layouts costed, " << s.best.size()
      << " on the front (no other fitting layout is better on all of peak, work, ZeRO stage and tp);"
      << " least work first, then ZeRO stage, tp, peak\n";
  if (s.best.empty()) {
    out << "  no layout fits\n";
    return out.str();
  }
  char line[320];
  std::snprintf(line, sizeof(line), "  %12s %11s  %2s %2s %2s %4s %2s %3s %4s %3s %5s %-9s %6s\n", "peak",
                "margin", "tp", "pp", "v", "dp", "ep", "etp", "zero", "mb", "accum", "recompute", "work");
  out << line;
  for (int i = 0; i < std::min<int>(rows, static_cast<int>(s.best.size())); ++i) {
    const LayoutCandidate& c = s.best[i];
    const config::ParallelConfig& p = c.config.parallel;
    const double peak = c.fit.peak;
    std::snprintf(line, sizeof(line), "  %12s %11s  %2d %2d %2d %4d %2d %3d %4d %3lld %5lld %-9s %6.3f\n",
                  FormatBytes(peak).c_str(), FormatBytes(c.fit.device - peak).c_str(), p.tp, p.pp,
                  p.virtual_stages, int(world / (p.tp * p.pp)), p.ep, p.expert_tp(), p.zero_stage,
                  static_cast<long long>(c.config.train.micro_batch_size),
                  static_cast<long long>(c.config.train.grad_accum), model::RecomputeName(c.config.train.recompute),
                  c.work);
    out << line;
  }
  return out.str();
}

}  // namespace switchyard::plan
