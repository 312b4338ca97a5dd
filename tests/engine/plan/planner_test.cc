// The planner (engine/plan/planner.h, cost_model.h, hardware.h) on one process:
//  - EnumerationIsEveryValidLayout: on worlds of 8 and 12 ranks, every (tp, cp, pp, ep, etp)
//    between 1 and the world that dist::Mesh::Create (switchyard mesh's validation) and
//    ParallelConfig::Validate accept is enumerated, and nothing else is;
//  - PlanIsDeterministic: two searches give the same rows bit for bit;
//  - PeakMemoryIsTheDryRunsOnTheDevice: the planner's memory is `train --dry-run`'s
//    (PredictDeviceFit) for the layout on a GPU at the planned precision, every rank
//    compared (middle pipeline stages included), and it follows runtime.activation_dtype;
//  - TensorParallelTimeByHand: the tp share of a one-layer dense model against the ring
//    formula of docs/plan.md, computed by hand;
//  - DataParallelTimeByHand: the data-parallel sync of ZeRO 0 and 1 likewise;
//  - HeadChunksWhereTheWholeHeadDoesNotFit: a layout that fits only with the head in chunks
//    is returned so, in its order by time, and only then;
//  - StepTimeGrowsWithSkew / SkewFromRoutingLog / AllToAllCrossesNodesOnlyBeyondANode:
//    the MoE terms;
//  - Fp8CastsByHand / Fp8DispatchByHand: the fp8 terms of docs/plan.md by hand;
//  - CpuNodeSharesCoresAndPaysPerOperation: cores_per_node and op_latency by hand;
//  - hardware files: hardware_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "engine/config/config.h"
#include "engine/dist/mesh.h"
#include "engine/model/param_table.h"
#include "engine/plan/device_fit.h"
#include "engine/plan/hardware.h"
#include "engine/plan/planner.h"
#include "tests/engine/plan/round_hardware.h"

