// The dry-run's estimates (engine/plan/dry_run.h, activation_memory.h, pipeline_plan.h) on
// one process:
//  - ActivationBytesAreWhatTheDecoderKeeps: for model variants (MoE top-1/top-2, gelu and
//    swiglu, many experts, wide experts, dense layers, rmsnorm + RoPE, shared experts,
//    grouped-query attention, a wider model), a decoder stage's Forward keeps exactly the
//    estimated bytes (the allocator's workspace ledger) and its Backward peaks exactly at
//    the estimated scratch, on the first stage (embedding + a layer), a middle one (a layer)
//    and the last one (a layer + head); with a capacity that drops tokens the estimate
//    (every admissible token) bounds what is kept from above.
//  - ActivationBytesWithBf16Storage: with runtime.activation_dtype=bf16 the same, with the
//    bf16 tensors at 2 bytes (kept exactly; Backward within the products' operand copies).
//  - pipeline cases on the tiny config (2 layers) with hand-computed figures: the
//    parameters each pipeline rank holds, micro-batches in flight and activation memory
//    per stage, the bubble, and the step's workspace peak for GPipe and 1F1B;
//  - CheckCommunicatorOrder names the group, rank and action of a list that differs or
//    deadlocks; an impossible split (more stages than layers) is one line; the report's
//    pipeline section.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/allocator.h"
#include "engine/dist/communicator.h"
#include "engine/model/decoder.h"
#include "engine/config/config.h"
#include "engine/plan/device_fit.h"
#include "engine/plan/dry_run.h"

namespace switchyard::train {
namespace {

using parallel::Action;
using parallel::ActionKind;
using parallel::PipelineSchedule;

// tests/data/train-tiny.yaml's model: 2 MoE layers of 8 experts, d 32, seq 16, micro-batch 4.
constexpr char kTiny[] = R"(
model:
  vocab_size: 256
  seq_len: 16
  d_model: 32
  n_layers: 2
  n_heads: 2
  d_ff: 64
  norm: layernorm
  position: learned
  activation: gelu
  bias: true
  tie_embeddings: true
moe:
  num_experts: 8
  layer_freq: 1
  top_k: 1
  d_expert: 32
  activation: gelu
  capacity_factor: 1.25
  jitter_eps: 0.01
  aux_loss_coef: 0.01
  z_loss_coef: 0.001
train:
  micro_batch_size: 4
  grad_accum: 4
)";

config::Config Tiny(std::vector<std::string> overrides = {}) {
  auto c = config::ParseConfig(kTiny, "tiny.yaml", overrides);
  SY_CHECK_OK(c.status());
  return *c;
}

int64_t Workspace() { return MemoryUseOf(Device::Cpu()).in_use[0]; }
int64_t WorkspacePeak() { return MemoryUseOf(Device::Cpu()).peak[0]; }

struct Measured {
  int64_t kept = 0;      // what Forward's output holds
  int64_t backward = 0;  // Backward's peak beyond that (and beyond the given gradient)
  int64_t assignments = 0, admitted = 0;
};

// One micro-batch through a decoder stage on the CPU, measured on the workspace ledger; with
// runtime.precision=bf16 in a context with bf16 products and c's activation storage.
Measured RunStage(const config::Config& c, const model::Stage& stage) {
  auto ep = dist::MakeLocalCommunicator(Device::Cpu(), 0);
  std::unique_ptr<DeviceContext> ctx;
  if (c.runtime.bf16_products()) {
    ctx = DeviceContext::Create(Device::Cpu());
    ctx->set_matmul_dtype(DType::kBF16);
    if (c.runtime.activation_dtype == config::ActivationDtype::kBf16) {
      ctx->set_activation_dtype(DType::kBF16);
    }
  }
  auto decoder = model::Decoder::Create(c.model, c.moe, 7,
                                        model::DecoderParallel{.ep = ep.get(), .stage = stage},
                                        ctx.get());
  SY_CHECK_OK(decoder.status());
  (*decoder)->set_recompute(c.train.recompute);
  (*decoder)->set_head_chunk(c.train.head_chunk_tokens);
  const int64_t b = c.train.micro_batch_size, s = c.model.seq_len;
  std::vector<int32_t> ids(b * s);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 11) % c.model.vocab_size);
  model::DecoderInput in{.tokens = Tensor::FromVector(ids, {b, s}),
                         .targets = Tensor::FromVector(ids, {b, s}),
                         .step = 1, .training = true, .ce_grad_scale = 1e-3f,
                         .aux_grad_scale = 0.5f};
  if (!stage.embedding) {
    const Shape shape = (*decoder)->HiddenShape(b, s);
    std::vector<float> x(b * s * c.model.d_model);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(int(i * 7 % 13) - 6);
    in.hidden = Tensor::FromVector(x, shape);
  }
  Measured m;
  const int64_t base = Workspace();
  model::DecoderOutput out = (*decoder)->Forward(in);
  m.kept = Workspace() - base;
  if (!stage.head) out.grad_hidden = Tensor::Zeros(out.hidden.shape(), DType::kF32);
  const int64_t before = Workspace();
  ResetMemoryPeaks(Device::Cpu());
  (*decoder)->Backward(in, out);
  m.backward = WorkspacePeak() - before;
  for (const moe::MoEStats& st : out.moe_stats) {
    for (int64_t n : st.tokens_per_expert) m.assignments += n;
    for (int64_t n : st.tokens_per_expert_kept) m.admitted += n;
  }
  return m;
}

