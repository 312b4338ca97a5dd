// The device counts of training steps (engine/core/counters.h, `switchyard train
// --profile`), counted on the CPU at the points a GPU run dispatches, reads back and
// converts, on one rank with the tiny config (tests/data/train-tiny.yaml: two MoE blocks of 8
// gelu experts, four attention projections each, tied embeddings; grad_accum 4):
//
//  - ReadbacksPerStepBySite: dropless routing, fp32. Every profiled step has the same
//    counts, and each readback site has the count the code's structure gives it, written
//    out from the config below: per MoE layer and routing group (a micro-batch is one
//    group) the dispatch plan's per-expert counts, and per step one readback at its end
//    (engine/core/step_readback.h: the cross-entropy sums, the load-balancing losses and
//    per-expert counts, the z-losses, the router entropies and the gradient norm's
//    partial sums, written on the device and read in one copy): 9. It was 45 before the
//    step's readback buffer (those values read one by one) and the host id check (the
//    embedding lookup and its backward read a bad-id flag each), and 53 before dropless
//    admission stopped reading its counts. The steps that record routing by language (a
//    run's second half) make its (label, expert) counts in the step's readback too; they
//    read each layer's choices back until 2026-12-03. So a change in how often a
//    step waits for the device shows here (with the head whole and chunked,
//    train.head_chunk_tokens). Issue #36's target is one readback per step;
//    what is left (the dispatch plan's counts, host sizes of the grouped expert GEMMs) and
//    why is in docs/gpu.md.
//  - EveryAuxScopeReadsBackOncePerStep: the sequence and global aux-loss scopes too, their
//    terms on the device, one dispatch per op and routing group whatever the sequences.
//  - ResidualAddsRunInTheNextNorm: no residual add has a kernel of its own; each runs in the
//    norm after it (counted by op), under every recompute mode, to the same bits.
//  - Bf16WeightsConvertedOncePerStep: runtime.precision=bf16 converts each weight a product
//    reads once per step (its bf16 shadow, engine/core/weight_shadows.h): 13 weights (4
//    projections + w1 + w2 per block, and the tied head), 49152 elements, written by the
//    AdamW update in its pass (the first step's products also write them at their first
//    use: twice that); with the shadows off, every product converts its weight again: twice
//    per micro-batch (forward, and the input gradient's product), 104 conversions.
//  - Bf16ShadowsAreBitIdentical: the losses and every weight after 4 bf16 steps are the
//    same bits with and without the shadows (without them is the per-product conversion
//    the engine had before), and fp32 training converts nothing.
//  - Bf16ActivationStorageConvertsEachOperandOnce: runtime.activation_dtype=bf16 (MODEL.md
//    "Activation storage") converts each kept product input once for its forward and weight
//    gradient products (q, k, v share one), rounds each expert block's a once and reads it
//    back once; the f32->bf16 and bf16->f32 conversion calls per step are written out below
//    for both storages.
//  - Bf16ActivationStorageTrains: with the switch on the first step's loss is the same bits
//    (the forward is unchanged), the model learns, the losses stay near the f32-storage
//    run's, and the step's workspace peak (the allocator's ledger) is lower.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/allocator.h"
#include "engine/core/counters.h"
#include "engine/core/profile.h"
#include "tests/dist/train_fixture.h"

