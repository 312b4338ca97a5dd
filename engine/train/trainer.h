// The training loop (`switchyard train`): one rank or many under mpirun. Each step:
//
//   for each micro-batch of this data-parallel rank (train.grad_accum of them), in the
//   pipeline schedule's order (pipeline_runner.h; this rank's stages — several under an
//   interleaved schedule — or all layers at pp 1):
//       forward + backward of the stage (routing group = the micro-batch)
//   sum gradients (dense over dp x cp, experts over edp; in buckets, reduce-scattered under
//   ZeRO), and the tied token table's between the first and the last stage
//   clip by the global norm, AdamW/SGD update, expert-bias update (aux-loss-free)
//   log (progress line, metrics.jsonl; routing.jsonl every logging.routing_every steps),
//   validate every train.eval_every steps (run_policy.h),
//   checkpoint every train.checkpoint_every steps, at the end, and on SIGTERM/SIGINT
//   (checkpointer.h).
//
// Losses follow MODEL.md: the cross-entropy is the mean over every target of the global
// batch, each MoE layer adds the mean over routing groups of (aux + z). Gradients of each
// rank are pre-scaled by those global counts so the all-reduce SUM is the exact gradient.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/core/captured_work.h"
#include "engine/core/profile.h"
#include "engine/core/step_readback.h"
#include "engine/dist/ordered_sum.h"
#include "engine/dist/parallel_context.h"
#include "engine/model/decoder.h"
#include "engine/parallel/grad_sync.h"
#include "engine/parallel/zero.h"
#include "engine/config/config.h"
#include "engine/config/sync_settings.h"
#include "engine/data/loader.h"
#include "engine/train/checkpointer.h"
#include "engine/train/metrics.h"
#include "engine/train/optimizer.h"
#include "engine/train/pipeline_runner.h"
#include "engine/train/run_policy.h"
#include "engine/train/runtime.h"
#include "moe/replication.h"

namespace switchyard::train {

// A checkpoint's config.yaml (saved_yaml, named `source` in errors) against the running
// config: every model.* key and the moe keys that shape or route the model (num_experts,
// layer_freq, top_k, d_expert, activation, bias, normalize_gates, routed_scaling_factor,
// score, num_shared_experts, d_shared) must be equal; the first difference is one error
// naming both values.
Status CheckSameModel(const std::string& saved_yaml, const std::string& source, const config::Config& now);
// Whether section.key is one of those keys.
bool IsModelKey(const std::string& section, const std::string& key);

class Trainer {
 public:
  // Validates the config for this world, builds the mesh, the model chunks of this rank's
  // pipeline stages, the gradient sync and ZeRO, the optimizer, the data loader and the
  // pipeline runner, and makes the output directory ready. Collective over world.
  static StatusOr<std::unique_ptr<Trainer>> Create(const config::Config& config,
                                                   const std::string& out_dir,
                                                   dist::Communicator& world);
  ~Trainer();

  // Loads a checkpoint (a step directory, or an output directory: its latest), saved under
  // any layout; training continues at the step after it.
  Status Resume(const std::string& path);

  // Trains until train.max_steps, or for at most `steps` more steps when steps > 0. Stops
  // early (saving a checkpoint) when SIGTERM or SIGINT arrives: OK with stop_reason()
  // kSignal. A step whose loss or gradient norm is not finite follows train.on_nonfinite;
  // when training stops for it, an error naming the step, the numbers and the first
  // parameter whose gradient is not finite (stop_reason() kNonFinite), nothing saved.
  Status Run(int64_t steps);

  enum class StopReason { kNone, kFinished, kSignal, kNonFinite };
  // Why the last Run returned (the same on every rank).
  StopReason stop_reason() const { return stop_reason_; }
  // Steps skipped for non-finite numbers so far (train.on_nonfinite=skip).
  int64_t nonfinite_skips() const { return nonfinite_.skips(); }