// The stages of a two-layer model the activation tests run: layer 0 with the embedding,
// layer 0 alone, layer 1 with the head.
std::vector<model::Stage> TwoLayerStages() {
  return {{.first_layer = 0, .end_layer = 1, .embedding = true, .head = false},
          {.first_layer = 0, .end_layer = 1, .embedding = false, .head = false},
          {.first_layer = 1, .end_layer = 2, .embedding = false, .head = true}};
}

// The device-fit report names train.head_chunk_tokens where the whole head's logits weigh
// (at least 5% of the peak), and not once the head runs in chunks or where they do not.
TEST(DryRunTest, DeviceFitReportSuggestsHeadChunking) {
  const auto report = [](const std::vector<std::string>& o) {
    const config::Config c = Tiny(o);
    auto mesh = dist::Mesh::Create(1, c.parallel.MeshSizes(), c.parallel.order);
    SY_CHECK_OK(mesh.status());
    return plan::DeviceFitReport(c, plan::PredictDeviceFit(c, *mesh));
  };
  const std::string big = report({"model.vocab_size=8192"});
  // 64 rows x 8192 words x 4 bytes.
  EXPECT_NE(big.find("keeps each micro-batch's f32 logits, 2.00 MiB, from forward to backward; "
                     "train.head_chunk_tokens=16 would keep none"),
            std::string::npos)
      << big;
  EXPECT_EQ(report({"model.vocab_size=8192", "train.head_chunk_tokens=16"}).find("head_chunk_tokens"),
            std::string::npos);
  EXPECT_EQ(report({"model.vocab_size=16"}).find("head_chunk_tokens"), std::string::npos);
}

// runtime.memory_check's rule: the predicted peaks of the ranks sharing the memory (the node's
// ranks on the host, the rank alone on a GPU) against what is available, exactly at the edge.
TEST(DryRunTest, MemoryCheckSumsTheRanksThatShareTheMemory) {
  const auto check = [](const config::Config& c, const dist::Mesh& mesh, int rank, double bytes) {
    return plan::CheckMemoryFits(c, mesh, rank, static_cast<int64_t>(bytes), "test");
  };
  const config::Config one = Tiny();
  auto single = dist::Mesh::Create(1, one.parallel.MeshSizes(), one.parallel.order);
  SY_CHECK_OK(single.status());
  const double p = std::ceil(plan::PredictRankPeak(one, *single, 0));
  EXPECT_TRUE(check(one, *single, 0, p).ok());
  EXPECT_TRUE(check(one, *single, 0, -1).ok());  // unknown: no check
  const Status short_one = check(one, *single, 0, p - 1);
  ASSERT_FALSE(short_one.ok());
  EXPECT_NE(
      short_one.message().find("runtime.memory_check: this rank needs " + plan::FormatBytes(p)),
      std::string::npos)
      << short_one.message();
  EXPECT_NE(short_one.message().find("than the " + plan::FormatBytes(p - 1) +
                                     " the host has available (test)"),
            std::string::npos)
      << short_one.message();

  // 4 ranks (ep 2 x dp 2), 2 a node: node 1 holds ranks 2 and 3.
  const config::Config four = Tiny({"parallel.ep=2", "parallel.ranks_per_node=2"});
  auto mesh = dist::Mesh::Create(4, four.parallel.MeshSizes(), four.parallel.order);
  SY_CHECK_OK(mesh.status());
  const double p2 = plan::PredictRankPeak(four, *mesh, 2);
  const double p3 = plan::PredictRankPeak(four, *mesh, 3);
  const double node = std::ceil(p2 + p3);
  EXPECT_TRUE(check(four, *mesh, 2, node).ok());
  const Status short_node = check(four, *mesh, 3, node - 1);
  ASSERT_FALSE(short_node.ok());
  EXPECT_NE(short_node.message().find("the 2 ranks on this node need"), std::string::npos)
      << short_node.message();
  // On a GPU each rank has its own memory: its own peak is what must fit.
  const config::Config gpu =
      Tiny({"parallel.ep=2", "parallel.ranks_per_node=2", "runtime.device=cuda"});
  const double g2 = std::ceil(plan::PredictRankPeak(gpu, *mesh, 2));
  EXPECT_TRUE(check(gpu, *mesh, 2, g2).ok());
  const Status short_gpu = check(gpu, *mesh, 2, g2 - 1);
  ASSERT_FALSE(short_gpu.ok());
  EXPECT_NE(short_gpu.message().find("this rank needs"), std::string::npos) << short_gpu.message();
  EXPECT_NE(short_gpu.message().find("the GPU has available"), std::string::npos)
      << short_gpu.message();
}

