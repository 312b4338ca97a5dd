// Evaluation of a trained model (`switchyard eval`): the mean validation cross-entropy and
// every MoE layer's routing statistics (MODEL.md section 3) in eval mode — capacity from
// moe.eval_capacity_factor, no jitter — on one rank or many under mpirun.
//
//   SY_ASSIGN_OR_RETURN(CheckpointConfig cc, ReadCheckpointConfig(path, overrides));
//   SY_ASSIGN_OR_RETURN(auto ev, Evaluator::Create(cc.config, *world));
//   SY_ASSIGN_OR_RETURN(LoadedCheckpoint ck, ev->Load(cc.dir));
//   SY_ASSIGN_OR_RETURN(EvalResult r, ev->Run(cc.config.train.eval_batches, ck.step));
//
// The numbers are those of the trainer's validation (Trainer::Validate): the same
// validation micro-batches (train.eval_batches per data-parallel rank, data/loader.h), the
// same forward at the checkpoint's step (which keys the random second-expert draws), the
// same reduction. So evaluating the checkpoint a run saved at step N under the run's
// layout reproduces the validation loss it printed after its last step.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/dist/communicator.h"
#include "engine/dist/parallel_context.h"
#include "engine/model/decoder.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/config/config.h"
#include "engine/train/pipeline_runner.h"
#include "engine/data/loader.h"
#include "engine/train/runtime.h"
#include "moe/moe_layer.h"

namespace switchyard::train {

// What an evaluation reports, reduced over the whole data-parallel world.
struct EvalResult {
  int64_t step = 0;       // the step the forward ran at (the checkpoint's step)
  int64_t batches = 0;    // validation micro-batches per data-parallel rank
  int64_t sequences = 0;  // sequences evaluated, every rank
  int64_t targets = 0;    // target tokens scored, every rank
  double ce_sum = 0;      // sum of -log p(target) over them
  double loss = 0;        // ce_sum / targets: the mean validation cross-entropy
  // Summed over MoE layers, each the mean over routing groups (as in the training loss).
  double aux_loss = 0, z_loss = 0;
  std::vector<int64_t> moe_layer_ids;
  std::vector<moe::MoEStats> moe;  // per MoE layer, summed over every rank and batch

  double perplexity() const { return std::exp(loss); }
};

// Eval-mode forward of `batches` (this rank's validation micro-batches) at `step`, the sums
// reduced over the data-parallel world of pc (losses over dp x cp, routing statistics also
// over tp). Collective over pc's world. The computation of Trainer::Validate, with routing
// statistics added.
EvalResult EvaluateBatches(PipelineRunner& stage, const std::vector<data::Batch>& batches,
                           int64_t step, const dist::ParallelContext& pc);

// OK when every statistic of `r` is finite; otherwise one error naming the first MoE layer
// (in model order) with a non-finite statistic and which ones (aux, z, router entropy), or
// the validation loss when only it is not finite. A checkpoint can hold finite weights
// whose forward overflows (a router weight of 3e38 from a writer bug): its statistics are
// not numbers to report. The same answer on every rank (r is reduced).
Status CheckFiniteResult(const EvalResult& r);

// A checkpoint's step directory and the config saved with it.
struct CheckpointConfig {
  std::string dir;  // the step directory
  config::Config config;    // its config.yaml, with the overrides applied
};

// Resolves `path` (a step directory, or an output directory: its `latest`) and parses the
// config.yaml saved there with `overrides` ("section.key=value") on top. Errors: the path
// does not exist, is not a checkpoint, has no latest, or the step directory lacks
// config.yaml (one line naming the path); a config error names the file and the key. The
// saved config is checked by itself first (CheckSavedConfig), before the overrides.
StatusOr<CheckpointConfig> ReadCheckpointConfig(const std::string& path,
                                                const std::vector<std::string>& overrides = {});

// A checkpoint's config.yaml as saved (`path` names it), without overrides: its values
// (Config::Validate with no layout, a checkpoint loads under any) and its model's sizes
// (Config::ValidateModel). A config that fails is a damaged checkpoint: DataLoss naming the
// file ("runs/x/step-00000006/config.yaml: train.lr=-1 must be > 0"), exit 1 in every
// command that reads one (eval, route, upcycle, export, train --resume).
Status CheckSavedConfig(const config::Config& saved, const std::string& path);

// A checkpoint's load failed (`load`): when --set changed a key of the saved model (`saved`
// is the config without overrides, `now` with them), the error names that override first
// and is InvalidArgument (a usage error, exit 2: "--set model.d_model=32 changes the
// checkpoint's model (model.d_model: 64): ..."); otherwise `load` as it is.
Status BlameModelOverride(const Status& load, const config::Config& saved,
                          const config::Config& now);

// The model of a config on this world's layout, its weights from a checkpoint, and the
// validation split of data.dir. No optimizer state is allocated.
class Evaluator {
 public:
  // Validates the config for this world (layouts `switchyard train` does not support yet —
  // tp, cp, pp, etp > 1 — are refused the same way), builds the mesh and the model (fresh
  // weights until Load) and opens data.dir. Collective over world.
  static StatusOr<std::unique_ptr<Evaluator>> Create(const config::Config& config,
                                                     dist::Communicator& world);

  // Loads the model weights of a checkpoint saved under any layout (`path`: a step
  // directory or an output directory). Collective; the same Status on every rank.
  StatusOr<checkpoint::LoadedCheckpoint> Load(const std::string& path);

  // Evaluates up to max_batches (<= 0: every) validation micro-batches per data-parallel
  // rank at `step`. Errors: a validation split too short for one micro-batch per rank.
  // Collective.
  StatusOr<EvalResult> Run(int64_t max_batches, int64_t step);

  model::Decoder& decoder() { return *chunks_.front(); }  // the first model chunk
  const dist::Mesh& mesh() const { return pc_->mesh(); }
  const data::DataLoader& loader() const { return *loader_; }

 private:
  Evaluator(const config::Config& config, dist::Communicator& world) : config_(config), world_(world) {}

  config::Config config_;
  dist::Communicator& world_;
  std::unique_ptr<dist::ParallelContext> pc_;
  Runtime rt_;  // runtime.device; outlives the decoder
  std::vector<std::unique_ptr<model::Decoder>> chunks_;  // this rank's pipeline stages
  parallel::ParameterRegistry registry_;                 // their parameters
  std::unique_ptr<PipelineRunner> pipeline_;
  std::unique_ptr<data::DataLoader> loader_;
};

}  // namespace switchyard::train