namespace switchyard::train::testing {
namespace {

constexpr int64_t kSteps = 3;
constexpr int64_t kMicroBatches = 4;  // train.grad_accum of train-tiny.yaml
constexpr int64_t kMoELayers = 2;     // model.n_layers, moe.layer_freq 1

class DeviceCountsTest : public TrainFixture {};

// Trains `steps` steps of the tiny config with `overrides` on one rank, profiled from the
// first step; shadows: the bf16 weight shadows on or off.
std::unique_ptr<Trainer> TrainProfiled(std::vector<std::string> overrides,
                                       const std::string& out, int64_t steps,
                                       bool shadows = true) {
  overrides.push_back("train.max_steps=" + std::to_string(steps));
  auto config = TrainFixture::TinyConfig(overrides);
  static std::unique_ptr<dist::Communicator> local = dist::MakeLocalCommunicator(Device::Cpu(), 0);
  QuietStdout quiet;
  auto trainer = Trainer::Create(config, out, *local);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return nullptr;
  (*trainer)->EnableProfile(/*skip_steps=*/0);
  (*trainer)->device_context().weight_shadows().set_enabled(shadows);
  const Status ran = (*trainer)->Run(steps);
  EXPECT_TRUE(ran.ok()) << ran;
  if (!ran.ok()) return nullptr;
  return std::move(*trainer);
}

// The assignments counted in a run's routing_by_language.json (its second half's).
int64_t RoutedByLanguage(const std::string& run) {
  std::ifstream in(run + "/routing_by_language.json");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  int64_t n = 0;
  if (!j.is_object() || !j.contains("counts")) return -1;
  for (const auto& layer : j["counts"]) {
    for (const auto& row : layer) {
      for (const auto& c : row) n += c.get<int64_t>();
    }
  }
  return n;
}

std::string Sites(const DeviceCounts& c) {
  std::string s;
  for (const auto& [site, n] : c.readback_sites) s += site + "=" + std::to_string(n) + " ";
  return s;
}

// Dropless training on one rank: one readback per step, the step's end, when the dispatch
// counts stay on the device (moe.dispatch_counts: device, the default); with them copied to
// the host, one more per MoE layer and micro-batch.
TEST_F(DeviceCountsTest, ReadbacksPerStepBySite) {
  if (!is_root()) return;
  // The head whole, and in chunks of 5 rows (each chunk's loss sums go to the step's buffer).
  for (const char* head : {"train.head_chunk_tokens=0", "train.head_chunk_tokens=5"}) {
  for (const char* counts : {"device", "host"}) {
  SCOPED_TRACE(StrCat(head, ", moe.dispatch_counts=", counts));
  const bool on_device = std::string(counts) == "device";
  auto trainer = TrainProfiled({"moe.capacity_factor=0", head,
                                StrCat("moe.dispatch_counts=", counts)},
                               dir(StrCat("counts_fp32_", head, counts)), kSteps);
  ASSERT_NE(trainer, nullptr);
  const std::vector<DeviceCounts>& steps = trainer->profile()->step_counts();
  ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps));
  // The decoder routes a micro-batch's rows as one group per MoE layer.
  const int64_t groups = kMoELayers * kMicroBatches;
  // The step's readback buffer: the cross-entropy sums, the balance losses and per-expert
  // counts, the z-losses, the router entropies and the gradient norm's partial sums.
  std::map<std::string, int64_t> want = {{"step_end", 1}};
  if (!on_device) want["moe.sort_assignments"] = groups;  // each dispatch plan's counts
  int64_t total = 0;
  for (const auto& [site, n] : want) total += n;
  ASSERT_EQ(total, on_device ? 1 : 9);
  // Routing by language is recorded on the run's second half (steps 1 and 2 here), its
  // counts made in the step's readback too: those steps read back no more than the others.
  EXPECT_GT(RoutedByLanguage(dir(StrCat("counts_fp32_", head, counts))), 0);
  for (int64_t s = 0; s < kSteps; ++s) {
    const DeviceCounts& c = steps[s];
    EXPECT_EQ(c.readback_sites, want) << "step " << s << ": " << Sites(c);
    EXPECT_EQ(c.readbacks, total) << "step " << s;
    EXPECT_EQ(c.conversions(), 0) << "fp32 converts nothing";
    EXPECT_EQ(c.cuda_mallocs, 0);
    EXPECT_GT(c.dispatches, 0);
    // Every step dispatches the same kernels, and the recording steps one count kernel per
    // layer and micro-batch more, and the zeroing of each layer's counts in the readback.
    // With the head in chunks of 5 rows (two slots a chunk) the first recording step's slots
    // outgrow the readback's first allocation (the 256 slots of StepReadback::kChunk, or the
    // most an earlier step took): one more allocation zeroed, and the two copied side by side
    // before the one copy to the host. The next steps' first allocation holds them all.
    const bool recording = s >= kSteps / 2;
    const bool grows = s == kSteps / 2 && std::string(head) != "train.head_chunk_tokens=0";
    std::map<std::string, int64_t> extra;
    if (recording) extra = {{"AddLabelAssignmentCounts", groups}, {"SetZero", kMoELayers}};
    if (grows) extra["SetZero"] += 1, extra["CopyFrom"] = 2;
    int64_t extras = 0;
    for (const auto& [op, n] : extra) extras += n;
    EXPECT_EQ(c.dispatches, steps[0].dispatches + extras) << "step " << s;
    // The gradients are zeroed in one dispatch (kernels::ZeroMany), not a memset each: at
    // the step's start and, under the config's ordered accumulation (each micro-batch's
    // gradient a leaf of the tree), before each micro-batch's backward.
    EXPECT_EQ(c.dispatch_ops.at("ZeroMany"), 1 + kMicroBatches) << "step " << s;
    // By op: they add up to the total, and the extra ones are those above.
    int64_t by_op = 0;
    for (const auto& [op, n] : c.dispatch_ops) by_op += n;
    EXPECT_EQ(by_op, c.dispatches) << "step " << s;
    EXPECT_EQ(c.Minus(steps[0]).dispatch_ops, extra) << "step " << s;
  }
  }
  }
}