TEST(DryRunTest, ActivationBytesAreWhatTheDecoderKeeps) {
  struct Variant {
    std::string name;
    std::vector<std::string> overrides;
  };
  // A capacity factor of 8 admits every assignment, so the estimate is exact.
  const std::vector<Variant> variants = {
      {"tiny", {}},
      {"no_jitter", {"moe.jitter_eps=0"}},
      {"wide_experts_top2", {"moe.d_expert=128", "moe.top_k=2"}},
      {"swiglu_top2", {"moe.activation=swiglu", "moe.top_k=2"}},
      {"32_experts", {"moe.num_experts=32"}},
      {"dense_layers", {"moe.layer_freq=100", "model.d_ff=256"}},
      {"dense_swiglu", {"moe.layer_freq=100", "model.d_ff=256", "model.activation=swiglu"}},
      {"alternating", {"moe.layer_freq=2"}},
      {"rmsnorm_rope_untied", {"model.norm=rmsnorm", "model.position=rope", "model.tie_embeddings=false"}},
      {"shared_expert", {"moe.num_shared_experts=1"}},
      {"gqa", {"model.n_heads=4", "model.n_kv_heads=2"}},
      // Heads wider and narrower than d / n_heads (model.head_dim): q 48 and 24 wide on d 32.
      {"wide_heads", {"model.n_heads=4", "model.n_kv_heads=2", "model.head_dim=12"}},
      {"narrow_heads_rope", {"model.n_heads=4", "model.head_dim=6", "model.position=rope"}},
      {"d64_seq32", {"model.d_model=64", "model.n_heads=4", "model.seq_len=32"}},
      // The head in chunks of 24 of the 64 rows (24, 24, 16): no logits kept; one chunk's
      // in its backward.
      {"head_chunk", {"train.head_chunk_tokens=24"}},
      {"head_chunk_untied", {"model.tie_embeddings=false", "train.head_chunk_tokens=24"}},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    std::vector<std::string> o = v.overrides;
    o.push_back("moe.capacity_factor=8");
    const config::Config c = Tiny(o);
    const plan::ActivationBytes est = plan::EstimateActivationBytes(c);
    ASSERT_EQ(est.layer.size(), 2u);
    for (const model::Stage& stage : TwoLayerStages()) {
      SCOPED_TRACE(stage.Describe(2));
      const Measured m = RunStage(c, stage);
      EXPECT_EQ(m.admitted, m.assignments);
      EXPECT_EQ(m.kept, static_cast<int64_t>(est.Stage(stage)));
      EXPECT_EQ(m.backward, static_cast<int64_t>(est.StageBackward(stage)));
    }
  }
  // Capacity 0.5 drops assignments: less is kept than the estimate, which counts every
  // assignment the capacity admits (half of them here).
  const config::Config c = Tiny({"moe.capacity_factor=0.5", "moe.jitter_eps=0"});
  const plan::ActivationBytes est = plan::EstimateActivationBytes(c);
  const model::Stage middle{.first_layer = 0, .end_layer = 1, .embedding = false, .head = false};
  const Measured m = RunStage(c, middle);
  EXPECT_LT(m.admitted, m.assignments / 2 + 1);
  EXPECT_LE(m.kept, est.Stage(middle));
  EXPECT_GE(m.kept, 0.75 * est.Stage(middle));
}

