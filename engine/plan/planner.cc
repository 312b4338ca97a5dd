#include "engine/plan/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

#include "engine/dist/mesh.h"
#include "engine/plan/device_fit.h"
#include "engine/plan/dry_run.h"

namespace switchyard::plan {
namespace {

using parallel::PipelineSchedule;

std::vector<int> Divisors(int64_t n) {
  std::vector<int> out;
  for (int64_t d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(static_cast<int>(d));
  }
  return out;
}

bool HasMoE(const config::Config& c) {
  if (c.moe.num_experts <= 1) return false;
  return c.model.n_layers >= c.moe.layer_freq;
}

// (schedule, virtual stages) pairs for pp stages of a model of n_layers.
std::vector<std::pair<PipelineSchedule, int>> Schedules(const PlanInputs::Scope& scope, int pp,
                                                        int64_t n_layers) {
  if (pp == 1) return {{PipelineSchedule::kOneFOneB, 1}};
  std::vector<std::pair<PipelineSchedule, int>> out;
  if (scope.gpipe) out.push_back({PipelineSchedule::kGPipe, 1});
  out.push_back({PipelineSchedule::kOneFOneB, 1});
  for (int v : scope.virtual_stages) {
    if (int64_t{pp} * v <= n_layers) out.push_back({PipelineSchedule::kInterleaved, v});
  }
  return out;
}

// The batch splits of one replica: (micro-batch size, micro-batches).
std::vector<std::pair<int64_t, int64_t>> BatchSplits(const PlanInputs::Scope& scope,
                                                     int64_t global_batch, int dp) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (global_batch % dp != 0) return out;
  const int64_t per = global_batch / dp;
  std::vector<int64_t> sizes = scope.micro_batch_sizes;
  if (sizes.empty()) {
    for (int64_t mbs = 1; mbs <= per; mbs *= 2) sizes.push_back(mbs);
  }
  for (int64_t mbs : sizes) {
    if (per % mbs == 0) out.push_back({mbs, per / mbs});
  }
  return out;
}

// The rest of the search below one (tp, cp, pp, ep, etp).
void Expand(const PlanInputs& in, Layout base, std::vector<Layout>& out) {
  for (auto [schedule, v] : Schedules(in.scope, base.pp, in.config.model.n_layers)) {
    for (auto [mbs, m] : BatchSplits(in.scope, in.global_batch, base.dp(in.world))) {
      for (int zero = 0; zero <= 3; ++zero) {
        for (model::Recompute r : {model::Recompute::kNone, model::Recompute::kSelective,
                                   model::Recompute::kFull}) {
          Layout l = base;
          l.schedule = schedule, l.virtual_stages = v, l.micro_batch_size = mbs;
          l.micro_batches = m, l.zero_stage = zero, l.recompute = r;
          out.push_back(l);
        }
      }
    }
  }
}

}  // namespace

std::vector<Layout> SearchSpace(const PlanInputs& in) {
  std::vector<Layout> out;
  const config::Config& c = in.config;
  for (int tp : Divisors(in.world)) {
    if (tp > c.model.n_heads || (in.max_tp > 0 && tp > in.max_tp)) continue;
    for (int cp : in.scope.cp ? Divisors(in.world / tp) : std::vector<int>{1}) {
      for (int pp : Divisors(in.world / (tp * cp))) {
        if (pp > c.model.n_layers) continue;
        const std::vector<int> eps = HasMoE(c) ? Divisors(in.world / pp) : std::vector<int>{1};
        for (int ep : eps) {
          const std::vector<int> etps = !HasMoE(c) || tp == 1 ? std::vector<int>{tp} : std::vector<int>{1, tp};
          for (int etp : etps) {
            Expand(in, Layout{.tp = tp, .cp = cp, .pp = pp, .ep = ep, .etp = etp,
                              .head_chunk_tokens = c.train.head_chunk_tokens}, out);
          }
        }
      }
    }
  }
  return out;
}

std::vector<Layout> EnumerateLayouts(const PlanInputs& in) {
  std::vector<Layout> out;
  // Validate reads the parallel sizes, the schedule and the micro-batch count, and ZeRO
  // only for its range (0-3, all searched): one call per (sizes, schedule, micro-batches).
  std::map<std::tuple<int, int, int, int, int, int, int, int64_t>, bool> seen;
  for (const Layout& l : SearchSpace(in)) {
    const auto key = std::tuple(l.tp, l.cp, l.pp, l.ep, l.etp, int(l.schedule), l.virtual_stages,
                                l.micro_batches);
    auto it = seen.find(key);
    if (it == seen.end()) {
      const config::Config c = l.Apply(in.config);
      it = seen.emplace(key, c.parallel.Validate(c.model, c.moe, c.train.grad_accum, in.world).ok()).first;
    }
    if (it->second) out.push_back(l);
  }
  return out;
}

int64_t FallbackHeadChunk(const PlanInputs& in, const config::Config& layout) {
  if (!in.scope.head_chunk || layout.train.head_chunk_tokens > 0) return 0;
  return SuggestedHeadChunk(layout);
}