// Capacity routing (the tiny config's moe.capacity_factor 1.25): the admitted counts go to
// the step's readback too (no "moe.admission" wait), and the device-sized plan carries the
// capacity's bound of rows: one readback per step. With the counts on the host, the plan's
// sort waits once per MoE layer and micro-batch.
TEST_F(DeviceCountsTest, CapacityRoutingReadsBackOncePerStep) {
  if (!is_root()) return;
  const int64_t groups = kMoELayers * kMicroBatches;
  for (const char* counts : {"device", "host"}) {
    SCOPED_TRACE(counts);
    auto trainer = TrainProfiled({StrCat("moe.dispatch_counts=", counts)},
                                 dir(StrCat("counts_capacity_", counts)), kSteps);
    ASSERT_NE(trainer, nullptr);
    std::map<std::string, int64_t> want = {{"step_end", 1}};
    if (std::string(counts) == "host") want["moe.sort_assignments"] = groups;
    EXPECT_GT(RoutedByLanguage(dir(StrCat("counts_capacity_", counts))), 0);
    for (const DeviceCounts& c : trainer->profile()->step_counts()) {
      EXPECT_EQ(c.readback_sites, want) << Sites(c);
    }
  }
}

// The sequence and global aux-loss scopes keep their terms on the device too
// (moe::BalanceTermsInto): one readback per step. They read back each sequence's sums
// ("moe.balance_sums", 4 sequences a micro-batch here) and the global scope's load
// ("moe.expert_load") for each layer and micro-batch until 2026-12-04. A group's sequences
// take one dispatch for their sums, one for their mean loss and one for their gradient
// columns, whatever their number.
TEST_F(DeviceCountsTest, EveryAuxScopeReadsBackOncePerStep) {
  if (!is_root()) return;
  const int64_t groups = kMoELayers * kMicroBatches;
  const std::map<std::string, std::vector<std::string>> ops = {
      {"sequence", {"PartBalanceSums", "PartBalanceValueInto", "AddPartBalanceColumns"}},
      {"global", {"GlobalBalanceValueInto", "AddGlobalBalanceColumn"}}};
  for (const auto& [scope, scope_ops] : ops) {
    SCOPED_TRACE(scope);
    auto trainer = TrainProfiled({"moe.capacity_factor=0", "moe.aux_loss_scope=" + scope},
                                 dir("counts_scope_" + scope), kSteps);
    ASSERT_NE(trainer, nullptr);
    const std::map<std::string, int64_t> want = {{"step_end", 1}};
    for (const DeviceCounts& c : trainer->profile()->step_counts()) {
      EXPECT_EQ(c.readback_sites, want) << Sites(c);
      for (const std::string& op : scope_ops) {
        EXPECT_EQ(c.dispatch_ops.count(op) ? c.dispatch_ops.at(op) : 0, groups) << op;
      }
      EXPECT_EQ(c.dispatch_ops.count("AddBalanceColumn"), 0u) << "the group scope's column";
    }
  }
}