// runtime.activation_dtype=bf16 (MODEL.md "Activation storage"): the decoder's Forward keeps
// exactly the estimate with its bf16 tensors at 2 bytes, less than under f32 storage. Its
// Backward holds the estimated scratch (with the f32 copies of the kept pre-activations)
// plus, as under any bf16-product run, the bf16 operand copies of the gradients its products
// read (kernels::MatmulOperand), which the estimate leaves to the device fit
// (engine/plan/device_fit.cc): at most one function's, here bounded by the largest of
// Experts::Backward's dy, da and db (d + 2 f per admitted row), the dense MLP's (d + f, one
// Linear at a time) and the untied head's dlogits (V), 2 bytes each.
TEST(DryRunTest, ActivationBytesWithBf16Storage) {
  const std::vector<std::vector<std::string>> variants = {
      {},
      {"moe.jitter_eps=0"},
      {"moe.activation=swiglu", "moe.top_k=2"},
      {"moe.layer_freq=100", "model.d_ff=256"},
      {"moe.layer_freq=100", "model.d_ff=256", "model.activation=swiglu"},
      {"moe.layer_freq=2"},
      {"model.norm=rmsnorm", "model.position=rope", "model.tie_embeddings=false"},
      {"moe.num_shared_experts=1"},
      {"model.n_heads=4", "model.n_kv_heads=2"},
      {"model.n_heads=4", "model.n_kv_heads=2", "model.head_dim=12"},
      // head_dim 64: the fused attention, whose backward reads the output back as f32 (also
      // as 3 heads of 64 on d 128, model.head_dim).
      {"model.d_model=128", "model.n_heads=2", "moe.d_expert=128"},
      {"model.d_model=128", "model.n_heads=3", "model.head_dim=64", "moe.d_expert=128"},
      {"model.d_model=128", "model.n_heads=4", "model.head_dim=64", "moe.d_expert=128"},
      {"model.d_model=128", "model.n_heads=2", "moe.d_expert=128", "train.recompute=selective"},
      {"model.tie_embeddings=false", "train.head_chunk_tokens=24"},
  };
  for (std::vector<std::string> o : variants) {
    std::string name;
    for (const std::string& v : o) name += v + " ";
    SCOPED_TRACE(name);
    o.push_back("moe.capacity_factor=8");
    o.push_back("runtime.precision=bf16");
    const config::Config f32 = Tiny(o);
    o.push_back("runtime.activation_dtype=bf16");
    const config::Config c = Tiny(o);
    const plan::ActivationBytes est = plan::EstimateActivationBytes(c);
    const plan::ActivationBytes est_f32 = plan::EstimateActivationBytes(f32);
    const double group = 4.0 * c.train.micro_batch_size * c.model.seq_len;  // 4 B per element
    const double f_dense = double(c.model.ff_hidden()), f_expert = double(c.moe.d_expert);
    const double k = c.moe.top_k, d = c.model.d_model, v = c.model.vocab_size;
    const double copies =
        0.5 * group * std::max({k * (d + 2 * f_expert), d + f_dense, v});
    for (const model::Stage& stage : TwoLayerStages()) {
      SCOPED_TRACE(stage.Describe(2));
      const Measured m = RunStage(c, stage);
      const Measured m_f32 = RunStage(f32, stage);
      EXPECT_EQ(m.admitted, m.assignments);
      EXPECT_EQ(m.kept, static_cast<int64_t>(est.Stage(stage)));
      EXPECT_EQ(m_f32.kept, static_cast<int64_t>(est_f32.Stage(stage)));
      EXPECT_LT(m.kept, m_f32.kept);
      EXPECT_GE(m.backward, static_cast<int64_t>(est.StageBackward(stage)));
      EXPECT_LE(m.backward, static_cast<int64_t>(est.StageBackward(stage) + copies));
      std::printf("[ info     ] %s| %s: kept %lld (f32 storage %lld), backward %lld, "
                  "estimate %.0f + copies <= %.0f\n",
                  name.c_str(), stage.Describe(2).c_str(), static_cast<long long>(m.kept),
                  static_cast<long long>(m_f32.kept), static_cast<long long>(m.backward),
                  est.StageBackward(stage), copies);
    }
  }
}