  // A test hook: after step `step`'s gradient sync, writes a NaN into the gradient of
  // parameter `name` on the ranks that hold it (element 0, or the first element of routed
  // expert `expert`'s row when expert >= 0). The CLI sets it from the environment variable
  // SWITCHYARD_TEST_NAN_GRAD="STEP:NAME[:EXPERT]" (tests only).
  void InjectNanGrad(int64_t step, std::string name, int64_t expert) {
    nan_step_ = step;
    nan_param_ = std::move(name);
    nan_expert_ = expert;
  }

  // runtime.cuda_graphs: the steps whose micro-batches ran as a replay of the captured
  // work (the capture's own step included), and the operations it holds (0 before it).
  int64_t graph_replays() const { return graph_replays_; }
  int64_t graph_operations() const;
  // The next step to run (the steps run so far, counting those before a resume).
  int64_t step() const { return step_; }
  // `switchyard train --profile`: from now on every step's time is split into phases
  // (engine/core/profile.h) and its device work counted (engine/core/counters.h); Run prints
  // the table at its end (rank 0) and writes OUT/profile.json. Off by default (the timers
  // then cost one branch each). The first skip_steps steps are not profiled (< 0: the
  // default, kGpuProfileSkipSteps on a GPU, whose phases are then timed with CUDA events,
  // and 0 on the CPU).
  static constexpr int64_t kGpuProfileSkipSteps = 3;
  void EnableProfile(int64_t skip_steps = -1);
  // The profile of this rank's steps so far; nullptr unless EnableProfile was called.
  const Profiler* profile() const { return profiler_.get(); }
  // This rank's device context (its stream, matmul precision and bf16 weight shadows).
  DeviceContext& device_context() { return *rt_.ctx; }
  // The host groups of this rank (benchmarks read their traffic).
  const dist::ParallelContext& parallel_context() const { return *pc_; }
  // Losses of the steps run so far (reduced over the data-parallel world), for tests.
  const std::vector<double>& losses() const { return losses_; }
  // This rank's first model chunk (its only one unless the schedule is interleaved), and
  // the parameters of all its chunks.
  model::Decoder& decoder() { return *chunks_.front(); }
  parallel::ParameterRegistry& registry() { return registry_; }
  // This rank's pipeline executor (benchmarks set its per-action trace).
  PipelineRunner& pipeline() { return *pipeline_; }
  // The ZeRO shards of the registry (every stage, 0 included), and the run's config.
  parallel::ZeroShards& zero() { return *zero_; }
  // The gradient sync (its buckets: tests compare them with the planner's).
  const parallel::GradSync& grad_sync() const { return *grad_sync_; }
  const config::Config& config() const { return config_; }
  // This rank's memory (engine/core/allocator.h's ledger, on the step's device): the model
  // states held between steps and the workspace peak over the steps run so far.
  struct Memory {
    int64_t parameters = 0, gradients = 0, optimizer = 0;  // bytes held between steps
    int64_t workspace_peak = 0;  // activations, buckets, gathered ZeRO-3 parts, scratch
    // Bytes the device's allocator has held from the system at its most (on a GPU the
    // caching allocator's cudaMalloc'd segments, engine/core/block_cache.h): the ledger's
    // peak plus what the cache's block sizes and segments add, what the device must have.
    int64_t reserved_peak = 0;
    // On a GPU, the bytes in use on the device when the report was made (Allocator::DeviceUsed:
    // the context and the libraries' workspaces included); -1 on the host.
    int64_t device_used = -1;
    int64_t model_states() const { return parameters + gradients + optimizer; }
  };
  Memory memory() const;
  // Where the step runs (runtime.device).
  Device device() const { return rt_.device(); }

 private:
  Trainer(const config::Config& config, const std::string& out_dir, dist::Communicator& world);

  // Create's phases. BuildModel: the mesh, the groups, the runtime, this rank's model chunks
  // and registry_. BuildGradientSync: the parts (Parameter::part), the gradient sync, ZeRO
  // and, at stage 3, the decoders' gather/free hooks. OpenData: the loader and the
  // validation batches. BuildPipeline: the MoE layer ids and slots, the pipeline runner and
  // the routing-by-label counts.
  Status BuildModel();
  void BuildGradientSync();
  void BuildOptimizer();
  Status OpenData();
  Status BuildPipeline();