// The dispatch counts on the device or on the host: the same training, bit for bit (the CPU
// runs the same products on the same rows either way), dropless in f32 and in bf16 with gelu
// experts with biases (the device-sized bias add and bias gradient) and swiglu experts, and
// top-2 at capacity 1 (dropped rows carried past the kept ones).
TEST_F(DeviceCountsTest, DeviceDispatchCountsAreBitIdentical) {
  if (!is_root()) return;
  constexpr int64_t kBitSteps = 3;
  const std::vector<std::vector<std::string>> cases = {
      {"runtime.precision=fp32", "moe.bias=true", "moe.capacity_factor=0"},
      {"runtime.precision=bf16", "moe.activation=swiglu", "model.activation=swiglu",
       "moe.capacity_factor=0"},
      {"runtime.precision=bf16", "moe.top_k=2", "moe.capacity_factor=1", "moe.bias=true",
       "moe.drop_policy=probability"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(StrCat("case ", i));
    std::vector<std::string> on = cases[i], off = cases[i];
    on.push_back("moe.dispatch_counts=device");
    off.push_back("moe.dispatch_counts=host");
    auto device = TrainProfiled(on, dir(StrCat("dispatch_device", i)), kBitSteps);
    auto host = TrainProfiled(off, dir(StrCat("dispatch_host", i)), kBitSteps);
    ASSERT_NE(device, nullptr);
    ASSERT_NE(host, nullptr);
    ASSERT_EQ(device->losses().size(), static_cast<size_t>(kBitSteps));
    ExpectSameBits(*device, *host);
    // The device plan waited for nothing; the host plan once per layer and micro-batch.
    const auto& device_sites = device->profile()->total_counts().readback_sites;
    const auto& host_sites = host->profile()->total_counts().readback_sites;
    EXPECT_EQ(device_sites.count("moe.sort_assignments"), 0u);
    ASSERT_EQ(host_sites.count("moe.sort_assignments"), 1u);
    EXPECT_EQ(host_sites.at("moe.sort_assignments"), kBitSteps * kMoELayers * kMicroBatches);
    EXPECT_EQ(device_sites.at("step_end"), kBitSteps);
  }
}

// A block's residual add runs in the next norm's kernel (model::ResidualStream,
// Norm::AddForward): one plain LayerNorm (the first block's norm1, on the
// embedding's output) and every other norm fused with the add before it (each block's norm2,
// the next block's norm1, the final norm): 2 x 2 layers; no Add at all. Under full recompute
// Backward runs each block again from its kept input (summed): its norm1 plain, its norm2
// fused. The three recompute modes train to the same bits. One micro-batch a step, so that
// no gradient accumulation adds (the micro-batches' tree sum, dist/ordered_sum.h) either.
TEST_F(DeviceCountsTest, ResidualAddsRunInTheNextNorm) {
  if (!is_root()) return;
  constexpr int64_t kLayers = 2, kBitSteps = 2;
  std::vector<std::unique_ptr<Trainer>> runs;
  for (const char* recompute : {"none", "selective", "full"}) {
    SCOPED_TRACE(recompute);
    runs.push_back(TrainProfiled({"moe.capacity_factor=0", "train.grad_accum=1",
                                  "train.micro_batch_size=16",
                                  StrCat("train.recompute=", recompute)},
                                 dir(StrCat("residual_", recompute)), kBitSteps));
    ASSERT_NE(runs.back(), nullptr);
    const bool full = std::string(recompute) == "full";
    const std::map<std::string, int64_t>& ops = runs.back()->profile()->step_counts()[0].dispatch_ops;
    EXPECT_EQ(ops.count("Add"), 0u);
    EXPECT_EQ(ops.at("LayerNormForward"), full ? 1 + kLayers : 1);
    EXPECT_EQ(ops.at("AddLayerNormForward"), full ? 3 * kLayers : 2 * kLayers);
  }
  ExpectSameBits(*runs[1], *runs[0]);
  ExpectSameBits(*runs[2], *runs[0]);
}

TEST_F(DeviceCountsTest, Bf16WeightsConvertedOncePerStep) {
  if (!is_root()) return;
  // The weights products read, from the config: per block q, k, v, o (d x d) and the
  // experts' w1, w2 (E x d x d_expert); the tied head reads the token table (V x d).
  const int64_t d = 32, experts = 8, d_expert = 32, vocab = 256;
  const int64_t weights = kMoELayers * (4 + 2) + 1;
  const int64_t elements = kMoELayers * (4 * d * d + 2 * experts * d * d_expert) + vocab * d;
  ASSERT_EQ(weights, 13);
  ASSERT_EQ(elements, 49152);
  // The experts' weights alone: the device-sized products round them as they load them.
  const int64_t expert_weights = kMoELayers * 2;
  const int64_t expert_elements = kMoELayers * 2 * experts * d * d_expert;
  for (const char* counts : {"host", "device"}) {
  for (bool shadows : {true, false}) {
    SCOPED_TRACE(StrCat(shadows ? "shadows on" : "shadows off", ", moe.dispatch_counts=", counts));
    const bool in_kernel = std::string(counts) == "device";
    auto trainer = TrainProfiled({"runtime.precision=bf16", StrCat("moe.dispatch_counts=", counts)},
                                 dir(StrCat(shadows ? "counts_bf16_" : "counts_bf16_noshadow_",
                                            counts)),
                                 kSteps, shadows);
    ASSERT_NE(trainer, nullptr);
    const std::vector<DeviceCounts>& steps = trainer->profile()->step_counts();
    ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps));
    for (const DeviceCounts& c : steps) {
      // Without shadows each micro-batch's forward product and input-gradient product
      // convert the weight again, but for the experts' under device-sized products. With
      // them the update writes each one; the first step's products wrote them first.
      const bool first = &c == &steps.front();
      const int64_t uses = shadows ? (first ? 2 : 1) : 2 * kMicroBatches;
      const bool skip = !shadows && in_kernel;
      EXPECT_EQ(c.weight_conversion_calls, (weights - (skip ? expert_weights : 0)) * uses);
      EXPECT_EQ(c.weight_conversion_elements, (elements - (skip ? expert_elements : 0)) * uses);
      // The other f32 -> bf16 conversions are the activations and gradients, the same
      // number either way.
      const int64_t f32 = static_cast<int>(DType::kF32), bf16 = static_cast<int>(DType::kBF16);
      EXPECT_GT(c.conversion_calls[f32][bf16], c.weight_conversion_calls);
    }
  }
  }
}

