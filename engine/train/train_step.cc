// One training step of Trainer (trainer.h): the micro-batches through the pipeline runner
// (ordered gradient accumulation when on), gradient sync and the tied-embedding sum, the
// non-finite check (train.on_nonfinite), clipping and the update, the routing statistics
// and the expert-bias update. Kept apart from trainer.cc (set-up, checkpoints, the run loop).
//
// runtime.precision=bf16: the micro-batches' products read bf16 shadows of the weights,
// written once per step, by the last AdamW update or at their first use
// (engine/core/weight_shadows.h); the window closes
// when the backward passes end, before anything changes a weight.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/core/profile.h"
#include "engine/core/step_readback.h"
#include "engine/dist/ordered_sum.h"
#include "engine/parallel/clip.h"
#include "engine/parallel/nonfinite.h"
#include "engine/train/schedule.h"
#include "engine/train/trainer.h"
#include "kernels/elementwise.h"
#include "moe/router.h"

namespace switchyard::train {
namespace {

// Every trainable gradient, packed into one flat f32 tensor (registry order), and back.
Tensor PackGrads(const parallel::ParameterRegistry& reg, DeviceContext* ctx) {
  int64_t total = 0;
  for (const parallel::Parameter& p : reg.params())
    if (p.trainable) total += p.grad.numel();
  Tensor flat = Tensor::Empty({total}, DType::kF32, reg.params().front().grad.device());
  int64_t at = 0;
  for (const parallel::Parameter& p : reg.params()) {
    if (!p.trainable) continue;
    flat.View({p.grad.numel()}, at).CopyFrom(p.grad.Reshape({p.grad.numel()}), ctx);
    at += p.grad.numel();
  }
  return flat;
}

// Opens the step's bf16 weight-shadow window (bf16 products at ZeRO stage 0 only: a shadow
// holds 2 bytes per weight element on every rank, unsharded, the memory ZeRO stages 1-2 are
// chosen to save, and stage 3 releases its parameters between uses): the trainable weights
// (2-d and more) are registered at the first step; a shadow the last AdamW update wrote is
// fresh (engine/train/optimizer.cc), any other is written at its first use.
// engine/plan/device_fit.cc counts the shadows in the predicted peak.
void OpenWeightShadows(DeviceContext& ctx, const parallel::ParameterRegistry& reg,
                       int zero_stage) {
  if (ctx.matmul_dtype() != DType::kBF16 || zero_stage >= 1) return;
  WeightShadows& shadows = ctx.weight_shadows();
  if (shadows.empty()) {
    for (const parallel::Parameter& p : reg.params()) {
      if (p.trainable && p.value.defined() && p.value.ndim() >= 2 &&
          p.value.dtype() == DType::kF32) {
        shadows.Register(p.value);
      }
    }
  }
  shadows.Activate();
}

// The tree sum of the per micro-batch sums once the step's readback is in.
double ResolvedTreeSum(std::vector<PendingSum>& sums, std::span<const double> slots) {
  std::vector<double> values;
  values.reserve(sums.size());
  for (PendingSum& s : sums) {
    s.Resolve(slots);
    values.push_back(s);
  }
  return dist::TreeSumDoubles(values);
}

void UnpackGrads(const Tensor& flat, parallel::ParameterRegistry& reg, DeviceContext* ctx) {
  int64_t at = 0;
  for (parallel::Parameter& p : reg.params()) {
    if (!p.trainable) continue;
    p.grad.CopyFrom(flat.View(p.grad.shape(), at), ctx);
    at += p.grad.numel();
  }
}

}  // namespace

// What one step's micro-batches add up to on this rank.
struct Trainer::StepSums {
  // Per micro-batch loss sums, added in the tree order (as the ranks' sums are); pending
  // until the step's readback.
  std::vector<PendingSum> ce, aux, z;
  // Statistics of every MoE layer of the model (moe_layer_ids_ order): this stage fills its
  // own, the sums over pp complete them.
  std::vector<moe::MoEStats> stats;
};

// The captured micro-batches (runtime.cuda_graphs). What the host did while capturing is
// kept for every replay: the inputs the captured kernels read, the readback slots they
// write, and the sums that name those slots (the same slots every step).
struct Trainer::StepGraph {
  std::unique_ptr<CapturedWork> work;
  std::vector<model::DecoderInput> inputs;  // each step's batches are copied into these
  std::vector<int64_t> padding;             // the batches' padding at the capture
  StepReadback readback;                    // the slots reserved while capturing
  StepSums sums;
  // Each forward's routing choices (chunk, micro-batch, layer): kept alive, so a replay
  // leaves them there for the steps that record routing by language.
  struct Choices {
    int chunk = 0, micro = 0;
    size_t layer = 0;
    Tensor indices;
  };
  std::vector<Choices> choices;
};

// Here, where StepGraph is complete.
Trainer::Trainer(const config::Config& config, const std::string& out_dir,
                 dist::Communicator& world)
    : config_(config),
      out_dir_(out_dir),
      world_(world),
      sync_(config::SyncPolicyOf(config)),
      checkpointer_(out_dir, config.train.checkpoint_every),
      nonfinite_(config.train) {}
Trainer::~Trainer() = default;

void Trainer::ForgetGraph() {
  graph_.reset();
  eager_steps_ = 0;
}

int64_t Trainer::graph_operations() const { return graph_ ? graph_->work->operations() : 0; }

StepMetrics Trainer::TrainStep(bool record_routing) {
  const auto start = std::chrono::steady_clock::now();
  if (profiler_) profiler_->BeginStep();
  const config::TrainConfig& tc = config_.train;
  const int64_t tokens = int64_t{pc_->mesh().dp()} * tc.micro_batch_size * tc.grad_accum *
                         config_.model.seq_len;
  const int64_t global_groups = int64_t{pc_->mesh().dp()} * tc.grad_accum;
  if (!sync_.stream) zero_->MaterializeGradients();
  registry_.ZeroGrad(rt_.ctx.get());  // the resident gradients (streaming: the unbucketed)
  // The weights may have been loaded or rolled back since the last step: fresh replicas.
  MarkReplicasStale();
  // The micro-batches and the ordered accumulation's tree live to the end of the step (the
  // workspace peak counts them through the sync and the update).
  dist::TreeAccumulator grads(rt_.ctx.get());
  std::vector<data::Batch> batches(tc.grad_accum);
  OpenWeightShadows(*rt_.ctx, registry_, config_.parallel.zero_stage);
  // The step's values the host needs at its end stay on the device until one readback,
  // with the gradient norm (engine/core/step_readback.h).
  StepReadback readback(readback_slots_);  // the most slots a step took yet: one chunk
  rt_.ctx->set_step_readback(&readback);
  StepSums step = config_.runtime.cuda_graphs
                      ? GraphedMicroBatches(record_routing, batches, grads, readback)
                      : AccumulateGradients(record_routing, batches, grads);
  rt_.ctx->weight_shadows().Deactivate();  // the weights change from here on
  SyncGradients();
  if (step_ == nan_step_) InjectNan();
  std::optional<ScopedPhase> phase(Phase::kOptimizer);
  // The clip's factor is applied inside the optimizer's update (no pass of its own).
  std::vector<double> slots;
  const double norm =
      parallel::GlobalGradNormAtStepEnd(registry_, *pc_, rt_.ctx.get(), zero_.get(), &slots);
  rt_.ctx->set_step_readback(nullptr);
  readback_slots_ = std::max(readback_slots_, readback.last_read());
  const double local_sums[3] = {ResolvedTreeSum(step.ce, slots),
                                ResolvedTreeSum(step.aux, slots),
                                ResolvedTreeSum(step.z, slots)};
  for (moe::MoEStats& s : step.stats) s.Resolve(slots);
  if (routing_) routing_->Resolve(slots);
  const float clip_scale = parallel::ClipScale(norm, tc.grad_clip);
  const float lr = ScheduleFor(tc).LrAt(optimizer_->step());
  phase.emplace(Phase::kCommunication);
  const std::vector<double> sums = ReduceLossSums(local_sums);
  // A non-finite loss or gradient norm: no update (train.on_nonfinite decides what
  // follows). Every rank holds the same numbers; the flag is agreed anyway.
  const double loss = sums[0] / static_cast<double>(tokens) +
                      (sums[1] + sums[2]) / static_cast<double>(global_groups);
  std::string first_bad;
  const bool finite = AgreeFinite(loss, norm, &first_bad);
  phase.reset();
  Update(finite, lr, clip_scale, step.stats);

  StepMetrics m;
  m.step = step_;
  m.ce_loss = sums[0] / static_cast<double>(tokens);
  m.aux_loss = sums[1] / static_cast<double>(global_groups);
  m.z_loss = sums[2] / static_cast<double>(global_groups);
  m.loss = m.ce_loss + m.aux_loss + m.z_loss;
  m.lr = lr;
  m.grad_norm = norm;
  m.nonfinite = !finite;
  m.nonfinite_param = first_bad;
  m.moe_layer_ids = moe_layer_ids_;
  m.moe = std::move(step.stats);
  m.step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  m.tokens_per_s = static_cast<double>(tokens) / m.step_s;
  if (profiler_) profiler_->EndStep(m.step_s);
  return m;
}

model::DecoderInput Trainer::TrainingInput(const data::Batch& batch) {
  model::DecoderInput in =
      MicroBatchInput(batch, pipeline_->chunk(0), *pc_, step_, /*training=*/true);
  if (config_.runtime.cuda_graphs) {
    // The routers read their keys from device memory: a replay's copy of the inputs brings
    // the step's keys and first token along with its tokens.
    const int64_t n = 4 * config_.model.n_layers;
    in.rng_values = Tensor::FromVector(moe::RouterRngValues(config_.moe.seed, step_,
                                                            config_.model.n_layers,
                                                            in.first_token),
                                       {n})
                        .To(rt_.device(), rt_.ctx.get());
  }
  return in;
}

Trainer::StepSums Trainer::GraphedMicroBatches(bool record_routing,
                                               std::vector<data::Batch>& batches,
                                               dist::TreeAccumulator& grads,
                                               StepReadback& readback) {
  DeviceContext* ctx = rt_.ctx.get();
  const int accum = config_.train.grad_accum;
  // The first step warms the allocator and writes the weight shadows (so the capture
  // allocates as a steady step does).
  if (eager_steps_ == 0) {
    ++eager_steps_;
    return AccumulateGradients(record_routing, batches, grads);
  }
  for (int micro = 0; micro < accum; ++micro) batches[micro] = loader_->GetBatch(step_, micro);
  if (graph_) {
    for (int micro = 0; micro < accum; ++micro) {
      // A batch padded differently from the captured ones (the statistics count its valid
      // rows, a host value of the capture) runs eagerly.
      if (batches[micro].padding != graph_->padding[micro]) {
        return AccumulateGradients(record_routing, batches, grads);
      }
    }
    for (int micro = 0; micro < accum; ++micro) {
      const model::DecoderInput in = TrainingInput(batches[micro]);
      model::DecoderInput& captured = graph_->inputs[micro];
      captured.tokens.CopyFrom(in.tokens, ctx);
      captured.targets.CopyFrom(in.targets, ctx);
      captured.rng_values.CopyFrom(in.rng_values, ctx);
    }
    // What borrowed the graph's idle memory since its last replay must have given it back.
    if (!graph_->work->ReclaimMemory()) {
      if (is_root()) {
        std::printf("cuda_graphs: memory lent between replays is still in use at step %lld; "
                    "capturing again\n", static_cast<long long>(step_));
      }
      ForgetGraph();
      return AccumulateGradients(record_routing, batches, grads);
    }
    readback = graph_->readback;  // the captured slots, then this step's own after them
    ReplayGraph();
    if (record_routing) RecordReplayedRouting(batches);
    return graph_->sums;
  }
  // Capture: the inputs first (their copies from the host stay outside the graph), then the
  // micro-batches with nothing run, then one replay for this step.
  auto graph = std::make_unique<StepGraph>();
  for (int micro = 0; micro < accum; ++micro) {
    graph->inputs.push_back(TrainingInput(batches[micro]));
    graph->padding.push_back(batches[micro].padding);
  }
  ctx->BeginCapture();
  capturing_ = graph.get();
  StepSums sums = AccumulateGradients(/*record_routing=*/false, batches, grads, &graph->inputs);
  capturing_ = nullptr;
  graph->work = ctx->EndCapture();
  graph->readback = readback;
  graph->sums = sums;
  if (is_root()) {
    std::printf("cuda_graphs: step %lld's %d micro-batch(es) captured (%lld operations); the "
                "later steps replay them\n",
                static_cast<long long>(step_), accum,
                static_cast<long long>(graph->work->operations()));
  }
  graph_ = std::move(graph);
  ReplayGraph();
  if (record_routing) RecordReplayedRouting(batches);
  return sums;
}

void Trainer::ReplayGraph() {
  ScopedPhase phase(Phase::kGraphReplay);
  graph_->work->Replay(rt_.ctx.get());
  ++graph_replays_;
  // Until the next replay, the step's end, validation and the next step's inputs may use the
  // graph's idle memory (so graph mode needs no more than eager steps).
  graph_->work->LendMemory();
}

void Trainer::RecordReplayedRouting(const std::vector<data::Batch>& batches) {
  // As AddForward records an eager forward's: tp/cp rank 0 of each group.
  if (!routing_ || pc_->tp_cp().rank() != 0) return;
  for (const StepGraph::Choices& c : graph_->choices) {
    const data::Batch& batch = batches[c.micro];
    routing_->AddInStep(moe_slot_of_[c.chunk][c.layer], c.indices,
                        batch.labels.Reshape({batch.labels.numel()}), rt_.ctx.get());
  }
}

Trainer::StepSums Trainer::AccumulateGradients(bool record_routing,
                                               std::vector<data::Batch>& batches,
                                               dist::TreeAccumulator& grads,
                                               const std::vector<model::DecoderInput>* inputs) {
  const config::TrainConfig& tc = config_.train;
  const int64_t global_batch = int64_t{pc_->mesh().dp()} * tc.micro_batch_size * tc.grad_accum;
  const int64_t global_groups = int64_t{pc_->mesh().dp()} * tc.grad_accum;
  parallel::ParameterRegistry& reg = registry_;
  DeviceContext* ctx = rt_.ctx.get();
  moe::MoEStats none;  // what a stage without the layer contributes to its sums over pp
  none.tokens_per_expert.assign(config_.moe.num_experts, 0);
  none.tokens_per_expert_kept.assign(config_.moe.num_experts, 0);
  StepSums step{.ce = std::vector<PendingSum>(tc.grad_accum),
                .aux = std::vector<PendingSum>(tc.grad_accum),
                .z = std::vector<PendingSum>(tc.grad_accum),
                .stats = std::vector<moe::MoEStats>(moe_layer_ids_.size(), none)};
  PipelineRunner::Hooks hooks;
  hooks.input = [&](int micro) {
    if (inputs == nullptr) batches[micro] = loader_->GetBatch(step_, micro);
    model::DecoderInput in = inputs != nullptr ? (*inputs)[micro] : TrainingInput(batches[micro]);
    in.ce_grad_scale = 1.0f / static_cast<float>(global_batch * config_.model.seq_len);
    in.aux_grad_scale = 1.0f / static_cast<float>(global_groups);
    return in;
  };
  hooks.after_forward = [&](int c, int micro, const model::DecoderOutput& out) {
    AddForward(c, micro, out, record_routing ? &batches[micro] : nullptr, step);
  };
  if (sync_.ordered_accum) {
    hooks.before_backward = [&](int, int) { reg.ZeroGrad(ctx); };
    hooks.after_backward = [&](int, int) { grads.Add(PackGrads(reg, ctx)); };
  } else if (sync_.reduce_during_backward) {
    // The last backward (streaming: every backward): each part's gradient bucket goes out
    // as soon as it is final.
    hooks.on_last_backward_done = [&](const parallel::PartId& part) {
      ScopedPhase phase(Phase::kCommunication);
      for (size_t i : part_params_.at(part)) grad_sync_->MarkReady(i);
    };
    if (sync_.stream) hooks.on_backward_done = hooks.on_last_backward_done;
  }
  pipeline_->RunStep(hooks);
  if (sync_.ordered_accum) UnpackGrads(grads.Result(), reg, ctx);
  return step;
}

void Trainer::AddForward(int c, int micro, const model::DecoderOutput& out,
                         const data::Batch* batch, StepSums& step) {
  step.ce[micro] += out.ce_sum;
  step.aux[micro] += out.aux_sum;
  step.z[micro] += out.z_sum;
  // From Forward's output, which activation recompute leaves whole.
  for (size_t layer = 0; layer < out.moe_stats.size(); ++layer) {
    step.stats[moe_slot_of_[c][layer]].Add(out.moe_stats[layer]);
    if (capturing_ != nullptr) {
      capturing_->choices.push_back({c, micro, layer, out.moe_indices[layer]});
    }
    // Under tp and cp every rank of tp_cp routed the whole group: its rank 0 records it.
    if (batch != nullptr && pc_->tp_cp().rank() == 0 && routing_) {
      routing_->AddInStep(moe_slot_of_[c][layer], out.moe_indices[layer],
                          batch->labels.Reshape({batch->labels.numel()}), rt_.ctx.get());
    }
  }
}

void Trainer::SyncGradients() {
  ScopedPhase phase(Phase::kCommunication);
  if (sync_.ordered_accum) {
    grad_sync_->SyncAll();
  } else {
    grad_sync_->Finish();
  }
  SumTiedEmbeddingGrads();
}

std::vector<double> Trainer::ReduceLossSums(std::span<const double> local) {
  // Over dp x cp (every tp rank holds the same sums), then over the pipeline stages (the
  // last holds the cross-entropy). Ordered f64 sums: the numbers do not depend on the layout.
  std::vector<double> sums = dist::AllReduceDoubles(pc_->dp_cp(), local);
  if (pc_->pp().size() > 1) sums = dist::AllReduceDoubles(pc_->pp(), sums);
  return sums;
}

bool Trainer::AgreeFinite(double loss, double norm, std::string* first_bad) {
  Tensor bad = Tensor::FromVector<int32_t>({std::isfinite(loss) && std::isfinite(norm) ? 0 : 1}, {1});
  world_.AllReduce(bad, dist::ReduceOp::kMax);
  const bool finite = bad.data<int32_t>()[0] == 0;
  if (!finite) *first_bad = parallel::AgreeFirstNonFiniteGrad(registry_, zero_.get(), world_);
  return finite;
}

void Trainer::Update(bool finite, float lr, float clip_scale, std::vector<moe::MoEStats>& stats) {
  std::optional<ScopedPhase> phase;
  if (finite) {
    phase.emplace(Phase::kOptimizer);
    optimizer_->Step(lr, clip_scale);
    phase.emplace(Phase::kCommunication);
    zero_->GatherUpdatedParameters();
  } else {
    phase.emplace(Phase::kCommunication);
  }
  zero_->FreeGradients();
  // The routing statistics over dp x cp x tp (each tp rank counts the rows it routed), then
  // over the pipeline stages (each holds its layers' numbers).
  for (moe::MoEStats& s : stats) {
    s.AllReduce(pc_->dp_cp_tp());
    if (pc_->pp().size() > 1) s.AllReduce(pc_->pp());
  }
  phase.reset();
  // Each MoE layer's end of the step from the whole world's statistics: the global aux
  // loss's expert load, the replicas and their next plan, the expert bias (moe/moe_layer.h).
  const std::vector<moe::ReplicaPlan> plans = NextReplicaPlans(stats);
  for (int c = 0; c < pipeline_->chunks(); ++c) {
    std::vector<moe::MoELayer*> layers = pipeline_->chunk(c).moe_layers();
    for (size_t l = 0; l < layers.size(); ++l) {
      const size_t slot = moe_slot_of_[c][l];
      layers[l]->EndOfStep(stats[slot], finite, plans.empty() ? nullptr : &plans[slot],
                           rt_.ctx.get());
    }
  }
}

void Trainer::MarkReplicasStale() {
  if (config_.moe.replicate_hot_experts <= 0) return;
  for (int c = 0; c < pipeline_->chunks(); ++c) {
    for (moe::MoELayer* layer : pipeline_->chunk(c).moe_layers()) layer->MarkExpertsUpdated();
  }
}

std::vector<moe::ReplicaPlan> Trainer::NextReplicaPlans(const std::vector<moe::MoEStats>& stats) {
  const moe::MoEConfig& mc = config_.moe;
  if (mc.replicate_hot_experts <= 0) return {};
  if (!replica_planner_) {
    replica_planner_.emplace(mc.replicate_hot_experts, mc.replicate_every, config_.parallel.ep);
  }
  // The tokens the experts were sent (after capacity), the whole world's.
  std::vector<std::vector<int64_t>> counts;
  for (const moe::MoEStats& s : stats) counts.push_back(s.tokens_per_expert_kept);
  return replica_planner_->AddStep(counts);
}

void Trainer::SumTiedEmbeddingGrads() {
  dist::Communicator& pp = data_pc().pp();
  if (pp.size() == 1 || !config_.model.tie_embeddings) return;
  const bool first = pp.rank() == 0, last = pp.rank() == pp.size() - 1;
  if (!first && !last) return;
  // The token table's copy on this stage, as the decoder marked it (Parameter::tied).
  const std::vector<parallel::Parameter>& params = registry_.params();
  size_t wte = params.size();
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].tied) continue;
    SY_CHECK(wte == params.size()) << "two tied parameters on one rank: " << params[wte].name
                                   << ", " << params[i].name;
    wte = i;
  }
  SY_CHECK(wte < params.size()) << "the first and last pipeline stages hold the tied token table";
  // Its summed gradient as this rank holds it: whole, or the range it owns under ZeRO (the
  // same range on both stages).
  Tensor mine = zero_->OwnedGrad(wte);
  if (mine.numel() == 0) return;  // the peer owns nothing of it either
  DeviceContext* ctx = rt_.ctx.get();
  Tensor other = Tensor::Empty(mine.shape(), DType::kF32, mine.device());
  const int peer = first ? pp.size() - 1 : 0;
  std::vector<dist::P2POp> ops = {{dist::P2POp::kSend, mine, peer},
                                  {dist::P2POp::kRecv, other, peer}};
  pp.BatchSendRecv(ops)->Wait();
  // first + last on both ranks: the same bits.
  if (first) {
    kernels::Axpy(1.0f, other, mine, ctx);
  } else {
    kernels::Axpy(1.0f, mine, other, ctx);
    mine.CopyFrom(other, ctx);
  }
}

void Trainer::InjectNan() {
  for (parallel::Parameter& p : registry_.params()) {
    if (p.name != nan_param_ || !p.grad.defined() || p.grad.numel() == 0) continue;
    if (!p.grad.buffer().resident()) continue;  // streamed into the shard and freed
    int64_t at = 0;
    if (nan_expert_ >= 0) {
      const int64_t row = nan_expert_ - p.OffsetAt(0);
      if (row < 0 || row >= p.grad.dim(0)) continue;  // another rank holds that expert
      at = row * (p.grad.numel() / p.grad.dim(0));
    }
    Tensor host = p.grad.To(Device::Cpu(), rt_.ctx.get());
    host.data<float>()[at] = std::nanf("");
    p.grad.CopyFrom(host, rt_.ctx.get());
  }
}

}  // namespace switchyard::train