  // Run's parts. ModelParameters: the model's trainable elements, each stage's counted
  // once and the tied table once (collective over pp). OpenRunLogs (rank 0):
  // metrics.jsonl and routing.jsonl, resumed at step_. PrintBanner (rank 0): the mesh, the
  // device, the parameters and the batch. LogStep: the step's loss and statistics kept,
  // its progress line and metrics record (rank 0). LogValidation: the validation loss
  // (collective). Summarize: the routing counts reduced (collective), the summary tables,
  // routing_by_language.json and the profile (rank 0).
  int64_t ModelParameters();
  Status OpenRunLogs();
  void PrintBanner(int64_t model_params, int64_t end) const;
  void LogStep(const StepMetrics& m);
  void LogValidation();
  Status Summarize(int stop_signal);

  // One optimizer step (train_step.cc), in its phases: AccumulateGradients runs the
  // micro-batches through the pipeline (adding each forward's sums with AddForward),
  // SyncGradients reduces the gradients over their groups (and sums the tied table's),
  // ReduceLossSums sums the losses over the data-parallel world and the stages,
  // AgreeFinite agrees whether the step is finite (else names the first non-finite
  // gradient), and Update applies it (when finite), reduces the routing statistics and
  // moves the expert bias.
  struct StepSums;
  StepMetrics TrainStep(bool record_routing);
  // batches: filled with the step's micro-batches; grads: their gradients under ordered
  // accumulation (SyncPolicy::ordered_accum), each alone, summed in the tree order.
  // inputs: the micro-batches' inputs to use instead of the loader's (a captured step).
  StepSums AccumulateGradients(bool record_routing, std::vector<data::Batch>& batches,
                               dist::TreeAccumulator& grads,
                               const std::vector<model::DecoderInput>* inputs = nullptr);
  // runtime.cuda_graphs: AccumulateGradients captured once (the second step this process
  // runs: the first warms the allocator and writes the weight shadows) and replayed after,
  // each step's batches copied into the inputs the capture read. Steps that record routing
  // run eagerly. `readback` is the step's (the capture's slots, then the step's own).
  struct StepGraph;
  // A training micro-batch's decoder input (MicroBatchInput), with the routers' device rng
  // values under runtime.cuda_graphs.
  model::DecoderInput TrainingInput(const data::Batch& batch);
  // Drops the captured work (the weights were loaded anew): the next steps capture again.
  void ForgetGraph();
  // Runs the captured micro-batches (charged to Phase::kGraphReplay), then lends the graph's
  // idle memory until the next replay reclaims it.
  void ReplayGraph();
  // After a replay: the routing choices of its forwards into the routing-by-language counts.
  void RecordReplayedRouting(const std::vector<data::Batch>& batches);
  StepSums GraphedMicroBatches(bool record_routing, std::vector<data::Batch>& batches,
                               dist::TreeAccumulator& grads, StepReadback& readback);
  // Chunk c's forward of micro-batch `micro` into step; batch: its labels when its routing
  // is recorded, else null.
  void AddForward(int c, int micro, const model::DecoderOutput& out, const data::Batch* batch,
                  StepSums& step);
  void SyncGradients();
  std::vector<double> ReduceLossSums(std::span<const double> local);
  bool AgreeFinite(double loss, double norm, std::string* first_bad);
  void Update(bool finite, float lr, float clip_scale, std::vector<moe::MoEStats>& stats);
  // Hot-expert relief (moe.replicate_hot_experts > 0) at a step's start: marks every MoE
  // layer's replicas stale (their owners' weights may have changed since the last step).
  void MarkReplicasStale();
  // Hot-expert relief after a step: every moe.replicate_every steps, the next plan of each
  // MoE layer (moe_layer_ids_ order) from the world's counts of those steps (the same on
  // every rank); empty otherwise (keep the plans) or without replication. stats: the step's,
  // reduced over the world.
  std::vector<moe::ReplicaPlan> NextReplicaPlans(const std::vector<moe::MoEStats>& stats);
  double Validate();
  Status Save();
  // The model's parameters as a checkpoint reads and writes them: whole boxes, of which a
  // rank writes its owned range under ZeRO stages 1-2; stage 3's shards in their place
  // (ZeroShards::CheckpointParameters). Values share storage with the model's.
  parallel::ParameterRegistry CheckpointRegistry() const;
  // Tied embeddings over pipeline stages: the first and the last stage add their token
  // table gradients (first + last, on both, so the copies stay equal). Under ZeRO each adds
  // the summed range it owns: the table has a bucket of its own on both stages
  // (BuildGradientSync), so pipeline peers own the same range. Collective over pp.
  void SumTiedEmbeddingGrads();
  // Every MoE layer's expert bias (moe_layer_ids_ order, E each), gathered over the
  // pipeline stages; empty without aux-loss-free balancing. Collective over pp.
  std::vector<std::vector<double>> ExpertBiases();
  // Logs memory() of every rank once (stdout on rank 0 and metrics.jsonl). Collective.
  void ReportMemory();
  bool is_root() const { return world_.rank() == 0; }