TEST_F(DeviceCountsTest, Bf16ShadowsAreBitIdentical) {
  if (!is_root()) return;
  constexpr int64_t kBitSteps = 4;
  auto with = TrainProfiled({"runtime.precision=bf16"}, dir("bits_shadow"), kBitSteps, true);
  auto without = TrainProfiled({"runtime.precision=bf16"}, dir("bits_noshadow"), kBitSteps, false);
  ASSERT_NE(with, nullptr);
  ASSERT_NE(without, nullptr);
  ASSERT_EQ(with->losses().size(), static_cast<size_t>(kBitSteps));
  ExpectSameBits(*with, *without);
  // The shadows changed the counts, not the numbers.
  EXPECT_LT(with->profile()->total_counts().weight_conversion_calls,
            without->profile()->total_counts().weight_conversion_calls);
}

// Every profiled step of `trainer` (kSteps of them) converts `weights` weight shadows (the
// update's; the first step's products wrote them too: twice that), `per_mb` other f32 -> bf16
// operands per micro-batch, and nothing back to f32.
void ExpectConversionsPerStep(const Trainer& trainer, int64_t weights, int64_t per_mb) {
  const int64_t f32 = static_cast<int>(DType::kF32), bf16 = static_cast<int>(DType::kBF16);
  const std::vector<DeviceCounts>& steps = trainer.profile()->step_counts();
  ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps));
  for (const DeviceCounts& c : steps) {
    const int64_t shadow_writes = &c == &steps.front() ? 2 * weights : weights;
    EXPECT_EQ(c.weight_conversion_calls, shadow_writes);
    EXPECT_EQ(c.conversion_calls[f32][bf16], shadow_writes + kMicroBatches * per_mb);
    EXPECT_EQ(c.conversion_calls[bf16][f32], 0);
  }
}