config::Config DeviceConfig(const PlanInputs& in, const Layout& layout) {
  config::Config c = layout.Apply(in.config);
  c.runtime.device = config::RuntimeDevice{.type = DeviceType::kCUDA};
  // The engine keeps no fp8 tensor: fp8 and fp8-cs products hold what bf16 ones do.
  c.runtime.precision = in.precision == "fp32" ? config::Precision::kFp32 : config::Precision::kBf16;
  return c;
}

namespace {

// The largest of per_rank(config, mesh, rank) over the layout's pipeline stages (each stage's
// first rank) on the device the plan is for. Every stage: the ends hold the embedding and
// the head but fewer layers, so a middle stage (more layers, more micro-batches in flight)
// is often the largest.
template <typename F>
double LargestStage(const PlanInputs& in, const Layout& layout, F&& per_rank) {
  const config::Config c = DeviceConfig(in, layout);
  SY_CHECK_OK(c.runtime.Validate());
  auto mesh = dist::Mesh::Create(in.world, c.parallel.MeshSizes(), c.parallel.order);
  SY_CHECK_OK(mesh.status());
  double largest = 0;
  for (int want = 0; want < layout.pp; ++want) {
    int rank = 0;
    while (mesh->Coord(rank, dist::View::kDense, dist::Axis::kPp) != want) ++rank;
    largest = std::max(largest, per_rank(c, *mesh, rank));
  }
  return largest;
}

}  // namespace

double PeakMemory(const PlanInputs& in, const Layout& layout) {
  return LargestStage(in, layout, PredictRankPeak);
}

double PeakFloor(const PlanInputs& in, const Layout& layout) {
  return LargestStage(in, layout, PredictRankFloor);
}

Candidate Evaluate(const PlanInputs& in, const Layout& layout, const Hardware& hw, CostCache& cache) {
  Candidate c;
  c.layout = layout;
  c.time = PredictStepTime(in, layout, hw, cache);
  c.tokens_per_s = double(in.global_batch) * in.config.model.seq_len / c.time.total();
  c.flops_per_gpu = cache.FlopsPerToken(in.config) * c.tokens_per_s / in.world;
  c.mfu = c.flops_per_gpu / hw.Peak(in.precision);
  return c;
}

namespace {

// The walks of the step, none fitting, after which the search in time order asks whether any
// layout can fit at all: 1 for every kLayoutsPerWalk layouts, at least kLeastWalks. Asking
// takes every layout's floor (a mesh each), so a search that finds a fit sooner should not pay
// for it: Mixtral 8x7B on 1024 GPUs walks 718 of 292,200 layouts before the first fits.
constexpr int64_t kLayoutsPerWalk = 256, kLeastWalks = 64;

// When even the least floor of all layouts (PeakFloor) exceeds the device, nothing fits, and
// `smallest` (what the error names) is found in order of the floors: from the least, until
// they pass the least peak found. Ties go to the faster layout and then to its whole head, as
// in the search in time order, so the answer is that search's. A layout's floor is the lesser
// of its head whole and in chunks (the chunks are workspace). `floors[i]`, all[i]'s
// whole-head floor when not NaN, is filled in. Returns false when some layout's floor fits.
bool SmallestWhenNoneCanFit(const PlanInputs& in, const Hardware& hw, const std::vector<Candidate>& all,
                            CostCache& cache, std::vector<double>& floors, PlanResult& result) {
  std::vector<std::pair<double, size_t>> order;
  order.reserve(all.size());
  std::vector<Layout> chunked(all.size());  // each layout's head in chunks (0 tokens: none)
  for (size_t i = 0; i < all.size(); ++i) {
    if (std::isnan(floors[i])) floors[i] = PeakFloor(in, all[i].layout);
    chunked[i] = all[i].layout;
    if (chunked[i].head_chunk_tokens == 0) {
      chunked[i].head_chunk_tokens = FallbackHeadChunk(in, chunked[i].Apply(in.config));
    }
    const bool chunks = chunked[i].head_chunk_tokens != all[i].layout.head_chunk_tokens;
    order.push_back({chunks ? std::min(floors[i], PeakFloor(in, chunked[i])) : floors[i], i});
  }
  std::sort(order.begin(), order.end());
  if (order.empty() || order.front().first <= hw.memory_bytes) return false;
  result.floors_exceed_device = true;
  result.memory_checked = 0;
  std::tuple<double, size_t, int> least{INFINITY, 0, 0};  // (peak, index in all, head chunked)
  const auto walk = [&](Candidate c, size_t i, int chunked) {
    c.peak_bytes = PeakMemory(in, c.layout);
    c.fits = false;
    ++result.memory_checked;
    if (std::tuple(c.peak_bytes, i, chunked) < least) least = {c.peak_bytes, i, chunked}, result.smallest = c;
  };
  int64_t walked = 0;
  for (auto [floor, i] : order) {
    if (floor > std::get<0>(least)) break;
    ++walked;
    walk(all[i], i, 0);
    if (chunked[i].head_chunk_tokens != all[i].layout.head_chunk_tokens) {
      walk(Evaluate(in, chunked[i], hw, cache), i, 1);
    }
  }
  result.memory_skipped = static_cast<int64_t>(all.size()) - walked;
  return true;
}

}  // namespace