  // The groups gradients and tokens travel in (runtime.h); pc_ keeps the bookkeeping.
  dist::ParallelContext& data_pc() { return rt_.data_pc(*pc_); }

  config::Config config_;
  std::string out_dir_;
  dist::Communicator& world_;
  std::unique_ptr<dist::ParallelContext> pc_;  // host groups over world
  Runtime rt_;  // runtime.device; outlives the decoder, optimizer and gradient sync
  // This rank's model chunks (pipeline stages; one holding every layer at pp 1) and their
  // parameters in one registry (the gradient sync, ZeRO, optimizer and checkpoints read it).
  std::vector<std::unique_ptr<model::Decoder>> chunks_;
  parallel::ParameterRegistry registry_;
  std::unique_ptr<PipelineRunner> pipeline_;
  std::vector<int64_t> moe_layer_ids_;  // every MoE layer of the model, on every stage
  // Chunk c's l-th MoE layer: its index in moe_layer_ids_ (and in the step's statistics).
  std::vector<std::vector<size_t>> moe_slot_of_;
  std::unique_ptr<Optimizer> optimizer_;
  // What the ZeRO stage does with the gradients (ordered accumulation, reduce during
  // backward, reduce-scatter, streaming, ...): engine/parallel/sync_plan.h's policy.
  parallel::SyncPolicy sync_;
  std::unique_ptr<parallel::GradSync> grad_sync_;
  std::unique_ptr<parallel::ZeroShards> zero_;  // every stage, 0 included (memory tags)
  // Registry indices of each part Decoder::Backward reports (layer 3, the embedding, ...).
  std::map<parallel::PartId, std::vector<size_t>> part_params_;
  std::unique_ptr<data::DataLoader> loader_;
  std::vector<data::Batch> val_batches_;
  std::unique_ptr<RoutingByLabel> routing_;
  std::optional<moe::ReplicaPlanner> replica_planner_;  // moe.replicate_hot_experts > 0
  std::unique_ptr<StepGraph> graph_;  // runtime.cuda_graphs, once captured
  int64_t eager_steps_ = 0;           // steps run in this process before the capture
  int64_t readback_slots_ = 0;        // the most readback slots a step took (the next one's chunk)
  int64_t graph_replays_ = 0;
  StepGraph* capturing_ = nullptr;    // the graph being captured (AddForward keeps choices)
  std::vector<moe::MoEStats> run_stats_;  // per MoE layer, summed over the run
  int64_t step_ = 0;                      // the next step to run
  std::vector<double> losses_;
  std::optional<JsonlWriter> metrics_;
  std::optional<JsonlWriter> routing_log_;  // routing.jsonl (logging.routing_every)
  std::unique_ptr<Profiler> profiler_;  // --profile
  Checkpointer checkpointer_;    // when checkpoints are saved
  NonFinitePolicy nonfinite_;    // train.on_nonfinite
  StopReason stop_reason_ = StopReason::kNone;
  int64_t nan_step_ = -1, nan_expert_ = -1;  // InjectNanGrad
  std::string nan_param_;
  // Writes InjectNanGrad's NaN (trainer's step, after the gradient sync).
  void InjectNan();
};

}  // namespace switchyard::train
