// What training keeps in the workspace (engine/core/allocator.h's kWorkspace ledger), from
// the config alone: the activations one micro-batch's Forward keeps for its Backward, piece
// by piece (each layer, the embedding, the head), the scratch each Backward peaks at, and
// the workspace of one whole step of one pipeline rank, walked action by action through its
// schedule (engine/parallel/pipeline_schedule.h) as PipelineRunner and the trainer run it.
// The dry-run (dry_run.h) reports these; tests/engine/plan/dry_run_test.cc checks the
// per-piece figures against a decoder's Forward and Backward, and tests/dist/pipeline_memory_test.cc
// the step's peak against trained ranks.
//
// Figures are bytes on one rank, each tensor at its element size (f32, or bf16 for what
// runtime.activation_dtype=bf16 keeps in bf16, MODEL.md "Activation storage"): its share
// under tensor / sequence parallelism (parallel.tp, parallel.sequence_parallel) and with every token its experts can admit
// (capacity C = ceil(cf T k / E) per expert, cf = moe.capacity_factor), so routing that
// drops tokens keeps less than the estimate.
#pragma once

#include <string>
#include <vector>

#include "engine/model/stage.h"
#include "engine/parallel/pipeline_schedule.h"
#include "engine/config/config.h"

namespace switchyard::plan {

// One micro-batch of train.micro_batch_size sequences of model.seq_len tokens, in bytes.
struct ActivationBytes {
  // layer[i]: what layer i's Forward keeps — norms, q/k/v, the attention output, the MLP's
  // or the MoE layer's tensors (router, dispatch plan, the admitted rows through the experts)
  // and the layer's output (the next layer's input); not its own input.
  std::vector<double> layer;
  // layer_backward[i]: the most layer i's Backward holds beyond the kept activations, the
  // gradient of the residual stream it carries included.
  std::vector<double> layer_backward;
  double embedding = 0;        // the embedding's output
  double head = 0;             // final norm and the cross-entropy's logits gradient
  double head_backward = 0;    // the head's and the final norm's input gradients
  double hidden = 0;           // the residual stream between two stages (one message)
  double tokens = 0;           // token ids: the loader's batch and the decoder's copies

  // A stage's share: its layers, plus the embedding / head it holds.
  double Stage(const model::Stage& stage) const;
  // The most its Backward holds beyond its activations (the largest layer's, or the head's).
  double StageBackward(const model::Stage& stage) const;
};

ActivationBytes EstimateActivationBytes(const config::Config& config);

// The workspace of one training step on one pipeline rank.
struct StepWorkspaceInputs {
  std::vector<parallel::Action> actions;  // the rank's schedule (ScheduleActions)
  // Per chunk of the rank (one without interleaving): its stage and what one micro-batch's
  // Forward keeps / its Backward holds beyond that.
  std::vector<model::Stage> chunks;
  std::vector<double> kept, backward;
  double hidden = 0, tokens = 0;  // ActivationBytes' figures
  // The rank's gradients, one packed copy (4 bytes per trainable element it holds).
  double gradients = 0;
  // train.ordered_grad_accum with more than one micro-batch: each micro-batch's gradient is
  // packed and summed into a pairwise tree (dist::TreeAccumulator) after its backward.
  bool ordered_accum = false;
  // The gradient buckets in flight at the data-parallel sync: each bucket's packed copy and
  // the ordered sum's receive buffer (0 without a data-parallel group to sum over).
  double sync = 0;
  // The sync runs after the whole schedule, not during the last backward
  // (parallel::SyncPolicy::reduce_during_backward false: ZeRO-1 under pipeline
  // parallelism; ordered accumulation has its own rule above).
  bool sync_after_schedule = false;
  // Per action, for a send: the index of the action after which the runner has released it
  // (parallel::SendReleases); actions.size() or beyond: at the end of the step. Empty:
  // every send is held until the step ends.
  std::vector<int> send_release;
};

struct StepWorkspace {
  double peak = 0;              // the most bytes at once
  std::string peak_at;          // where: "backward mb 0 chunk 0", "gradient sync", ...
  int in_flight = 0;            // the most micro-batches (chunks) whose activations are kept
  double activations_peak = 0;  // the most bytes of kept activations at once
};

// Walks the actions with the executor's rules (engine/train/pipeline_runner.h):
//   a micro-batch's token ids stay until the step ends;
//   a forward adds its chunk's activations; a backward adds its scratch for its duration;
//   a received activation (the stage's input) and a received gradient stay until the
//   micro-batch's activations go;
//   a backward's input gradient is a new tensor, kept for its send;
//   the activations go after the backward (the first stage) or with the send of the input
//   gradient (the others): parallel::ActivationReleases, the rule the runner reads;
//   a sent tensor stays until the runner releases its send (send_release: after the first
//   action of this rank that ends later than the peer's receive of it in the unit-time
//   timeline, parallel::SendReleases): the output a forward sent outlives its activations
//   only while its send is held, the input gradient is freed with its send;
//   with ordered accumulation, each backward's gradient is packed (one copy) and added to
//   the tree, whose buffers (one per level still open, kept for reuse) stay until the step
//   ends; at the end their sum is one more copy; then the buckets of the sync.
StepWorkspace SimulateStepWorkspace(const StepWorkspaceInputs& in);

}  // namespace switchyard::plan