// Per micro-batch and per MoE block (gelu experts, top-1, no shared experts), the f32 -> bf16
// conversions of activations and gradients under bf16 products:
//                         f32 storage                     bf16 storage
//   attention forward     x for q, k, v; a for o: 4       a once: 1 (norm1 writes x as
//                                                         the bf16 operand of q, k, v)
//   experts forward       x, h (each product): 2          none: 0 (the dispatch gathers x
//                                                         as the experts' bf16 operand, the
//                                                         activation's pass writes h and a
//                                                         in bf16, no bias or not, and the
//                                                         combine keeps its rows rounded)
//   experts backward      x, h again: 2                   none: 0 (x and h are kept bf16;
//                                                         in both storages the combine's
//                                                         backward writes dy and the
//                                                         activation's backward da as the
//                                                         products' bf16 operands)
//   attention backward    dy of q, k, v, o and their      dy of q, k, v, o: 4 (their inputs
//                         inputs again: 8                 are kept bf16)
// and the tied head: its input forward (1), dlogits once for its two products and its input
// backward (2; dlogits, the largest operand, was converted once per product, 3, before);
// under bf16 storage the final norm writes the head's input as its bf16 operand, so only
// dlogits (1). bf16 storage reads nothing back as f32 (no bf16 -> f32 conversion: the
// activation's and the combine's backward read the kept bf16 a and rows themselves; the tiny
// model's head_dim 16 keeps the exact attention, which never reads o.x back). Plus the 13 weight shadows (the
// update's; twice on the first step). That is with the host-sized expert products
// (moe.dispatch_counts: host);
// the device-sized ones round f32 operands as they load them, so under f32 storage the
// experts' forward converts nothing and neither does their backward: 4 + 0 + 0 + 8 per
// block; bf16 storage is unchanged.
TEST_F(DeviceCountsTest, Bf16ActivationStorageConvertsEachOperandOnce) {
  if (!is_root()) return;
  const int64_t weights = 13, head = 1 + 2, head_bf16 = 1;
  const int64_t per_mb_f32 = kMoELayers * (4 + 2 + 2 + 8) + head;
  const int64_t per_mb_bf16 = kMoELayers * (1 + 0 + 0 + 4) + head_bf16;
  const int64_t per_mb_f32_device = kMoELayers * (4 + 0 + 0 + 8) + head;
  ASSERT_EQ(per_mb_f32, 35);
  ASSERT_EQ(per_mb_bf16, 11);
  ASSERT_EQ(per_mb_f32_device, 27);
  for (const char* counts : {"host", "device"}) {
  for (bool stored_bf16 : {false, true}) {
    SCOPED_TRACE(StrCat(stored_bf16 ? "bf16 storage" : "f32 storage", ", ", counts));
    const bool in_kernel = std::string(counts) == "device";
    std::vector<std::string> overrides = {"runtime.precision=bf16",
                                          StrCat("moe.dispatch_counts=", counts)};
    if (stored_bf16) overrides.push_back("runtime.activation_dtype=bf16");
    auto trainer = TrainProfiled(
        overrides, dir(StrCat(stored_bf16 ? "storage_bf16_" : "storage_f32_", counts)), kSteps);
    ASSERT_NE(trainer, nullptr);
    ExpectConversionsPerStep(
        *trainer, weights,
        stored_bf16 ? per_mb_bf16 : (in_kernel ? per_mb_f32_device : per_mb_f32));
  }
  }
}

// The same count on the fused attention path (head_dim 64: one head of d_model 64; the
// core reads q, k and v as bf16 operands and writes a in bf16): the q, k and v projections
// write their outputs in bf16 (kernels::Gemm's bf16 c) and the core writes a so, so the
// attention forward converts nothing (it converted q, k and v after their projections, 3,
// until 2026-12-04); the rest is as above: 2 * (0 + 0 + 0 + 4) + 1 per micro-batch. The
// numbers are the f32 results rounded once, as the core read them before: the first step's
// loss is the same bits as with f32 storage, where the core rounds f32 q, k and v itself.
TEST_F(DeviceCountsTest, FusedAttentionProjectionsWriteBf16Operands) {
  if (!is_root()) return;
  const int64_t weights = 13, per_mb = kMoELayers * (0 + 0 + 0 + 4) + 1;
  ASSERT_EQ(per_mb, 9);
  auto trainer = TrainProfiled({"runtime.precision=bf16", "runtime.activation_dtype=bf16",
                                "model.d_model=64", "model.n_heads=1"},
                               dir("fused_attention_bf16"), kSteps);
  ASSERT_NE(trainer, nullptr);
  ExpectConversionsPerStep(*trainer, weights, per_mb);
  auto f32_storage = TrainProfiled({"runtime.precision=bf16", "model.d_model=64",
                                    "model.n_heads=1"},
                                   dir("fused_attention_f32"), kSteps);
  ASSERT_NE(f32_storage, nullptr);
  const double first = trainer->losses().at(0), first_f32 = f32_storage->losses().at(0);
  EXPECT_EQ(std::memcmp(&first, &first_f32, sizeof(double)), 0) << first << " vs " << first_f32;
}