// The tiny config's pieces by hand (per token of the 64-token micro-batch, f32 elements):
// a MoE layer keeps 414.5 — norm1 32 + 2 and norm2's statistics 2 (the jittered router
// keeps h * noise, not h, and draws its noise again in backward), q k v o.x 4 x 32 plus the
// lse 2, x_mid and the output 2 x 32, the router's jittered input 32, logits and probs
// 2 x 8, k-sized routing tensors 8.5, one admitted row x a h and the combine's row 4 x 32
// (o.y and the MoE output go once the residual has them); the embedding 32; the head 290
// (final norm 34, logits gradient 256). Per micro-batch, a MoE layer's device-sized dispatch
// plan also keeps its (E + 1) i64 offsets: 72 bytes.
constexpr double kToken = 4.0 * 64;  // bytes per f32 element per token
constexpr double kOffsets = 8.0 * (8 + 1);
constexpr double kStage0 = (32 + 414.5) * kToken + kOffsets;  // embedding + layer 0: 114376
constexpr double kStage1 = (414.5 + 290) * kToken + kOffsets;  // layer 1 + head: 180424
constexpr double kHidden = 32 * kToken;             // 8192
constexpr double kTokens = 5 * 4.0 * 64;            // token ids on the CPU: 1280
// Parameters: wte 8192, wpe 512; a layer 20992 (norms 128, attention 4096 + 128 bias,
// router 256, experts 8 x 2048); norm_f 64; the last stage's copy of the tied table 8192.
constexpr int64_t kLayerDense = 128 + 4096 + 128 + 256, kLayerExpert = 16384;

config::Config TinyPipeline(const std::string& schedule, int micro_batches) {
  return Tiny({"parallel.pp=2", "parallel.pipeline_schedule=" + schedule,
               "train.grad_accum=" + std::to_string(micro_batches)});
}

TEST(DryRunTest, PipelineRanksHoldTheirStagesParameters) {
  const config::Config c = TinyPipeline("1f1b", 4);
  auto mesh = dist::Mesh::Create(4, c.parallel.MeshSizes(), c.parallel.order);  // pp 2 x dp 2
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  const plan::RankParams first{.dense = 8192 + 512 + kLayerDense, .replicated = 0, .expert = kLayerExpert};
  const plan::RankParams last{.dense = kLayerDense + 64 + 8192, .replicated = 0, .expert = kLayerExpert};
  for (int rank = 0; rank < 4; ++rank) {
    const bool is_first = mesh->Coord(rank, dist::View::kDense, dist::Axis::kPp) == 0;
    EXPECT_EQ(plan::EstimateRankParams(c, *mesh, rank), is_first ? first : last) << "rank " << rank;
    const plan::RankMemory mem = plan::PredictRankMemory(c, *mesh, rank);
    const double elements = double((is_first ? first : last).total());
    EXPECT_EQ(mem.parameters, 4 * elements);
    EXPECT_EQ(mem.gradients, 4 * elements);
    EXPECT_EQ(mem.optimizer, 8 * elements);
  }
  // Untied: the head's own table on the last stage, the token table on the first only.
  const config::Config untied = Tiny({"parallel.pp=2", "model.tie_embeddings=false"});
  EXPECT_EQ(plan::EstimateRankParams(untied, *mesh, 0), first);
  EXPECT_EQ(plan::EstimateRankParams(untied, *mesh, 2), last);
  // One stage holds everything.
  const config::Config whole = Tiny();
  auto one = dist::Mesh::Create(1, whole.parallel.MeshSizes(), whole.parallel.order);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(plan::EstimateRankParams(whole, *one, 0).total(),
            8192 + 512 + 2 * (kLayerDense + kLayerExpert) + 64);
}

