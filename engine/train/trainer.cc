#include "engine/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "engine/core/profile.h"
#include "engine/core/file.h"
#include "engine/core/logging.h"
#include "engine/dist/agreement.h"
#include "engine/dist/ordered_sum.h"
#include "engine/dist/process.h"
#include "engine/dist/watchdog.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/plan/device_fit.h"
#include "engine/train/evaluator.h"

namespace switchyard::train {

bool IsModelKey(const std::string& section, const std::string& key) {
  static const char* const kMoEKeys[] = {"num_experts", "layer_freq", "top_k", "d_expert",
                                         "activation", "bias", "normalize_gates",
                                         "routed_scaling_factor", "score",
                                         "num_shared_experts", "d_shared"};
  return section == "model" ||
         (section == "moe" && std::find(std::begin(kMoEKeys), std::end(kMoEKeys), key) != std::end(kMoEKeys));
}

Status CheckSameModel(const std::string& saved_yaml, const std::string& source, const config::Config& now) {
  StatusOr<config::Config> saved = config::ParseConfig(saved_yaml, source);
  if (!saved.ok()) return DataLoss(saved.status().message());
  SY_RETURN_IF_ERROR(CheckSavedConfig(*saved, source));
  if (const auto diff = config::FirstDifference(*saved, now, IsModelKey)) {
    return InvalidArgument(source, ": the checkpoint's model has ", diff->key, ": ", diff->a,
                           ", this config ", diff->key, ": ", diff->b,
                           "; resume with the model it was saved with");
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const config::Config& config, const std::string& out_dir,
                                                   dist::Communicator& world) {
  SY_RETURN_IF_ERROR(config.Validate(world.size()));
  SY_RETURN_IF_ERROR(config.ValidateModel());
  // The watchdog asks the other ranks over a duplicate of the MPI world: only a trainer
  // over the whole world starts it (every rank gets here).
  if (world.size() > 1 && world.size() == dist::WorldSize()) {
    dist::StartCollectiveWatchdog(config.train.collective_timeout_s);
  }
  std::unique_ptr<Trainer> t(new Trainer(config, out_dir, world));
  SY_RETURN_IF_ERROR(t->BuildModel());
  t->BuildGradientSync();
  t->BuildOptimizer();
  SY_RETURN_IF_ERROR(t->OpenData());
  SY_RETURN_IF_ERROR(t->BuildPipeline());
  SY_RETURN_IF_ERROR(t->checkpointer_.Prepare(t->is_root()));
  ResetMemoryPeaks(t->device());  // the workspace peak counts from the first step on
  return t;
}

Status Trainer::BuildModel() {
  const config::ParallelConfig& p = config_.parallel;
  // The nodes: parallel.ranks_per_node, else as the launcher placed the ranks (a trainer
  // over a sub-communicator of the world counts as one node).
  dist::MeshSizes sizes = p.MeshSizes();
  if (sizes.ranks_per_node == 0 && world_.size() == dist::WorldSize()) {
    sizes.ranks_per_node = dist::DetectRanksPerNode();
  }
  SY_ASSIGN_OR_RETURN(dist::Mesh mesh, dist::Mesh::Create(world_.size(), sizes, p.order));
  // Detected nodes that cut a tp or etp group: the run works, slowly; say so once.
  if (p.ranks_per_node == 0 && world_.rank() == 0) {
    if (Status s = dist::CheckTensorParallelInsideNodes(mesh); !s.ok()) {
      SY_LOG(WARNING) << "the nodes as launched (" << mesh.num_nodes() << " of "
                      << mesh.ranks_per_node() << " ranks): " << s.message();
    }
  }
  SY_ASSIGN_OR_RETURN(pc_, dist::ParallelContext::Create(world_, mesh));
  SY_ASSIGN_OR_RETURN(rt_, MakeRuntime(config_.runtime, world_, mesh));
  if (config_.runtime.memory_check) {
    // Before anything the size of the model is allocated; one answer for every rank.
    const int64_t available = GetAllocator(rt_.device())->AvailableBytes();
    SY_RETURN_IF_ERROR(dist::AgreeOnStatus(
        plan::CheckMemoryFits(config_, mesh, world_.rank(), available,
                              rt_.device().is_cpu() ? "MemAvailable" : "cudaMemGetInfo"),
        world_));
  }
  SY_ASSIGN_OR_RETURN(chunks_, MakeStageDecoders(config_, rt_, *pc_));
  // The rank's parameters over its chunks (entries share the chunks' tensors).
  for (const auto& chunk : chunks_)
    for (const parallel::Parameter& q : chunk->registry().params()) registry_.Add(q);
  return OkStatus();
}

void Trainer::BuildGradientSync() {
  // The parts the decoder reports (Parameter::part): ZeRO-3 gathers one at a time, and
  // under it the gradient buckets hold one part each.
  const auto& params = registry_.params();
  std::vector<int> part_of(params.size());
  std::vector<parallel::PartId> part_names;
  std::vector<parallel::SyncParam> specs;
  for (size_t i = 0; i < params.size(); ++i) {
    SY_CHECK(!params[i].part.none()) << params[i].name << ": the decoder recorded no part";
    const parallel::PartId& part = params[i].part;
    auto it = std::find(part_names.begin(), part_names.end(), part);
    part_of[i] = static_cast<int>(it - part_names.begin());
    if (it == part_names.end()) part_names.push_back(part);
    part_params_[part].push_back(i);
    specs.push_back(parallel::SyncParamOf(params[i], part_of[i]));
  }
  const int stage = config_.parallel.zero_stage;
  // How the buckets are cut (the policy's BucketKeys): by part under ZeRO-3 and when
  // streaming, so a part's buckets go out as its backward ends; under ZeRO with pipeline
  // stages the tied token table alone, so that rank r of the data-parallel group owns the
  // same range of it on the first and the last stage (SumTiedEmbeddingGrads).
  std::vector<int> keys =
      parallel::BucketKeys(sync_, specs, static_cast<int>(part_names.size()));
  DeviceContext* ctx = rt_.ctx.get();
  dist::ParallelContext& data_pc = this->data_pc();
  grad_sync_ = std::make_unique<parallel::GradSync>(
      registry_,
      [&data_pc](dist::View view, parallel::AxisSet axes) -> dist::Communicator& {
        return parallel::GroupOf(data_pc, view, axes);
      },
      parallel::GradSyncOptionsFor(sync_, config_.train.bucket_bytes(), std::move(keys)), ctx);
  zero_ = std::make_unique<parallel::ZeroShards>(registry_, *grad_sync_, stage, part_of,
                                                 part_names, ctx);
  if (stage < 2) return;
  model::Decoder::ParameterHooks hooks;
  if (sync_.stream) {
    // No full gradient: each part's gradients exist from its backward to its bucket's
    // reduce-scatter (parallel/grad_sync.h, streaming).
    zero_->FreeGradients();
    hooks.gradients = [this](const parallel::PartId& part) {
      grad_sync_->BeginGradients(part_params_.at(part));
    };
  }
  if (stage >= 3) {
    parallel::ZeroShards* zero = zero_.get();
    hooks.acquire = [zero](const parallel::PartId& part, const parallel::PartId& next) {
      ScopedPhase phase(Phase::kCommunication);
      zero->Acquire(part, next);
    };
    hooks.release = [zero](const parallel::PartId& part) {
      ScopedPhase phase(Phase::kCommunication);
      zero->Release(part);
    };
  }
  for (const auto& chunk : chunks_) chunk->set_parameter_hooks(hooks);
}

void Trainer::BuildOptimizer() {
  const config::ParallelConfig& p = config_.parallel;
  OptimizerOptions oo = train::OptimizerOptionsFor(config_.train);
  oo.offload = p.offload_optimizer && !device().is_cpu();
  if (p.offload_optimizer && device().is_cpu() && world_.rank() == 0) {
    std::printf("parallel.offload_optimizer: the CPU backend already keeps the optimizer on the "
                "host; nothing changes\n");
  }
  optimizer_ = std::make_unique<Optimizer>(registry_, oo, rt_.ctx.get(), zero_.get());
}

Status Trainer::OpenData() {
  const config::Config& config = config_;
  const dist::Mesh& mesh = pc_->mesh();
  const int dp = mesh.dp();
  data::LoaderOptions lo{.dir = config.data.paths.empty() ? config.data.dir : std::string(),
                         .paths = config.data.paths,
                         .seq_len = config.model.seq_len,
                         .micro_batch_size = config.train.micro_batch_size,
                         .global_batch_size = dp * config.train.micro_batch_size * config.train.grad_accum,
                         .dp_rank = mesh.Coord(world_.rank(), dist::View::kDense, dist::Axis::kDp),
                         .dp_size = dp,
                         .seed = config.train.seed,
                         .verify = config.data.verify};
  SY_ASSIGN_OR_RETURN(data::DataLoader loader, data::DataLoader::Open(lo));
  if (loader.vocab_size() > config.model.vocab_size) {
    return InvalidArgument("model.vocab_size=", config.model.vocab_size, " is smaller than the ",
                           loader.vocab_size(), " tokens of the tokenizer in ", config.data.FirstDir());
  }
  loader_ = std::make_unique<data::DataLoader>(std::move(loader));
  if (config.train.eval_every > 0 || config.train.eval_batches > 0) {
    // Read even without validation (eval_every 0), so a bad token there ends the run at the
    // start; but then no validation split (prep --val-fraction 0) is no error.
    auto batches = loader_->ValidationBatches(config.train.eval_batches);
    if (batches.ok()) {
      val_batches_ = *std::move(batches);
    } else if (config.train.eval_every > 0 || loader_->val_tokens() > 0) {
      return batches.status();
    }
  }
  return OkStatus();
}

Status Trainer::BuildPipeline() {
  const config::Config& config = config_;
  for (int64_t i = 0; i < config.model.n_layers; ++i)
    if (config.moe.IsMoELayer(i)) moe_layer_ids_.push_back(i);
  const parallel::PipelineSchedule schedule = config.parallel.pipeline_schedule;
  std::vector<model::Decoder*> chunks;
  for (const auto& chunk : chunks_) chunks.push_back(chunk.get());
  pipeline_ = std::make_unique<PipelineRunner>(chunks, data_pc().pp(), schedule,
                                               static_cast<int>(config.train.grad_accum));
  // Chunk c's l-th MoE layer: its index in moe_layer_ids_ (every layer of the model).
  moe_slot_of_.assign(chunks_.size(), {});
  for (size_t c = 0; c < chunks_.size(); ++c) {
    for (int64_t id : chunks_[c]->moe_layer_ids()) {
      moe_slot_of_[c].push_back(std::find(moe_layer_ids_.begin(), moe_layer_ids_.end(), id) -
                                moe_layer_ids_.begin());
    }
  }
  // Every MoE layer of the model: each stage counts its own, the sum over pp completes them.
  routing_ = std::make_unique<RoutingByLabel>(loader_->labels(), moe_layer_ids_,
                                              config.moe.num_experts);
  return OkStatus();
}

parallel::ParameterRegistry Trainer::CheckpointRegistry() const {
  parallel::ParameterRegistry reg;
  for (parallel::Parameter& p : zero_->CheckpointParameters()) reg.Add(std::move(p));
  return reg;
}

Trainer::Memory Trainer::memory() const {
  const MemoryUse use = MemoryUseOf(device());
  auto at = [&](MemoryKind k) { return use.in_use[static_cast<int>(k)]; };
  return {.parameters = at(MemoryKind::kParameters),
          .gradients = at(MemoryKind::kGradients),
          .optimizer = at(MemoryKind::kOptimizer),
          .workspace_peak = use.peak[static_cast<int>(MemoryKind::kWorkspace)],
          .reserved_peak = static_cast<int64_t>(GetAllocator(device())->stats().reserved_peak),
          .device_used = GetAllocator(device())->DeviceUsed()};
}

void Trainer::ReportMemory() {
  const Memory m = memory();
  constexpr int kFields = 6;
  const std::vector<int64_t> mine = {m.parameters, m.gradients, m.optimizer, m.workspace_peak,
                                     m.reserved_peak, m.device_used};
  Tensor all = Tensor::Empty({world_.size() * kFields}, DType::kI64);
  world_.AllGather(Tensor::FromVector(mine, {kFields}), all);
  if (!is_root()) return;
  const int64_t* v = all.data<int64_t>();
  nlohmann::json ranks = nlohmann::json::array();
  std::printf("memory per rank (zero %d; model states held between steps, workspace peak; "
              "held: the %s allocator's peak from the system):\n",
              config_.parallel.zero_stage, device().is_cuda() ? "CUDA" : "host");
  std::printf("  %4s %14s %14s %14s %14s %14s %14s\n", "rank", "parameters", "gradients",
              "optimizer", "model states", "workspace pk", "held pk");
  for (int r = 0; r < world_.size(); ++r) {
    const int64_t* x = v + kFields * r;
    std::printf("  %4d %14lld %14lld %14lld %14lld %14lld %14lld\n", r,
                static_cast<long long>(x[0]), static_cast<long long>(x[1]),
                static_cast<long long>(x[2]), static_cast<long long>(x[0] + x[1] + x[2]),
                static_cast<long long>(x[3]), static_cast<long long>(x[4]));
    ranks.push_back({{"rank", r}, {"parameters", x[0]}, {"gradients", x[1]}, {"optimizer", x[2]},
                     {"workspace_peak", x[3]}, {"reserved_peak", x[4]}});
    if (x[5] >= 0) ranks.back()["device_used"] = x[5];
  }
  if (v[5] >= 0) {
    std::printf("  device memory in use now (rank 0; cudaMemGetInfo: the context and the "
                "libraries' workspaces included): %lld\n", static_cast<long long>(v[5]));
  }
  std::fflush(stdout);
  metrics_->Write(nlohmann::json{{"step", step_ - 1},
                                 {"memory", {{"zero_stage", config_.parallel.zero_stage},
                                             {"ranks", ranks}}}}
                      .dump());
}

Status Trainer::Resume(const std::string& path) {
  // Captured work reads the weights it was captured with: capture again after a load.
  ForgetGraph();
  // The shadows the last update wrote hold the weights being replaced.
  rt_.ctx->weight_shadows().Invalidate();
  std::vector<parallel::Parameter> state = optimizer_->State();
  parallel::ParameterRegistry params = CheckpointRegistry();
  SY_ASSIGN_OR_RETURN(checkpoint::LoadedCheckpoint ck, checkpoint::LoadCheckpoint(path, params, &state, world_, /*require_finite=*/true));
  step_ = ck.step;
  SY_RETURN_IF_ERROR(nonfinite_.Restore(nlohmann::json::parse(ck.trainer_state_json, nullptr, false),
                                        ck.dir + "/" + checkpoint::kTrainerStateFile));
  // The saved model must be this one: shapes are checked tensor by tensor, but keys such as
  // model.n_heads or model.position change no shape.
  SY_RETURN_IF_ERROR(CheckSameModel(ck.config_yaml, ck.dir + "/" + checkpoint::kConfigFile, config_));
  if (is_root() && !ck.verified) {
    std::printf("note: %s has no checksums (saved by an older build); loaded without verifying "
                "its files\n", ck.dir.c_str());
  }
  if (is_root()) {
    std::printf("resumed from %s at step %lld (saved with world %d, ep %d, dp %d)\n", ck.dir.c_str(),
                static_cast<long long>(step_), ck.layout.world, ck.layout.ep, ck.layout.dp);
  }
  return OkStatus();
}

void Trainer::EnableProfile(int64_t skip_steps) {
  if (profiler_) return;
  profiler_ = std::make_unique<Profiler>();
  const bool gpu = rt_.ctx->device().is_cuda();
  profiler_->set_skip_steps(skip_steps >= 0 ? skip_steps : gpu ? kGpuProfileSkipSteps : 0);
  if (gpu) profiler_->UseDeviceTiming(rt_.ctx.get());
}

double Trainer::Validate() {
  return EvaluateBatches(*pipeline_, val_batches_, step_, *pc_).loss;
}

std::vector<std::vector<double>> Trainer::ExpertBiases() {
  if (config_.moe.expert_bias_rate <= 0) return {};
  const int64_t num_experts = config_.moe.num_experts;
  std::vector<double> all(moe_layer_ids_.size() * num_experts, 0.0);
  DeviceContext* ctx = rt_.ctx.get();
  for (int c = 0; c < pipeline_->chunks(); ++c) {
    const std::vector<int64_t>& ids = pipeline_->chunk(c).moe_layer_ids();
    std::vector<moe::MoELayer*> layers = pipeline_->chunk(c).moe_layers();
    for (size_t l = 0; l < layers.size(); ++l) {
      const size_t slot = std::find(moe_layer_ids_.begin(), moe_layer_ids_.end(), ids[l]) -
                          moe_layer_ids_.begin();
      const std::vector<float> bias = layers[l]->expert_bias().To(Device::Cpu(), ctx).ToVector<float>();
      std::copy(bias.begin(), bias.end(), all.begin() + slot * num_experts);
    }
  }
  // Each layer lives on one stage: the sum over pp is that stage's values (x + 0 exact).
  if (pc_->pp().size() > 1) all = dist::AllReduceDoubles(pc_->pp(), all);
  std::vector<std::vector<double>> out;
  for (size_t l = 0; l < moe_layer_ids_.size(); ++l)
    out.emplace_back(all.begin() + l * num_experts, all.begin() + (l + 1) * num_experts);
  return out;
}

Status Trainer::Save() {
  nlohmann::json state;
  state["step"] = step_;
  state["seed"] = config_.train.seed;
  state["data_position"] = {{"next_step", step_}, {"micro_batches_per_step", config_.train.grad_accum}};
  state["loss"] = losses_.empty() ? 0.0 : losses_.back();
  state["nonfinite"] = nonfinite_.SavedState();
  // Every rank writes what it owns: under ZeRO its ranges of the parameters (stage 3: its
  // shards) and of the optimizer state, so nothing is gathered for the save.
  const parallel::ParameterRegistry params = CheckpointRegistry();
  checkpoint::CheckpointContents contents{.params = &params, .optimizer_state = optimizer_->State(),
                              .trainer_state_json = state.dump(), .config_yaml = config_.ToYaml()};
  SY_RETURN_IF_ERROR(checkpoint::SaveCheckpoint(out_dir_, step_, contents, world_, pc_->mesh()));
  if (is_root()) std::printf("saved checkpoint %s/%s\n", out_dir_.c_str(), checkpoint::StepDirName(step_).c_str());
  return OkStatus();
}

Status Trainer::Run(int64_t steps) {
  const config::TrainConfig& tc = config_.train;
  const int64_t end = steps > 0 ? std::min(tc.max_steps, step_ + steps) : tc.max_steps;
  const int64_t routing_from = step_ + (end - step_) / 2;  // the second half of this run
  const int64_t model_params = ModelParameters();  // collective over pp
  if (is_root()) {
    SY_RETURN_IF_ERROR(OpenRunLogs());
    PrintBanner(model_params, end);
  }
  StopSignals signals;
  auto latest = checkpoint::LatestCheckpoint(out_dir_);
  signals.SetLastCheckpoint(latest.ok() && latest->has_value() ? **latest : std::string());
  const EvalSchedule eval(tc.eval_every, !val_batches_.empty());
  const RoutingLogSchedule routing_log(config_.logging.routing_every);
  int stop_signal = 0;  // the signal any rank received (the largest number)
  stop_reason_ = StopReason::kNone;
  while (step_ < end) {
    // Without data.verify, token ids are checked as this step's batches are read: a bad one
    // ends the run on every rank with the loader's error (one line, exit 1).
    if (!config_.data.verify) {
      SY_RETURN_IF_ERROR(dist::AgreeOnStatus(loader_->CheckStep(step_), world_));
    }
    StepMetrics m = TrainStep(step_ >= routing_from);
    nonfinite_.Decide(m);
    if (NonFinitePolicy::Stops(m)) {
      if (is_root()) metrics_->Write(MetricsJson(m));
      signals.Restore();
      stop_reason_ = StopReason::kNonFinite;
      return nonfinite_.StopError(m, checkpointer_.Latest());
    }
    LogStep(m);
    ++step_;
    // After the first step the peaks are in; under runtime.cuda_graphs after the second,
    // which captured the graph (its pool included), or the run's only step.
    const size_t report_at = config_.runtime.cuda_graphs ? 2 : 1;
    if (losses_.size() == report_at || (step_ == end && losses_.size() < report_at)) {
      ReportMemory();
    }
    if (eval.ShouldEvaluate(step_, step_ == end)) LogValidation();
    // Every rank stops at the same step when any of them was signalled.
    stop_signal = signals.Agree(world_);
    const bool stopped = stop_signal != 0;
    if (routing_log.ShouldLog(m, m.step == end - 1, stopped)) {
      const std::vector<std::vector<double>> bias = ExpertBiases();  // collective over pp
      if (is_root()) routing_log_->Write(RoutingJson(m, bias));
    }
    if (checkpointer_.ShouldSave(step_, step_ == end, stopped)) {
      SY_RETURN_IF_ERROR(Save());
      signals.SetLastCheckpoint(out_dir_ + "/" + checkpoint::StepDirName(step_));
    }
    if (stopped) break;
  }
  signals.Restore();
  stop_reason_ = stop_signal != 0 ? StopReason::kSignal : StopReason::kFinished;
  return Summarize(stop_signal);
}

int64_t Trainer::ModelParameters() {
  // Each stage's parameters, the tied table once (on the first stage).
  int64_t held = 0;
  for (const parallel::Parameter& q : registry_.params()) {
    const bool counted = !q.replicated.Has(dist::Axis::kPp) || data_pc().pp().rank() == 0;
    if (q.trainable && counted) held += NumElements(q.global_shape);
  }
  const double mine[1] = {static_cast<double>(held)};
  return static_cast<int64_t>(dist::AllReduceDoubles(pc_->pp(), mine)[0] + 0.5);
}

Status Trainer::OpenRunLogs() {
  // A resumed run keeps the records before its first step: each step appears once.
  SY_ASSIGN_OR_RETURN(JsonlWriter w, JsonlWriter::Open(out_dir_ + "/metrics.jsonl", step_));
  if (w.dropped() > 0) {
    std::printf("metrics.jsonl: dropped %lld records logged after step %lld (resuming at step %lld)\n",
                static_cast<long long>(w.dropped()), static_cast<long long>(step_ - 1),
                static_cast<long long>(step_));
  }
  metrics_.emplace(std::move(w));
  SY_ASSIGN_OR_RETURN(JsonlWriter r, JsonlWriter::Open(out_dir_ + "/routing.jsonl", step_));
  routing_log_.emplace(std::move(r));
  return OkStatus();
}

void Trainer::PrintBanner(int64_t model_params, int64_t end) const {
  const config::TrainConfig& tc = config_.train;
  std::printf("%s\n", pc_->mesh().Summary().c_str());
  std::printf("device: %s, matrix products in %s\n", device().ToString().c_str(),
              rt_.ctx->matmul_dtype() == DType::kBF16 ? "bf16 (f32 accumulation)" : "f32");
  std::printf("parameters: %lld, steps %lld -> %lld, global batch %lld x %lld tokens\n",
              static_cast<long long>(model_params),
              static_cast<long long>(step_), static_cast<long long>(end),
              static_cast<long long>(int64_t{pc_->mesh().dp()} * tc.micro_batch_size * tc.grad_accum),
              static_cast<long long>(config_.model.seq_len));
  std::fflush(stdout);
}

void Trainer::LogStep(const StepMetrics& m) {
  if (m.skipped && is_root()) std::printf("%s\n", nonfinite_.SkipNote(m).c_str());
  losses_.push_back(m.loss);
  if (run_stats_.empty()) run_stats_.resize(m.moe.size());
  for (size_t i = 0; i < m.moe.size(); ++i) run_stats_[i].Add(m.moe[i]);
  if (is_root()) {
    std::printf("%s\n", ProgressLine(m).c_str());
    std::fflush(stdout);
    metrics_->Write(MetricsJson(m));
  }
}

void Trainer::LogValidation() {
  const double val = Validate();
  if (!is_root()) return;
  std::printf("validation after step %lld | loss %.4f | perplexity %.2f\n",
              static_cast<long long>(step_ - 1), val, std::exp(val));
  nlohmann::json j{{"step", step_ - 1}, {"val_loss", val}};
  metrics_->Write(j.dump());
}

Status Trainer::Summarize(int stop_signal) {
  routing_->AllReduce(pc_->dp_cp_tp());
  if (pc_->pp().size() > 1) routing_->AllReduce(pc_->pp());
  if (!is_root()) return OkStatus();
  if (metrics_->failed() > 0) {
    std::fprintf(stderr, "warning: %lld metrics records could not be written to %s/metrics.jsonl\n",
                 static_cast<long long>(metrics_->failed()), out_dir_.c_str());
  }
  if (stop_signal != 0) std::printf("stopped by signal %d after step %lld; resume with --resume %s\n",
                                    stop_signal, static_cast<long long>(step_ - 1), out_dir_.c_str());
  if (!run_stats_.empty()) {
    std::printf("\n%s\n%s", LoadBalanceSummary(moe_layer_ids_, run_stats_).c_str(),
                routing_->Table().c_str());
    const std::string path = out_dir_ + "/routing_by_language.json";
    SY_RETURN_IF_ERROR(WriteFileAtomically(path, routing_->Json() + "\n"));
  }
  if (profiler_) {
    std::printf("\n%s(rank 0; written to %s/profile.json)\n", profiler_->Table().c_str(),
                out_dir_.c_str());
    SY_RETURN_IF_ERROR(WriteFileAtomically(out_dir_ + "/profile.json", profiler_->Json()));
  }
  std::fflush(stdout);
  return OkStatus();
}

}  // namespace switchyard::train