// One rank's losses and its step's workspace peak over `steps` steps of bf16 products.
struct StorageRun {
  std::vector<double> losses;
  int64_t workspace_peak = 0;
};

StorageRun TrainStorage(bool stored_bf16, const std::string& out, int64_t steps) {
  std::vector<std::string> overrides = {"runtime.precision=bf16",
                                        "train.max_steps=" + std::to_string(steps)};
  if (stored_bf16) overrides.push_back("runtime.activation_dtype=bf16");
  static std::unique_ptr<dist::Communicator> local = dist::MakeLocalCommunicator(Device::Cpu(), 0);
  QuietStdout quiet;
  auto trainer = Trainer::Create(TrainFixture::TinyConfig(overrides), out, *local);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return {};
  ResetMemoryPeaks(Device::Cpu());
  const Status ran = (*trainer)->Run(steps);
  EXPECT_TRUE(ran.ok()) << ran;
  StorageRun run{(*trainer)->losses(), MemoryUseOf(Device::Cpu()).peak[0]};
  return run;
}

TEST_F(DeviceCountsTest, Bf16ActivationStorageTrains) {
  if (!is_root()) return;
  constexpr int64_t kTrainSteps = 30;
  const StorageRun f32 = TrainStorage(false, dir("train_storage_f32"), kTrainSteps);
  const StorageRun bf16 = TrainStorage(true, dir("train_storage_bf16"), kTrainSteps);
  ASSERT_EQ(f32.losses.size(), static_cast<size_t>(kTrainSteps));
  ASSERT_EQ(bf16.losses.size(), static_cast<size_t>(kTrainSteps));
  // The forward is unchanged: the first step's loss (before any update) is the same bits.
  EXPECT_EQ(std::memcmp(&f32.losses[0], &bf16.losses[0], sizeof(double)), 0)
      << f32.losses[0] << " vs " << bf16.losses[0];
  // It learns: the mean of the last 5 losses is well below the first (about ln 256 = 5.5).
  double tail = 0, tail_f32 = 0;
  for (int64_t s = kTrainSteps - 5; s < kTrainSteps; ++s) {
    tail += bf16.losses[s] / 5;
    tail_f32 += f32.losses[s] / 5;
  }
  EXPECT_LT(tail, bf16.losses[0] - 1.5) << "the loss did not fall";
  // Near the f32-storage run: rounding a to bf16 moves each element of the experts' and
  // MLP's activation gradients by at most about 2^-9 of its size, no more than the bf16
  // products' own rounding of every operand, and the runs drift apart only through it
  // (measured here: the losses at most 0.015 apart over 30 steps, the tail means 0.0012).
  // The bounds, 0.1 per step and 0.05 on the tail mean, are margins of about 7x and 40x for
  // other CPUs' summation orders; they are a sanity bound, not a derived one (training
  // amplifies differences), and the exact contract is tests/moe/activation_storage_test.cc.
  double most = 0;
  for (int64_t s = 0; s < kTrainSteps; ++s) {
    EXPECT_NEAR(bf16.losses[s], f32.losses[s], 0.1) << "step " << s;
    most = std::max(most, std::abs(bf16.losses[s] - f32.losses[s]));
  }
  EXPECT_NEAR(tail, tail_f32, 0.05);
  // The kept activations shrink: the step's workspace peak is lower.
  EXPECT_LT(bf16.workspace_peak, f32.workspace_peak);
  std::printf("[ info     ] losses %.4f -> %.4f (bf16 storage) vs %.4f -> %.4f (f32), at most "
              "%.4f apart; workspace peak %lld vs %lld bytes\n",
              bf16.losses[0], tail, f32.losses[0], tail_f32, most,
              static_cast<long long>(bf16.workspace_peak),
              static_cast<long long>(f32.workspace_peak));
}

}  // namespace
}  // namespace switchyard::train::testing