PlanResult Plan(const PlanInputs& in, const Hardware& hw, const PlanOptions& options) {
  PlanResult result;
  result.searched = static_cast<int64_t>(SearchSpace(in).size());
  const std::vector<Layout> layouts = EnumerateLayouts(in);
  result.valid = static_cast<int64_t>(layouts.size());
  CostCache cache;
  std::vector<Candidate> all;
  all.reserve(layouts.size());
  for (const Layout& l : layouts) all.push_back(Evaluate(in, l, hw, cache));
  std::sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
    if (a.time.total() != b.time.total()) return a.time.total() < b.time.total();
    return a.layout.Key() < b.layout.Key();
  });
  // Memory last: from the fastest down until `top` layouts fit. A layout that does not fit
  // with the head whole is tried with the head in chunks, which is slower (one more head
  // forward): a chunked layout that fits waits in `chunked` until the next layout is slower.
  std::vector<Candidate> chunked;  // slowest first
  auto full = [&] { return static_cast<int>(result.best.size()) >= options.top; };
  auto take_chunked_before = [&](double seconds) {
    while (!full() && !chunked.empty() && chunked.back().time.total() <= seconds) {
      result.best.push_back(chunked.back());
      chunked.pop_back();
    }
  };
  std::vector<double> floors(all.size(), NAN);  // PeakFloor of all[i] once computed
  bool asked = false;  // whether SmallestWhenNoneCanFit has run
  auto check = [&](Candidate& c, size_t i) {
    // A layout whose floor exceeds the device, and the smallest peak seen so far, can
    // neither fit nor be the smallest: its step's walk (most of a search where
    // little fits) is skipped, and the result is the same.
    if (result.smallest.peak_bytes > 0) {
      double floor = i < floors.size() ? floors[i] : PeakFloor(in, c.layout);
      if (std::isnan(floor)) floor = floors[i] = PeakFloor(in, c.layout);
      if (floor > hw.memory_bytes && floor >= result.smallest.peak_bytes) {
        c.fits = false;
        ++result.memory_skipped;
        return;
      }
    }
    c.peak_bytes = PeakMemory(in, c.layout);
    ++result.memory_checked;
    c.fits = c.peak_bytes <= hw.memory_bytes;
    if (result.smallest.peak_bytes == 0 || c.peak_bytes < result.smallest.peak_bytes) result.smallest = c;
  };
  for (size_t i = 0; i < all.size(); ++i) {
    Candidate& c = all[i];
    take_chunked_before(c.time.total());
    if (full()) break;
    const int64_t ask_after = std::max(kLeastWalks, static_cast<int64_t>(all.size()) / kLayoutsPerWalk);
    if (!asked && result.memory_checked >= ask_after && result.best.empty() && chunked.empty()) {
      asked = true;
      if (SmallestWhenNoneCanFit(in, hw, all, cache, floors, result)) return result;
    }
    check(c, i);
    if (c.fits) {
      result.best.push_back(c);
      continue;
    }
    if (in.scope.head_chunk && c.layout.head_chunk_tokens == 0) {
      Layout l = c.layout;
      l.head_chunk_tokens = FallbackHeadChunk(in, l.Apply(in.config));
      if (l.head_chunk_tokens == 0) continue;
      Candidate h = Evaluate(in, l, hw, cache);
      check(h, all.size());  // its own floor: the head's chunks are workspace
      if (!h.fits) continue;
      auto at = std::upper_bound(chunked.begin(), chunked.end(), h, [](const Candidate& a, const Candidate& b) {
        return a.time.total() > b.time.total();
      });
      chunked.insert(at, h);
    }
  }
  take_chunked_before(INFINITY);
  return result;
}

std::string FormatCandidates(const std::vector<Candidate>& rows, int world) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line), "%4s %-66s %10s %11s %7s %6s %10s  %s\n", "rank", "layout",
                "step (s)", "tokens/s", "TFLOP/s", "MFU", "memory", 
                "share: compute tp cp ep dp pp bubble (%)");
  out += line;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Candidate& c = rows[i];
    const StepTime& t = c.time;
    const double T = t.total();
    std::snprintf(line, sizeof(line),
                  "%4zu %-66s %10.4g %11.5g %7.1f %5.1f%% %10s  %.0f %.0f %.0f %.0f %.0f %.0f %.0f\n",
                  i + 1, c.layout.Describe(world).c_str(), T, c.tokens_per_s, c.flops_per_gpu / 1e12,
                  100 * c.mfu, c.peak_bytes > 0 ? FormatBytes(c.peak_bytes).c_str() : "-",
                  100 * t.compute / T, 100 * t.tp / T, 100 * t.cp / T, 100 * t.ep / T,
                  100 * t.dp / T, 100 * t.pp / T, 100 * t.bubble / T);
    out += line;
  }
  return out;
}

}  // namespace switchyard::plan