namespace switchyard::plan {
namespace {

// 4 layers (2 MoE of 8 experts), 4 heads, seq 64.
constexpr char kMoE[] = R"(
model: {vocab_size: 512, seq_len: 64, d_model: 64, n_layers: 4, n_heads: 4, d_ff: 256}
moe: {num_experts: 8, layer_freq: 2, top_k: 2, d_expert: 96, capacity_factor: 0}
train: {micro_batch_size: 2, grad_accum: 2}
)";

config::Config Parse(const char* yaml) {
  auto c = config::ParseConfig(yaml, "<test>");
  SY_CHECK_OK(c.status());
  return *c;
}

Hardware Round() {
  auto h = ParseHardware(kRoundHardware, "<round>");
  SY_CHECK_OK(h.status());
  return *h;
}

PlanInputs Inputs(const config::Config& c, int world, int64_t batch) {
  PlanInputs in;
  in.config = c;
  in.world = world;
  in.global_batch = batch;
  return in;
}

using Sizes = std::tuple<int, int, int, int, int>;  // tp, cp, pp, ep, etp

TEST(PlannerTest, EnumerationIsEveryValidLayout) {
  for (int world : {8, 12}) {
    PlanInputs in = Inputs(Parse(kMoE), world, 24);
    std::set<Sizes> found;
    for (const Layout& l : EnumerateLayouts(in)) {
      found.insert({l.tp, l.cp, l.pp, l.ep, l.etp});
      // Every enumerated layout passes the one check and is a mesh.
      const config::Config c = l.Apply(in.config);
      ASSERT_TRUE(c.parallel.Validate(c.model, c.moe, c.train.grad_accum, world).ok()) << l.Describe(world);
      EXPECT_EQ(l.micro_batch_size * l.micro_batches * l.dp(world), 24);
    }
    std::set<Sizes> expected;
    for (int tp = 1; tp <= world; ++tp)
      for (int cp = 1; cp <= world; ++cp)
        for (int pp = 1; pp <= world; ++pp)
          for (int ep = 1; ep <= world; ++ep)
            for (int etp : {1, tp}) {
              if (!dist::Mesh::Create(world, {.tp = tp, .cp = cp, .ep = ep, .etp = etp, .pp = pp}).ok()) continue;
              config::Config c = in.config;
              c.parallel.tp = tp, c.parallel.cp = cp, c.parallel.pp = pp, c.parallel.ep = ep;
              c.parallel.etp = etp;
              const int dp = world / (tp * cp * pp);
              if (24 % dp != 0) continue;  // the batch cannot be split
              c.train.micro_batch_size = 1, c.train.grad_accum = 24 / dp;
              if (c.parallel.Validate(c.model, c.moe, c.train.grad_accum, world).ok()) {
                expected.insert({tp, cp, pp, ep, etp});
              }
            }
    EXPECT_EQ(found, expected) << "world " << world;
    EXPECT_GT(expected.size(), 10u);
  }
}

TEST(PlannerTest, PlanIsDeterministic) {
  const PlanInputs in = Inputs(Parse(kMoE), 8, 32);
  const PlanResult a = Plan(in, Round(), {.top = 20});
  const PlanResult b = Plan(in, Round(), {.top = 20});
  ASSERT_EQ(a.best.size(), 20u);
  ASSERT_EQ(a.best.size(), b.best.size());
  for (size_t i = 0; i < a.best.size(); ++i) {
    EXPECT_EQ(a.best[i].layout.Key(), b.best[i].layout.Key());
    EXPECT_EQ(a.best[i].time.total(), b.best[i].time.total());
    EXPECT_EQ(a.best[i].peak_bytes, b.best[i].peak_bytes);
    if (i > 0) {
      EXPECT_LE(a.best[i - 1].time.total(), a.best[i].time.total());
    }
  }
}

TEST(PlannerTest, PeakMemoryIsTheDryRunsOnTheDevice) {
  PlanInputs in = Inputs(Parse(kMoE), 8, 32);
  int compared = 0, middle = 0;
  for (const char* precision : {"bf16", "fp32", "fp8"}) {
    in.precision = precision;
    for (const Layout& l : EnumerateLayouts(in)) {
      const config::Config c = DeviceConfig(in, l);
      ASSERT_FALSE(c.runtime.device.is_cpu());
      ASSERT_EQ(c.runtime.bf16_products(), std::string(precision) != "fp32");
      auto mesh = dist::Mesh::Create(in.world, c.parallel.MeshSizes(), c.parallel.order);
      ASSERT_TRUE(mesh.ok()) << mesh.status();
      // Every distinct rank (each pipeline and tensor-parallel coordinate) against the
      // planner's pipeline stages: the same peak.
      const DeviceFit fit = PredictDeviceFit(c, *mesh);
      EXPECT_EQ(PeakMemory(in, l), fit.peak) << precision << " " << l.Describe(in.world);
      ++compared;
      const int stage = mesh->Coord(fit.rank, dist::View::kDense, dist::Axis::kPp);
      if (stage > 0 && stage < l.pp - 1) ++middle;
    }
  }
  EXPECT_GT(compared, 100);
  // Layouts whose largest rank is a middle pipeline stage are among them (the planner once
  // compared only the first and the last stage, and picked layouts that did not fit).
  EXPECT_GT(middle, 0);
  // fp8 keeps what bf16 keeps (the engine has no fp8 tensor); fp32 products keep no bf16
  // weight shadows, so at ZeRO 0 they need less than bf16 ones.
  const Layout zero0{.ep = 2, .micro_batch_size = 2, .micro_batches = 2};
  in.precision = "fp8";
  const double fp8 = PeakMemory(in, zero0);
  in.precision = "bf16";
  const double bf16 = PeakMemory(in, zero0);
  EXPECT_EQ(fp8, bf16);
  in.precision = "fp32";
  EXPECT_LT(PeakMemory(in, zero0), bf16);
  // Activations kept in bf16 lower the peak, as the dry-run counts them.
  in.precision = "bf16";
  in.config.runtime.activation_dtype = config::ActivationDtype::kBf16;
  EXPECT_LT(PeakMemory(in, zero0), bf16);
  // The search reports the same figure for what it returns.
  const PlanResult result = Plan(in, Round(), {.top = 5});
  ASSERT_EQ(result.best.size(), 5u);
  for (const Candidate& c : result.best) EXPECT_EQ(c.peak_bytes, PeakMemory(in, c.layout));
}

// A config's own layer split (parallel.pipeline_layers, --config-layout) is the one planned:
// its peak is the dry-run's, and moving layers to a stage changes the predicted step.
TEST(PlannerTest, ConfigLayerSplitIsPlanned) {
  PlanInputs in = Inputs(Parse(kMoE), 2, 4);
  std::map<std::vector<int64_t>, double> times;
  for (const std::vector<int64_t>& layers :
       std::vector<std::vector<int64_t>>{{1, 3}, {3, 1}, {2, 2}}) {
    config::Config c = in.config;
    c.parallel.pp = 2;
    c.parallel.pipeline_layers = layers;
    const Layout l = LayoutOf(c);
    EXPECT_EQ(l.pipeline_layers, layers);
    const config::Config device = DeviceConfig(in, l);
    EXPECT_EQ(device.parallel.pipeline_layers, layers);
    auto mesh = dist::Mesh::Create(in.world, device.parallel.MeshSizes(), device.parallel.order);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    EXPECT_EQ(PeakMemory(in, l), PredictDeviceFit(device, *mesh).peak) << l.Describe(2);
    CostCache cache;
    times[layers] = PredictStepTime(in, l, Round(), cache).total();
    EXPECT_NE(l.Describe(2).find(StrCat(" layers [", layers[0], ", ", layers[1], "]")),
              std::string::npos);
  }
  // The slowest stage paces the pipeline: three layers on one stage is slower than two.
  const double even = times[{2, 2}];
  EXPECT_GT((times[{1, 3}]), even);
  EXPECT_GT((times[{3, 1}]), even);
}

// A vocabulary of 32768 on 64-token sequences: each micro-batch's f32 logits (mbs x 64 x 32768
// x 4 bytes) outweigh the rest, so some device sizes fit only with the head in chunks.
TEST(PlannerTest, HeadChunksWhereTheWholeHeadDoesNotFit) {
  config::Config c = Parse(kMoE);
  c.model.vocab_size = 32768;
  PlanInputs whole = Inputs(c, 8, 32);
  whole.scope.head_chunk = false;
  PlanInputs chunked = whole;
  chunked.scope.head_chunk = true;
  Hardware hw = Round();
  hw.memory_bytes = 1;  // nothing fits: `smallest` is the layout of least memory
  const PlanResult none_whole = Plan(whole, hw, {.top = 1});
  const PlanResult none_chunked = Plan(chunked, hw, {.top = 1});
  ASSERT_TRUE(none_whole.best.empty());
  ASSERT_TRUE(none_chunked.best.empty());
  const double least_whole = none_whole.smallest.peak_bytes;
  const double least_chunked = none_chunked.smallest.peak_bytes;
  EXPECT_EQ(none_whole.smallest.layout.head_chunk_tokens, 0);
  EXPECT_GT(none_chunked.smallest.layout.head_chunk_tokens, 0);
  ASSERT_LT(least_chunked, 0.9 * least_whole);
  // `smallest` is exact although layouts whose floor (model states and one micro-batch's
  // activations) exceeds the device and the smallest peak seen were not walked: the least
  // PeakMemory of every layout, by brute force. Both searches are past the point where the
  // planner sees that no floor fits, and then walks the layouts in order of their floors.
  EXPECT_TRUE(none_whole.floors_exceed_device);
  EXPECT_TRUE(none_chunked.floors_exceed_device);
  double brute = INFINITY, brute_chunked = INFINITY;
  for (const Layout& l : EnumerateLayouts(whole)) {
    brute = std::min(brute, PeakMemory(whole, l));
    EXPECT_LE(PeakFloor(whole, l), PeakMemory(whole, l)) << l.Describe(8);
    Layout h = l;
    h.head_chunk_tokens = FallbackHeadChunk(chunked, h.Apply(chunked.config));
    brute_chunked = std::min({brute_chunked, PeakMemory(chunked, l), PeakMemory(chunked, h)});
    EXPECT_LE(PeakFloor(chunked, h), PeakMemory(chunked, h)) << h.Describe(8);
  }
  EXPECT_EQ(least_whole, brute);
  EXPECT_EQ(least_chunked, brute_chunked);
  EXPECT_GT(none_whole.memory_skipped, 0);
  EXPECT_EQ(none_whole.memory_checked + none_whole.memory_skipped, none_whole.valid);

  // Between the two: only chunked layouts fit, fastest first, each at the dry-run's peak and
  // slower than the same layout with the head whole (one more head forward).
  hw.memory_bytes = (least_whole + least_chunked) / 2;
  EXPECT_TRUE(Plan(whole, hw, {.top = 5}).best.empty());
  const PlanResult fit = Plan(chunked, hw, {.top = 5});
  ASSERT_FALSE(fit.best.empty());
  EXPECT_FALSE(fit.floors_exceed_device);
  CostCache cache;
  for (size_t i = 0; i < fit.best.size(); ++i) {
    const Candidate& got = fit.best[i];
    SCOPED_TRACE(got.layout.Describe(8));
    EXPECT_EQ(got.layout.head_chunk_tokens, SuggestedHeadChunk(got.layout.Apply(c)));
    EXPECT_LE(got.peak_bytes, hw.memory_bytes);
    EXPECT_EQ(got.peak_bytes, PeakMemory(chunked, got.layout));
    Layout as_whole = got.layout;
    as_whole.head_chunk_tokens = 0;
    EXPECT_GT(PeakMemory(chunked, as_whole), hw.memory_bytes);
    EXPECT_GT(got.time.total(), Evaluate(chunked, as_whole, hw, cache).time.total());
    if (i > 0) {
      EXPECT_LE(fit.best[i - 1].time.total(), got.time.total());
    }
  }
  EXPECT_NE(fit.best[0].layout.Describe(8).find(" head chunk "), std::string::npos);

  // Where the whole head fits, the search returns the whole head's layouts alone.
  hw.memory_bytes = 1e12;
  const PlanResult roomy = Plan(chunked, hw, {.top = 20});
  ASSERT_EQ(roomy.best.size(), 20u);
  for (const Candidate& got : roomy.best) EXPECT_EQ(got.layout.head_chunk_tokens, 0);
}

TEST(PlannerTest, TensorParallelTimeByHand) {
  config::Config c = Parse(R"(
model: {vocab_size: 512, seq_len: 32, d_model: 64, n_layers: 1, n_heads: 4, d_ff: 256}
moe: {num_experts: 1, layer_freq: 1000, top_k: 1, d_expert: 256}
)");
  const Layout l{.tp = 2, .micro_batch_size = 4, .micro_batches = 3};
  PlanInputs in = Inputs(c, 2, 12);
  CostCache cache;
  const StepTime t = PredictStepTime(in, l, Round(), cache);
  // One dense layer, sequence parallel: all-gather + reduce-scatter around attention and
  // around the MLP (4 ring steps of p - 1 = 1 hop, each moving t d b / p bytes), forward
  // and backward, per micro-batch: t = 4 x 32 tokens, d 64, b 2 (bf16).
  const double hop = 1e-5 + 4.0 * 32 * 64 * 2 / 2 / 1e10;
  EXPECT_NEAR(t.tp, 3 * 2 * 4 * hop, 1e-12 * t.tp);
  EXPECT_EQ(t.cp, 0);
  EXPECT_EQ(t.ep, 0);
  EXPECT_EQ(t.pp, 0);
  EXPECT_EQ(t.bubble, 0);
  EXPECT_EQ(t.dp, 0);  // dp = 1: nothing to sum
}

TEST(PlannerTest, DataParallelTimeByHand) {
  // One dense layer on 2 data-parallel ranks, gradients summed in the ordered tree (nothing
  // overlaps): ZeRO 0 all-reduces 4-byte gradients of every parameter, 2 (p - 1) ring steps
  // of 4 N / p bytes, plus the latencies of the buckets after the first; ZeRO 1 reduce-
  // scatters them and all-gathers the bf16 weights after the step.
  config::Config c = Parse(R"(
model: {vocab_size: 512, seq_len: 32, d_model: 64, n_layers: 1, n_heads: 4, d_ff: 256}
moe: {num_experts: 1, layer_freq: 1000, top_k: 1, d_expert: 256}
train: {ordered_grad_accum: true, bucket_mb: 0.0625}
)");
  const double n = double(model::ParamTable::Build(c.model, c.moe).Total().params);
  const double buckets = std::ceil(4 * n / (0.0625 * 1024 * 1024));
  ASSERT_GT(buckets, 1);
  PlanInputs in = Inputs(c, 2, 8);
  const Layout zero0{.micro_batch_size = 2, .micro_batches = 2};
  Layout zero1 = zero0;
  zero1.zero_stage = 1;
  CostCache cache;
  const double reduce_scatter = (1e-5 + 4 * n / 2 / 1e10) + (buckets - 1) * 1e-5;
  const double t0 = PredictStepTime(in, zero0, Round(), cache).dp;
  EXPECT_NEAR(t0, 2 * reduce_scatter, 1e-12 * t0);
  const double t1 = PredictStepTime(in, zero1, Round(), cache).dp;
  EXPECT_NEAR(t1, reduce_scatter + (1e-5 + 2 * n / 2 / 1e10), 1e-12 * t1);
}

TEST(PlannerTest, StepTimeGrowsWithSkew) {
  PlanInputs in = Inputs(Parse(kMoE), 8, 32);
  const Layout ep4{.ep = 4, .micro_batch_size = 2, .micro_batches = 2};
  const Layout ep1{.micro_batch_size = 2, .micro_batches = 2};
  double last = 0, last_ep = 0;
  for (double skew : {1.0, 1.25, 1.5, 2.0, 4.0}) {
    in.skew.constant = skew;
    CostCache cache;
    const StepTime t = PredictStepTime(in, ep4, Round(), cache);
    EXPECT_GT(t.total(), last) << skew;
    EXPECT_GT(t.ep, last_ep) << skew;
    last = t.total(), last_ep = t.ep;
    // One expert-parallel rank holds every expert: no skew between ranks.
    PlanInputs flat = in;
    flat.skew.constant = 1;
    CostCache c2, c3;
    EXPECT_EQ(PredictStepTime(in, ep1, Round(), c2).total(), PredictStepTime(flat, ep1, Round(), c3).total());
  }
}

TEST(PlannerTest, SkewFromRoutingLog) {
  const std::string path = ::testing::TempDir() + "/routing.jsonl";
  std::ofstream(path) << R"({"step": 5, "layers": [1], "tokens_per_expert": [[1, 1, 1, 1]]})" << "\n"
                      << R"({"step": 10, "layers": [1, 3], "tokens_per_expert": [[30, 10, 10, 10], [10, 10, 10, 10]]})"
                      << "\n";
  auto skew = ParseSkew(path);
  ASSERT_TRUE(skew.ok()) << skew.status();
  EXPECT_DOUBLE_EQ(skew->ForEp(1), 1.0);
  // The mean over layers of each layer's busiest rank over the mean: layer 1's ranks hold 40
  // and 20 of 60 (ep 2) or 30, 10, 10, 10 (ep 4); layer 3 is even.
  EXPECT_DOUBLE_EQ(skew->ForEp(2), (40.0 / 30.0 + 1) / 2);
  EXPECT_DOUBLE_EQ(skew->ForEp(4), (30.0 / 15.0 + 1) / 2);
  auto constant = ParseSkew("1.5");
  ASSERT_TRUE(constant.ok());
  EXPECT_EQ(constant->ForEp(8), 1.5);
  EXPECT_EQ(constant->ForEp(1), 1.0);
  EXPECT_NE(std::string(ParseSkew("0.5").status().message()).find("must be >= 1"), std::string::npos);
  EXPECT_NE(std::string(ParseSkew("/nonexistent/routing.jsonl").status().message()).find("routing.jsonl"),
            std::string::npos);
  // A constant skew counts at most ep (every token on the busiest rank): 1e308 once made
  // the step faster (an overflow).
  auto huge = ParseSkew("1e308");
  ASSERT_TRUE(huge.ok());
  EXPECT_EQ(huge->ForEp(4), 4.0);
  // Files without the routing log's last line: one line naming the file and what is missing,
  // never the JSON library's text.
  const std::string metrics = ::testing::TempDir() + "/metrics.jsonl";
  std::ofstream(metrics) << R"({"step": 1, "loss": 4.2})" << "\n";
  const std::string empty = ::testing::TempDir() + "/empty.jsonl";
  std::ofstream(empty) << "\n";
  const std::string negative = ::testing::TempDir() + "/negative.jsonl";
  std::ofstream(negative) << R"({"tokens_per_expert": [[1, -1]]})" << "\n";
  for (const auto& [text, want] : {std::pair{metrics, metrics + ": its last line has no tokens_per_expert"},
                                   std::pair{empty, empty + ": the file is empty"},
                                   std::pair{negative, negative + ": tokens_per_expert must hold"},
                                   std::pair{std::string(), std::string("--skew is empty")}}) {
    const std::string message(ParseSkew(text).status().message());
    EXPECT_NE(message.find(want), std::string::npos) << message;
    EXPECT_EQ(message.find("json.exception"), std::string::npos) << message;
  }
}

TEST(PlannerTest, AllToAllCrossesNodesOnlyBeyondANode) {
  PlanInputs in = Inputs(Parse(kMoE), 8, 32);
  const auto ep_time = [&](int ep, int etp, int tp, int per_node) {
    Hardware hw = Round();
    hw.gpus_per_node = per_node;
    CostCache cache;
    const Layout l{.tp = tp, .ep = ep, .etp = etp, .micro_batch_size = 2, .micro_batches = 2};
    return PredictStepTime(in, l, hw, cache).ep;
  };
  EXPECT_GT(ep_time(8, 1, 1, 8), 0);
  EXPECT_EQ(ep_time(8, 1, 1, 8), ep_time(8, 1, 1, 16));  // inside one node either way
  EXPECT_GT(ep_time(8, 1, 1, 4), ep_time(8, 1, 1, 8));   // ep 8 > a node of 4
  EXPECT_EQ(ep_time(4, 2, 2, 8), ep_time(4, 2, 2, 16));  // ep x etp = 8 fits a node of 8
  EXPECT_GT(ep_time(4, 2, 2, 4), ep_time(4, 2, 2, 8));   // but not one of 4
  EXPECT_EQ(ep_time(4, 1, 1, 4), ep_time(4, 1, 1, 8));   // ep 4 fits a node of 4
}

// fp8 products cast their operands first: per product (m, k) x (k, n), (m k + k n) elements
// at 3 bytes (block scales, `fp8`) or 6 (current scaling, `fp8-cs`) over the memory bandwidth,
// forward and twice in backward, every micro-batch. Round() has no fp8 peak, so fp8 runs at
// the bf16 peak and only the casts differ. One dense layer (d 64, gelu hidden 256, vocabulary
// 512), t = 4 x 32 tokens: q/k/v (t, 3d, d), output (t, d, d), the MLP's (t, ff, d) and
// (t, d, ff), the head (t, V, d): operands t (4d + ff) + 4 d^2 + 2 d ff + d V = 147456.
TEST(PlannerTest, Fp8CastsByHand) {
  config::Config c = Parse(R"(
model: {vocab_size: 512, seq_len: 32, d_model: 64, n_layers: 1, n_heads: 4, d_ff: 256}
moe: {num_experts: 1, layer_freq: 1000, top_k: 1, d_expert: 256}
)");
  const Layout l{.micro_batch_size = 4, .micro_batches = 3};
  const auto compute = [&](const char* precision) {
    PlanInputs in = Inputs(c, 1, 12);
    in.precision = precision;
    CostCache cache;
    return PredictStepTime(in, l, Round(), cache).compute;
  };
  const double operands = 128.0 * (4 * 64 + 256) + 4 * 64 * 64 + 2 * 64 * 256 + 64 * 512;
  ASSERT_EQ(operands, 147456);
  const double bf16 = compute("bf16");
  EXPECT_NEAR(compute("fp8") - bf16, 3 * 3 * 3 * operands / 1e11, 1e-9 * bf16);
  EXPECT_NEAR(compute("fp8-cs") - bf16, 3 * 3 * 6 * operands / 1e11, 1e-9 * bf16);
}

// With `fp8` the dispatch carries 8-bit rows and the return 16-bit ones: each exchange moves
// 1.5 / 2 of the bf16 bytes, the latencies unchanged. kMoE at ep 4 inside a node, no
// overlap: 4 exchanges (dispatch and return, forward and backward) per MoE layer (2) and
// micro-batch (2), each (ep - 1) latencies of 1e-5 s.
TEST(PlannerTest, Fp8DispatchByHand) {
  const Layout l{.ep = 4, .micro_batch_size = 2, .micro_batches = 2};
  const auto ep_time = [&](const char* precision) {
    PlanInputs in = Inputs(Parse(kMoE), 4, 16);
    in.precision = precision;
    CostCache cache;
    return PredictStepTime(in, l, Round(), cache).ep;
  };
  const double latencies = 4 * 2 * 2 * 3 * 1e-5;
  const double bf16 = ep_time("bf16");
  EXPECT_NEAR(ep_time("fp8") - latencies, 0.75 * (bf16 - latencies), 1e-9 * bf16);
  EXPECT_EQ(ep_time("fp8-cs"), bf16);  // current scaling keeps a 16-bit all-to-all
}

// A CPU node (cores_per_node): its ranks share the cores, so a rank's compute is the node's
// over the ranks on it, and every operation costs op_latency more, time-sliced ranks
// 1 / share times. kMoE's forward counts 4 x 12 (attention) + 2 x 6 (dense MLPs) +
// 2 x (12 + 4 x 8) (routers, 8 local experts) + 4 (head) + 2 (embedding) = 154 operations;
// a micro-batch runs them 3 times (forward, backward twice).
TEST(PlannerTest, CpuNodeSharesCoresAndPaysPerOperation) {
  Hardware cpu = Round();
  cpu.gpus_per_node = 1024, cpu.cores_per_node = 2;
  EXPECT_EQ(cpu.ComputeShare(1), 2);
  EXPECT_EQ(cpu.ComputeShare(2), 1);
  EXPECT_EQ(cpu.ComputeShare(8), 0.25);
  EXPECT_EQ(Round().ComputeShare(8), 1);  // devices: one each
  const config::Config c = Parse(kMoE);
  const Layout dp{.micro_batch_size = 2, .micro_batches = 2};
  const auto compute = [&](const Hardware& hw, int world) {
    CostCache cache;
    return PredictStepTime(Inputs(c, world, 4 * world), dp, hw, cache).compute;
  };
  // Half the share, twice the time (no per-operation cost: all of compute is work).
  EXPECT_NEAR(compute(cpu, 4), 2 * compute(cpu, 2), 1e-12 * compute(cpu, 4));
  EXPECT_NEAR(compute(cpu, 1), compute(cpu, 2) / 2, 1e-12 * compute(cpu, 2));
  Hardware slow = cpu;
  slow.op_latency = 1e-5;
  const double ops = 2 * 3 * 154;  // micro-batches x passes x forward operations
  EXPECT_NEAR(compute(slow, 2) - compute(cpu, 2), ops * 1e-5, 1e-9 * ops * 1e-5);
  EXPECT_NEAR(compute(slow, 1) - compute(cpu, 1), ops * 1e-5, 1e-9 * ops * 1e-5);  // threads do not shorten it
  EXPECT_NEAR(compute(slow, 8) - compute(cpu, 8), 4 * ops * 1e-5, 1e-9 * ops * 1e-5);  // a quarter core
}

// runtime.cuda_graphs on one rank: each operation costs graph_op_latency instead of
// op_latency (the micro-batches replay as a CUDA graph); without the key, or on several
// ranks (where the switch does not apply), op_latency.
TEST(PlannerTest, CudaGraphsPayTheGraphLatencyPerOperation) {
  Hardware hw = Round();
  hw.op_latency = 1e-5;
  config::Config c = Parse(kMoE);
  const Layout dp{.micro_batch_size = 2, .micro_batches = 2};
  const auto compute = [&](const Hardware& h, const config::Config& conf, int world) {
    CostCache cache;
    return PredictStepTime(Inputs(conf, world, 4 * world), dp, h, cache).compute;
  };
  const double ops = 2 * 3 * 154;  // as CpuNodeSharesCoresAndPaysPerOperation counts them
  config::Config graphed = c;
  graphed.runtime.cuda_graphs = true;
  EXPECT_EQ(compute(hw, graphed, 1), compute(hw, c, 1));  // no graph_op_latency: op_latency
  Hardware with = hw;
  with.graph_op_latency = 2e-6;
  EXPECT_NEAR(compute(hw, c, 1) - compute(with, graphed, 1), ops * (1e-5 - 2e-6),
              1e-9 * ops * 1e-5);
  EXPECT_EQ(compute(with, c, 1), compute(hw, c, 1));          // the switch off
  EXPECT_EQ(compute(with, graphed, 2), compute(hw, graphed, 2));  // two ranks: eager
}

// grouped_gemm_efficiency prices the experts' products where the dispatch keeps its counts on
// the device (one ep rank, moe.dispatch_counts device), and only there. kMoE at ep 1: t = 2 x 64
// tokens, 32 rows per expert (128 x top-2 / 8), two products of 2 x 32 x 96 x 64 FLOPs per
// expert, each at efficiency x F / (F + 1e6) of 1e12 (compute-bound: 22528 bytes take
// 2.3e-7 s); 8 experts, 2 MoE layers, 2 micro-batches, 3 passes (forward, backward twice).
TEST(PlannerTest, DeviceSizedExpertProductsAtTheirOwnEfficiency) {
  const config::Config c = Parse(kMoE);
  const auto compute = [](const config::Config& conf, const Layout& l, const Hardware& hw,
                          int world) {
    CostCache cache;
    return PredictStepTime(Inputs(conf, world, 4 * world / l.ep), l, hw, cache).compute;
  };
  const Layout one{.micro_batch_size = 2, .micro_batches = 2};
  Hardware grouped = Round();
  grouped.grouped_gemm_efficiency = 0.25;
  const double flops = 2.0 * 32 * 96 * 64, shape = flops / (flops + 1e6);
  const double per_product = flops / (1e12 * shape) * (1 / 0.25 - 1 / 0.5);
  const double expected = per_product * 2 * 8 * 2 * 2 * 3;
  const double base = compute(c, one, Round(), 1);
  EXPECT_NEAR(compute(c, one, grouped, 1) - base, expected, 1e-9 * base);
  Hardware same = Round();
  same.grouped_gemm_efficiency = 0.5;  // gemm.efficiency: the same prediction
  EXPECT_NEAR(compute(c, one, same, 1), base, 1e-12 * base);
  config::Config host = c;
  host.moe.dispatch_counts = moe::DispatchCounts::kHost;  // cuBLAS's products: gemm's rate
  EXPECT_EQ(compute(host, one, grouped, 1), compute(host, one, Round(), 1));
  const Layout ep2{.ep = 2, .micro_batch_size = 2, .micro_batches = 2};  // counts copied back
  EXPECT_EQ(compute(c, ep2, grouped, 2), compute(c, ep2, Round(), 2));
}

// elementwise_efficiency prices the memory-bound passes only: at 0.5 they take twice as long,
// the rest unchanged. Fp8CastsByHand's dense model (one layer, gelu MLP): a micro-batch of
// t = 128 tokens passes 8 d t (attention) + t (8 d + 3 d_ff) (MLP) + 3 t V (head) + 2 t d
// (embedding) = 442368 elements forward, 3 micro-batches x 3 passes, 2 bytes each at 1e11 B/s.
TEST(PlannerTest, ElementwiseEfficiencyPricesTheMemoryBoundPasses) {
  const config::Config c = Parse(R"(
model: {vocab_size: 512, seq_len: 32, d_model: 64, n_layers: 1, n_heads: 4, d_ff: 256}
moe: {num_experts: 1, layer_freq: 1000, top_k: 1, d_expert: 256}
)");
  const Layout l{.micro_batch_size = 4, .micro_batches = 3};
  const auto compute = [&](const Hardware& hw) {
    PlanInputs in = Inputs(c, 1, 12);
    in.precision = "bf16";
    CostCache cache;
    return PredictStepTime(in, l, hw, cache).compute;
  };
  const double elements =
      8.0 * 64 * 128 + 128.0 * (8 * 64 + 3 * 256) + 3.0 * 128 * 512 + 2.0 * 128 * 64;
  ASSERT_EQ(elements, 442368);
  Hardware half = Round();
  half.elementwise_efficiency = 0.5;
  EXPECT_NEAR(compute(half) - compute(Round()), 3 * 3 * elements * 2 / 1e11,
              1e-9 * compute(Round()));
}

}  // namespace
}  // namespace switchyard::plan
