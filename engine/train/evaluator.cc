#include "engine/train/evaluator.h"

#include "engine/checkpoint/step_dir.h"
#include "engine/core/file.h"
#include "engine/dist/ordered_sum.h"
#include "engine/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

namespace switchyard::train {
namespace {

namespace fs = std::filesystem;

}  // namespace

EvalResult EvaluateBatches(PipelineRunner& stage, const std::vector<data::Batch>& batches,
                           int64_t step, const dist::ParallelContext& pc) {
  model::Decoder& decoder = stage.chunk(0);
  dist::Communicator& dp_cp = pc.dp_cp();
  EvalResult r;
  r.step = step;
  r.batches = static_cast<int64_t>(batches.size());
  // Every MoE layer of the model; this stage fills its own, the sums over pp the rest.
  for (int64_t i = 0; i < decoder.config().n_layers; ++i)
    if (decoder.moe_config().IsMoELayer(i)) r.moe_layer_ids.push_back(i);
  r.moe.resize(r.moe_layer_ids.size());
  std::vector<size_t> slot_of;
  for (int64_t id : stage.moe_layer_ids()) {
    slot_of.push_back(std::find(r.moe_layer_ids.begin(), r.moe_layer_ids.end(), id) -
                      r.moe_layer_ids.begin());
  }
  double ce = 0;
  int64_t count = 0, sequences = 0;
  for (const data::Batch& batch : batches) {
    // Batches come from the loader on the host; the decoder may run on a GPU.
    model::DecoderOutput out =
        stage.Forward(MicroBatchInput(batch, decoder, pc, step, /*training=*/false));
    ce += out.ce_sum;
    count += out.ce_count;
    if (pc.cp().rank() == 0) sequences += batch.inputs.dim(0) - batch.padding;  // cp ranks share them
    for (size_t l = 0; l < slot_of.size(); ++l) r.moe[slot_of[l]].Add(out.moe_stats[l]);
  }
  // The same reduction as Trainer::Validate for the loss (the last stage holds it); the
  // rest beside it.
  const double local_sums[2] = {ce, static_cast<double>(count)};
  std::vector<double> sums = dist::AllReduceDoubles(dp_cp, local_sums);
  if (stage.pp().size() > 1) sums = dist::AllReduceDoubles(stage.pp(), sums);
  r.ce_sum = sums[0];
  r.targets = static_cast<int64_t>(sums[1] + 0.5);
  r.loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
  Tensor ints = Tensor::FromVector<int64_t>({sequences}, {1});
  if (dp_cp.size() > 1) dp_cp.AllReduce(ints, dist::ReduceOp::kSum);
  r.sequences = ints.data<int64_t>()[0];
  for (moe::MoEStats& s : r.moe) {
    if (s.tokens_per_expert.empty()) {  // no batch: keep the per-expert vectors sized
      s.tokens_per_expert.assign(decoder.moe_config().num_experts, 0);
      s.tokens_per_expert_kept.assign(decoder.moe_config().num_experts, 0);
    }
    s.AllReduce(pc.dp_cp_tp());  // each tp rank counted the rows it routed
    if (stage.pp().size() > 1) s.AllReduce(stage.pp());
    r.aux_loss += s.aux_mean();
    r.z_loss += s.z_mean();
  }
  return r;
}

Status CheckFiniteResult(const EvalResult& r) {
  auto num = [](double v) {
    if (std::isfinite(v)) return StrCat(v);
    return std::string(std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
  };
  const std::string why =
      "the model's forward is not finite: the checkpoint's weights are finite but too large "
      "(damaged, or saved by a diverged run); evaluate an earlier step directory";
  for (size_t i = 0; i < r.moe.size(); ++i) {
    const moe::MoEStats& s = r.moe[i];
    const std::pair<const char*, double> stats[] = {
        {"aux loss", s.aux_mean()}, {"z loss", s.z_mean()}, {"router entropy", s.router_entropy()}};
    std::string bad;
    for (const auto& [name, v] : stats) {
      if (!std::isfinite(v)) bad += StrCat(bad.empty() ? "" : ", ", name, " ", num(v));
    }
    if (!bad.empty()) {
      return absl::OutOfRangeError(StrCat("step ", r.step, ": MoE layer ", r.moe_layer_ids[i],
                                          ": ", bad, " (validation loss ", num(r.loss), "): ", why));
    }
  }
  if (!std::isfinite(r.loss) || !std::isfinite(r.aux_loss) || !std::isfinite(r.z_loss)) {
    return absl::OutOfRangeError(StrCat("step ", r.step, ": validation loss ", num(r.loss),
                                        " (every MoE layer's statistics are finite): ", why));
  }
  return OkStatus();
}

StatusOr<CheckpointConfig> ReadCheckpointConfig(const std::string& argument,
                                                const std::vector<std::string>& overrides) {
  const std::string path = checkpoint::CheckpointArgument(argument);
  std::error_code ec;
  if (!fs::exists(path, ec)) return NotFound(path, ": no such checkpoint (the path does not exist)");
  if (!fs::is_directory(path, ec)) return FailedPrecondition(path, ": not a checkpoint directory");
  CheckpointConfig out;
  out.dir = path;
  if (!fs::exists(fs::path(path) / checkpoint::kModelIndexFile, ec) &&
      !fs::exists(fs::path(path) / checkpoint::kConfigFile, ec)) {
    SY_ASSIGN_OR_RETURN(std::optional<std::string> latest, checkpoint::LatestCheckpoint(path));
    if (!latest) {
      return NotFound(path, ": not a checkpoint (no ", checkpoint::kConfigFile, ", no ", checkpoint::kLatestFile,
                      " file); pass a step-* directory or a training output directory");
    }
    out.dir = *latest;
    if (!fs::is_directory(out.dir, ec)) {
      return NotFound(path, "/", checkpoint::kLatestFile, " names ",
                      fs::path(out.dir).filename().string(),
                      fs::exists(out.dir, ec) ? ", which is not a directory" : ", which does not exist");
    }
  }
  const std::string config_path = (fs::path(out.dir) / checkpoint::kConfigFile).string();
  if (!fs::exists(config_path, ec)) {
    return FailedPrecondition(out.dir, ": incomplete checkpoint (no ", checkpoint::kConfigFile, ")");
  }
  SY_ASSIGN_OR_RETURN(std::string text, ReadFile(config_path));
  SY_ASSIGN_OR_RETURN(const config::Config saved, config::ParseConfig(text, config_path));
  SY_RETURN_IF_ERROR(CheckSavedConfig(saved, config_path));
  SY_ASSIGN_OR_RETURN(out.config, config::ParseConfig(text, config_path, overrides));
  return out;
}

Status BlameModelOverride(const Status& load, const config::Config& saved,
                          const config::Config& now) {
  if (load.ok()) return load;
  const auto diff = config::FirstDifference(saved, now, IsModelKey);
  if (!diff) return load;
  return InvalidArgument("--set ", diff->key, "=", diff->b, " changes the checkpoint's model (",
                         diff->key, ": ", diff->a, "): ", load.message());
}

Status CheckSavedConfig(const config::Config& saved, const std::string& path) {
  Status s = saved.Validate();
  if (s.ok()) s = saved.ValidateModel();
  if (s.ok()) return OkStatus();
  return DataLoss(path, ": ", s.message());
}

StatusOr<std::unique_ptr<Evaluator>> Evaluator::Create(const config::Config& config,
                                                       dist::Communicator& world) {
  SY_RETURN_IF_ERROR(config.Validate(world.size()));
  SY_RETURN_IF_ERROR(config.ValidateModel());
  std::unique_ptr<Evaluator> ev(new Evaluator(config, world));
  const config::ParallelConfig& p = config.parallel;
  const config::TrainConfig& tc = config.train;
  SY_ASSIGN_OR_RETURN(dist::Mesh mesh, dist::Mesh::Create(world.size(), p.MeshSizes(), p.order));
  SY_ASSIGN_OR_RETURN(ev->pc_, dist::ParallelContext::Create(world, mesh));
  SY_ASSIGN_OR_RETURN(ev->rt_, MakeRuntime(config.runtime, world, mesh));
  SY_ASSIGN_OR_RETURN(ev->chunks_, MakeStageDecoders(config, ev->rt_, *ev->pc_));
  std::vector<model::Decoder*> chunks;
  for (const auto& chunk : ev->chunks_) {
    chunks.push_back(chunk.get());
    for (const parallel::Parameter& q : chunk->registry().params()) ev->registry_.Add(q);
  }
  const parallel::PipelineSchedule schedule = p.pipeline_schedule;
  ev->pipeline_ = std::make_unique<PipelineRunner>(chunks, ev->rt_.data_pc(*ev->pc_).pp(),
                                                   schedule, static_cast<int>(tc.grad_accum));
  const int dp = mesh.dp();
  data::LoaderOptions lo{.dir = config.data.paths.empty() ? config.data.dir : std::string(),
                         .paths = config.data.paths,
                         .seq_len = config.model.seq_len,
                         .micro_batch_size = tc.micro_batch_size,
                         .global_batch_size = dp * tc.micro_batch_size * tc.grad_accum,
                         .dp_rank = mesh.Coord(world.rank(), dist::View::kDense, dist::Axis::kDp),
                         .dp_size = dp,
                         .seed = tc.seed,
                         .verify = config.data.verify};
  SY_ASSIGN_OR_RETURN(data::DataLoader loader, data::DataLoader::Open(lo));
  if (loader.vocab_size() > config.model.vocab_size) {
    return InvalidArgument("model.vocab_size=", config.model.vocab_size, " is smaller than the ",
                           loader.vocab_size(), " tokens of the tokenizer in ", config.data.FirstDir());
  }
  ev->loader_ = std::make_unique<data::DataLoader>(std::move(loader));
  return ev;
}

StatusOr<checkpoint::LoadedCheckpoint> Evaluator::Load(const std::string& path) {
  return checkpoint::LoadCheckpoint(path, registry_, /*optimizer_state=*/nullptr, world_,
                        /*require_finite=*/true);
}

StatusOr<EvalResult> Evaluator::Run(int64_t max_batches, int64_t step) {
  SY_ASSIGN_OR_RETURN(std::vector<data::Batch> batches, loader_->ValidationBatches(max_batches));
  return EvaluateBatches(*pipeline_, batches, step, *pc_);
}

}  // namespace switchyard::train
