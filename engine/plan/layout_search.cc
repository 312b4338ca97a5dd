#include "engine/plan/layout_search.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <tuple>

#include <map>
#include <optional>

#include "engine/model/param_table.h"
#include "engine/plan/planner.h"

namespace switchyard::plan {
namespace {

// Recompute's extra forward as a fraction of the step's FLOPs: full redoes every layer's
// forward (a third of 6N + 12LSH), selective the attention core (4 L S H of the 12).
// (A copy of the table's totals: a reference into the temporary table would dangle.)
double RecomputeFraction(const config::Config& c, model::Recompute r) {
  if (r == model::Recompute::kNone) return 0;
  const model::PieceParams all = model::ParamTable::Build(c.model, c.moe).Total();
  const double step = 6.0 * all.matmul + 12.0 * all.attention;
  return r == model::Recompute::kFull ? 1.0 / 3.0 : 4.0 * all.attention / step;
}

// The chunked head's second forward as a fraction of the step's FLOPs (2 d V of 6N + 12LSH).
double HeadChunkFraction(const config::Config& c) {
  const model::PieceParams all = model::ParamTable::Build(c.model, c.moe).Total();
  return 2.0 * double(c.model.d_model) * double(c.model.vocab_size) /
         (6.0 * all.matmul + 12.0 * all.attention);
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

}  // namespace

LayoutSearch SearchLayouts(const config::Config& base, int world) {
  LayoutSearch search;
  const config::ParallelConfig& bp = base.parallel;
  search.global_batch = int64_t{world} / (int64_t{bp.tp} * bp.cp * bp.pp) * base.train.micro_batch_size *
                        base.train.grad_accum;
  // The planner's enumeration and layout check (planner.h), over the part of its space this
  // search spans: tp inside a node of 8, no cp, 1F1B or interleaved with two virtual stages,
  // every power-of-two micro-batch.
  PlanInputs in;
  in.config = base;
  in.world = world;
  in.global_batch = search.global_batch;
  in.max_tp = 8;
  in.scope = {.cp = false, .gpipe = false, .virtual_stages = {2}, .micro_batch_sizes = {}};
  const double head_fraction = HeadChunkFraction(base);
  double fraction[3];
  for (model::Recompute r : {model::Recompute::kNone, model::Recompute::kSelective, model::Recompute::kFull})
    fraction[int(r)] = RecomputeFraction(base, r);
  // One mesh, and the ranks to cost (one per pipeline rank; tp rank 0 holds the most
  // vocabulary), per model-parallel shape.
  struct MeshRanks {
    dist::Mesh mesh;
    std::vector<int> ranks;
  };
  std::map<std::tuple<int, int, int, int>, std::optional<MeshRanks>> meshes;
  std::vector<LayoutCandidate> fitting;
  for (const Layout& l : EnumerateLayouts(in)) {
    auto [it, fresh] = meshes.try_emplace(std::tuple(l.tp, l.pp, l.ep, l.etp));
    if (fresh) {
      auto mesh = dist::Mesh::Create(world, {.tp = l.tp, .cp = 1, .ep = l.ep, .etp = l.etp, .pp = l.pp}, bp.order);
      if (mesh.ok()) {
        std::vector<int> ranks;
        for (int r : DistinctRanks(*mesh))
          if (mesh->Coord(r, dist::View::kDense, dist::Axis::kTp) == 0) ranks.push_back(r);
        it->second = MeshRanks{std::move(*mesh), std::move(ranks)};
      }
    }
    if (!it->second) continue;
    LayoutCandidate cand;
    cand.config = l.Apply(base);
    if (!cand.config.Validate(world).ok()) continue;
    ++search.tried;
    cand.fit = PredictDeviceFit(cand.config, it->second->mesh, it->second->ranks);
    double extra = fraction[int(l.recompute)];
    // As the planner: where the whole head does not fit, the head in chunks.
    if (const int64_t chunk = cand.fit.fits() ? 0 : FallbackHeadChunk(in, cand.config); chunk > 0) {
      cand.config.train.head_chunk_tokens = chunk;
      cand.fit = PredictDeviceFit(cand.config, it->second->mesh, it->second->ranks);
      extra += head_fraction;
    }
    cand.work = (1 + extra) * (1 + double(l.pp - 1) / (l.virtual_stages * double(l.micro_batches)));
    if (cand.fit.fits()) fitting.push_back(std::move(cand));
  }
  for (const LayoutCandidate& c : fitting) {
    bool beaten = false;
    for (const LayoutCandidate& o : fitting) beaten = beaten || Dominates(o, c);
    if (!beaten) search.best.push_back(c);
  }
  std::stable_sort(search.best.begin(), search.best.end(), [&](const auto& a, const auto& b) {
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
  std::snprintf(line, sizeof(line), "  %12s %11s  %2s %2s %2s %4s %2s %3s %4s %3s %5s %-9s %10s %6s\n",
                "peak", "margin", "tp", "pp", "v", "dp", "ep", "etp", "zero", "mb", "accum", "recompute",
                "head chunk", "work");
  out << line;
  for (int i = 0; i < std::min<int>(rows, static_cast<int>(s.best.size())); ++i) {
    const LayoutCandidate& c = s.best[i];
    const config::ParallelConfig& p = c.config.parallel;
    const double peak = c.fit.peak;
    const int64_t chunk = c.config.train.head_chunk_tokens;
    std::snprintf(line, sizeof(line), "  %12s %11s  %2d %2d %2d %4d %2d %3d %4d %3lld %5lld %-9s %10s %6.3f\n",
                  FormatBytes(peak).c_str(), FormatBytes(c.fit.device - peak).c_str(), p.tp, p.pp,
                  p.virtual_stages, int(world / (p.tp * p.pp)), p.ep, p.expert_tp(), p.zero_stage,
                  static_cast<long long>(c.config.train.micro_batch_size),
                  static_cast<long long>(c.config.train.grad_accum), model::RecomputeName(c.config.train.recompute),
                  chunk > 0 ? std::to_string(chunk).c_str() : "-", c.work);
    out << line;
  }
  return out.str();
}

}  // namespace switchyard::plan