TEST(DryRunTest, PipelineStagesInFlightAndActivations) {
  auto mesh = dist::Mesh::Create(2, TinyPipeline("1f1b", 4).parallel.MeshSizes());
  ASSERT_TRUE(mesh.ok());
  for (const std::string schedule : {"gpipe", "1f1b"}) {
    for (int m : {4, 8}) {
      SCOPED_TRACE(schedule + " m " + std::to_string(m));
      const config::Config c = TinyPipeline(schedule, m);
      auto plan = plan::PlanPipeline(c, *mesh);
      ASSERT_TRUE(plan.ok()) << plan.status();
      EXPECT_TRUE(plan->order.ok()) << plan->order;
      EXPECT_DOUBLE_EQ(plan->bubble, 1.0 / (m + 1));  // (p - 1) / (m + p - 1)
      ASSERT_EQ(plan->stages.size(), 2u);
      EXPECT_EQ(plan->stages[0].stage.Describe(2), "embedding + layers 0-0");
      EXPECT_EQ(plan->stages[1].stage.Describe(2), "layers 1-1 + head");
      // GPipe keeps every micro-batch; 1F1B min(pp - rank, m).
      const int in_flight[2] = {schedule == "gpipe" ? m : 2, schedule == "gpipe" ? m : 1};
      const double one[2] = {kStage0, kStage1};
      for (int s = 0; s < 2; ++s) {
        EXPECT_EQ(plan->stages[s].rank, s);
        EXPECT_EQ(plan->stages[s].in_flight, in_flight[s]);
        EXPECT_EQ(plan->stages[s].in_flight,
                  parallel::MaxInFlight(parallel::ScheduleActions(plan->schedule, 2, m, 1, s)));
        EXPECT_DOUBLE_EQ(plan->stages[s].micro_batch_bytes, one[s]);
        EXPECT_DOUBLE_EQ(plan->stages[s].activation_bytes(), in_flight[s] * one[s]);
        EXPECT_DOUBLE_EQ(plan->ranks[s].activations_peak, in_flight[s] * one[s]);
      }
      const std::vector<double> costs = model::StageCosts(c.model, c.moe,
                                                          std::vector<model::Stage>{plan->stages[0].stage, plan->stages[1].stage});
      EXPECT_DOUBLE_EQ(plan->stages[0].cost, costs[0]);
      EXPECT_DOUBLE_EQ(plan->stages[1].cost, costs[1]);
    }
  }
}

// The step's workspace by hand, G being one copy of the rank's gradients, under ordered
// accumulation (train.ordered_grad_accum: the gradient tree).
TEST(DryRunTest, PipelineStepWorkspaceByHand) {
  auto Ordered = [](config::Config c) {
    c.train.ordered_grad_accum = true;
    return c;
  };
  auto mesh = dist::Mesh::Create(2, TinyPipeline("1f1b", 4).parallel.MeshSizes());
  ASSERT_TRUE(mesh.ok());
  const double g0 = 4.0 * (8192 + 512 + kLayerDense + kLayerExpert);
  const double g1 = 4.0 * (kLayerDense + kLayerExpert + 64 + 8192);
  // GPipe, m micro-batches, last stage: after every forward (each with its received
  // activation and token ids), the first backward's gradient is packed (G) into a new tree
  // buffer (G) while its input gradient waits for its send (H).
  for (int m : {4, 8}) {
    const plan::RankMemory last = plan::PredictRankMemory(Ordered(TinyPipeline("gpipe", m)), *mesh, 1);
    EXPECT_DOUBLE_EQ(last.workspace, m * (kStage1 + kHidden + kTokens) + kHidden + 2 * g1) << m;
    // First stage: its activations (their outputs included), token ids and the received
    // gradient; a micro-batch's activations (kStage0) weigh less than a gradient copy (g0),
    // so the peak is the second backward's packing, not the first's: micro-batch 0's
    // activations gone, its packed gradient in the tree beside micro-batch 1's (3 G).
    const plan::RankMemory first = plan::PredictRankMemory(Ordered(TinyPipeline("gpipe", m)), *mesh, 0);
    ASSERT_LT(kStage0, g0);
    EXPECT_DOUBLE_EQ(first.workspace, (m - 1) * kStage0 + m * kTokens + kHidden + 3 * g0) << m;
  }
  // 1F1B, m = 4, last stage: at the fourth backward one micro-batch's activations with its
  // received activation and its input gradient (the earlier micro-batches' went with their
  // activations, and their input gradients with their sends, released once the first stage
  // took them: parallel::SendReleases), every micro-batch's token ids, and four gradient
  // copies (three tree buffers, the packed one).
  EXPECT_DOUBLE_EQ(plan::PredictRankMemory(Ordered(TinyPipeline("1f1b", 4)), *mesh, 1).workspace,
                   kStage1 + 4 * kTokens + 2 * kHidden + 4 * g1);
  // One rank, one micro-batch: the activations and the backward's scratch (the attention's:
  // 3 d + 2 q + 2 kv = 224 per token); no tree, no messages.
  const config::Config one = Tiny({"train.grad_accum=1"});
  auto single = dist::Mesh::Create(1, one.parallel.MeshSizes());
  ASSERT_TRUE(single.ok());
  EXPECT_DOUBLE_EQ(plan::PredictRankMemory(one, *single, 0).workspace,
                   kTokens + (32 + 2 * 414.5 + 290) * kToken + 2 * kOffsets + 224 * kToken);
}

TEST(DryRunTest, CheckCommunicatorOrderNamesTheFirstDifference) {
  const config::Config c = TinyPipeline("1f1b", 4);
  auto mesh = dist::Mesh::Create(4, c.parallel.MeshSizes(), c.parallel.order);  // pp groups [0, 2], [1, 3]
  ASSERT_TRUE(mesh.ok());
  std::vector<std::vector<Action>> lists(4);
  for (int r = 0; r < 4; ++r) {
    lists[r] = parallel::ScheduleActions(PipelineSchedule::kOneFOneB, 2, 4, 1,
                                         mesh->Coord(r, dist::View::kDense, dist::Axis::kPp));
  }
  auto check = [&] {
    return plan::CheckCommunicatorOrder(*mesh, 4, 1, [&](int r) -> const std::vector<Action>& { return lists[r]; });
  };
  EXPECT_TRUE(check().ok()) << check();
  // Rank 3 (pipeline rank 1 of the second group) swaps two forwards' order: its dp group
  // would run their collectives in another order.
  std::vector<Action> swapped = lists[3];
  std::swap(swapped[1], swapped[5]);
  lists[3] = swapped;
  Status s = check();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "pipeline group [1, 3]: rank 3 (pipeline rank 1) has action 1 (forward mb 1 chunk 0) "
            "where rank 2 of the validated group [0, 2] has action 1 (forward mb 0 chunk 0)");
  // The validated group itself: rank 0 receives its gradient before sending the activation
  // it needs, a deadlock.
  lists[3] = lists[2];
  std::swap(lists[0][1], lists[0][4]);
  s = check();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("pipeline group [0, 2]: "), std::string::npos) << s;
  EXPECT_EQ(std::string(s.message()).find('\n'), std::string::npos) << s;
}

TEST(DryRunTest, MoreStagesThanLayersIsOneLine) {
  const config::Config c = Tiny({"parallel.pp=4"});
  const Status valid = c.Validate(4);
  EXPECT_EQ(valid.message(),
            "4 pipeline stages (parallel.pp x parallel.virtual_stages) for 2 layers: every stage "
            "needs at least one layer");
  auto mesh = dist::Mesh::Create(4, c.parallel.MeshSizes());
  ASSERT_TRUE(mesh.ok());
  EXPECT_EQ(plan::PlanPipeline(c, *mesh).status().message(), valid.message());
  Status check;
  EXPECT_EQ(plan::PipelineReport(c, *mesh, &check), "pipeline: " + std::string(valid.message()) + "\n");
  EXPECT_EQ(check.message(), valid.message());
}

TEST(DryRunTest, ReportHasThePipelineSection) {
  Status check = InvalidArgument("unset");
  const std::string report = plan::DryRunReport(TinyPipeline("1f1b", 4), 2, &check);
  EXPECT_TRUE(check.ok()) << check;
  for (const char* line : {
           "pipeline: pp 2, schedule 1f1b, 4 micro-batches (train.grad_accum), 2 model stages of 2 layers\n",
           "  action lists: OK (pipeline group [0, 1]: every forward and backward once",
           "  bubble (analytic, (p-1)/(m+p-1)): 0.2000\n",
           "        0    0  embedding + layers 0-0         ",
           "        1    1  layers 1-1 + head              ",
           "   111.70 KiB       223.39 KiB\n",  // stage 0: 2 in flight x 114376 B
           "   176.20 KiB       176.20 KiB\n",  // stage 1: 1 x 180424 B
       }) {
    EXPECT_NE(report.find(line), std::string::npos) << "missing: " << line << "\nin:\n" << report;
  }
  // Without pipeline parallelism there is no section.
  EXPECT_EQ(plan::DryRunReport(Tiny(), 1).find("pipeline:"), std::string::npos);
}

}  // namespace
}  // namespace switchyard::train
