// The decoder of ../shared/MODEL.md section 1, assembled from dense and MoE layers:
//
//   x0 = wte[tokens] (+ wpe[positions])
//   for block i: x = x + Attention_i(Norm1_i(x)); x = x + FFN_i(Norm2_i(x))
//                (FFN_i is MoE iff moe.IsMoELayer(i), else a dense MLP)
//   logits = NormF(x) @ head   (head = wte^T when tie_embeddings)
//
// Tensor parallelism (DecoderParallel::tp, Megatron-LM): attention split by heads, dense MLPs
// by hidden units, the embedding and the head by vocabulary (padded to a multiple of tp),
// with the vocabulary-parallel cross-entropy, so the full logits never exist on one rank.
// With sequence parallelism the residual stream, the norms and the MoE layers hold this
// rank's rows [r*N/tp, (r+1)*N/tp) of the micro-batch's N = B*S tokens; without it every tp
// rank holds all rows and each MoE layer routes this rank's rows (the routing group stays
// the whole micro-batch, moe/moe_layer.h). Norm weights are replicated over tp (their
// gradients summed over tp under sequence parallelism).
//
// Every parameter is registered under a stable name (docs/model.md lists them). Forward
// keeps what Backward needs in a DecoderActivations the caller holds (one per micro-batch);
// set_recompute (engine/model/recompute.h) makes it keep less and Backward compute the rest
// again, with bit-identical results.
//
// Pipeline parallelism (DecoderParallel::stage, engine/model/stage.h): a decoder holds one
// model stage. A stage without the embedding reads DecoderInput::hidden (the previous
// stage's DecoderOutput::hidden) instead of tokens; a stage without the head returns its
// residual stream in DecoderOutput::hidden and, before Backward, is given its gradient in
// DecoderOutput::grad_hidden; a stage without the embedding leaves the gradient of its
// input in DecoderOutput::grad_input after Backward. The aux and z sums cover the stage's
// MoE layers.
//
// Context parallelism (DecoderParallel::cp, engine/parallel/context_parallel.h): DecoderInput's tokens
// and targets are this rank's two chunks of every sequence, (2B, S/(2c)) (the micro-batch's
// B sequences must be whole, S = model.seq_len); embeddings and RoPE use the global
// positions, attention runs around the cp ring, and each MoE layer routes the micro-batch's
// B*S tokens over cp x tp as one group (first_token: the global index of the micro-batch's
// first token).
//
// Losses: the cross-entropy is summed here and scaled by the caller's ce_grad_scale (1 / the
// number of targets in the global batch); each MoE layer's aux and z losses are per routing
// group (one micro-batch of one data-parallel replica) and scaled by aux_grad_scale (1 / the
// number of routing groups in the global batch), so that summing gradients over the
// data-parallel world gives the gradient of MODEL.md's total loss.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dense/attention.h"
#include "dense/embedding.h"
#include "dense/linear.h"
#include "dense/mlp.h"
#include "dense/norm.h"
#include "engine/core/pending_sum.h"
#include "engine/dist/communicator.h"
#include "engine/model/model_config.h"
#include "engine/model/recompute.h"
#include "engine/model/stage.h"
#include "engine/parallel/parameter.h"
#include "kernels/cross_entropy.h"
#include "moe/moe_layer.h"

namespace switchyard::model {

// One micro-batch.
struct DecoderInput {
  Tensor tokens;   // (B, S) i32, on the decoder's device
  Tensor targets;  // (B, S) i32, on the decoder's device; -1 masks a position
  int64_t first_token = 0;  // global index of tokens[0, 0] (keys routing noise)
  // runtime.cuda_graphs: moe::RouterRngValues(seed, step, n_layers, first_token) on the
  // decoder's device, which the routers' draws read their keys from (so a replay of a
  // captured step draws that step's numbers); undefined: keys from step and first_token.
  Tensor rng_values = Tensor();
  // Sequences of the micro-batch that are real (the first valid_rows; the rest pad an
  // evaluation's last micro-batches, data::Batch::padding): the MoE statistics count only
  // their tokens. -1: every sequence.
  int64_t valid_rows = -1;
  int64_t step = 0;
  bool training = true;
  // tokens and targets were checked against the vocabulary on the host (MicroBatchInput,
  // engine/train/runtime.h): the embedding reads no bad-id flag back, and a training step
  // leaves the cross-entropy sums on the device (engine/core/step_readback.h).
  bool ids_checked = false;
  // Gradient scales; only used when training (backward).
  float ce_grad_scale = 0.0f;
  float aux_grad_scale = 0.0f;
  // A stage without the embedding: the previous stage's output, (B, S, d) or this rank's
  // rows (B*S/tp, d) under sequence parallelism. tokens still give B and S.
  Tensor hidden = Tensor();
};

// The residual stream between blocks: x plus `add`, the last sublayer's output, not yet
// summed into it (undefined: x alone). The next norm sums the two in its own kernel
// (dense::Norm::AddForward, bit-identical to the add and then the norm), so a block's end and
// the next block's first norm are one pass over the rows, not an add and a norm.
struct ResidualStream {
  Tensor x = Tensor();
  Tensor add = Tensor();
  // x + add as one tensor (x when nothing is pending).
  Tensor Sum(DeviceContext* ctx) const;
  // The norm of x + add: its acts.x is the sum (the stream from here on).
  dense::NormActivations Norm(const dense::Norm& norm, DeviceContext* ctx, DType y_dtype) const;
};

// One block's activations. Under Recompute::kFull Forward keeps x_in alone and Backward
// rebuilds the rest from it.
struct BlockActivations {
  Tensor x_in;  // (B, S, d) the block input (the residual stream)
  dense::NormActivations norm1, norm2;  // y undefined under bf16 storage (ForwardBlock)
  dense::AttentionActivations attn;
  Tensor x_mid;  // x_in + attention
  std::optional<dense::MlpActivations> mlp;
  std::optional<moe::MoEForward> moe;  // y undefined (ForwardBlock)
  bool recompute = false;  // full recompute: x_in alone is kept; Backward runs the block again
};

struct DecoderActivations {
  dense::EmbeddingActivations embed;
  std::vector<BlockActivations> blocks;
  dense::NormActivations norm_f;
  Tensor head_in;   // (B*S, d) the head's input (gathered over tp under sequence parallelism)
  Tensor dlogits;   // (B*S, V/tp) the cross-entropy gradient (this rank's vocabulary), when
                    // training with the head whole
  int64_t head_chunk = 0;  // rows per chunk when a training Forward chunked the head (then no
                           // dlogits: Backward computes each chunk's logits again), else 0
  std::optional<dense::LinearActivations> head;  // untied head only
};

// What a forward reports.
struct DecoderOutput {
  // In a training step the sums are PendingSums of the step's readback (engine/core/
  // step_readback.h): known at the step's end; ce_count is then -1 (the trainer counts the
  // targets from the config). Elsewhere they are known at once.
  PendingSum ce_sum;        // sum of -log p(target) over this micro-batch's targets
  int64_t ce_count = 0;     // targets counted
  PendingSum aux_sum;       // sum over MoE layers of this micro-batch's aux (one group each;
                            // under cp on cp rank 0 only, the others report 0)
  PendingSum z_sum;
  std::vector<moe::MoEStats> moe_stats;  // per MoE layer, this rank's sums
  std::vector<Tensor> moe_indices;       // per MoE layer, (T, k) i32: the router's top-k
                                         // choice for the routing group's T tokens
  DecoderActivations acts;
  // Pipeline stages. hidden: a stage without the head, the residual stream after its last
  // layer (what the next stage reads). grad_hidden: set by the caller before Backward on
  // such a stage, the gradient of hidden (what the next stage's Backward left in
  // grad_input). grad_input: after Backward on a stage without the embedding, the gradient
  // of DecoderInput::hidden.
  Tensor hidden, grad_hidden, grad_input;
};

// The groups a decoder's layers communicate in. ep is required (a size-1 group is fine).
struct DecoderParallel {
  dist::Communicator* ep = nullptr;   // expert parallel: the token all-to-all
  dist::Communicator* tp = nullptr;   // dense tensor parallel; null: none
  bool sequence_parallel = false;     // only with tp of size > 1
  dist::Communicator* etp = nullptr;  // expert tensor parallel; null: none
  Stage stage = Stage::Whole();       // the pipeline stage this decoder holds (default: all)
  // Context parallel (engine/parallel/context_parallel.h); null: none. With cp of size c > 1, tp_cp is
  // required: the cp x tp ranks that hold one micro-batch's tokens, member cp_rank * tp +
  // tp_rank (dist::ParallelContext::tp_cp), over which each MoE layer routes its group.
  dist::Communicator* cp = nullptr;
  dist::Communicator* tp_cp = nullptr;
};

class Decoder {
 public:
  // Builds and initialises every layer from the counter-based generator (weights normal
  // with model.init_std, keyed by parameter name and global index — the same model on any
  // layout; with model.scaled_init each layer draws its output projections — attention's
  // o, the MLP's and the experts' w2 — with init_std / sqrt(2 L)). Every parameter's
  // description records its part (Parameter::part) and, for tied embeddings over pipeline
  // stages, the token table is marked tied. ep: the expert-parallel communicator (size 1
  // is fine); kept by the decoder.
  // ctx: the device every parameter, activation and kernel lives on (null: the CPU); the
  // decoder keeps it, and the same weights come out on every device.
  static StatusOr<std::unique_ptr<Decoder>> Create(const ModelConfig& model,
                                                   const moe::MoEConfig& moe, uint64_t seed,
                                                   const DecoderParallel& parallel,
                                                   DeviceContext* ctx = nullptr);
  // Expert parallelism only.
  static StatusOr<std::unique_ptr<Decoder>> Create(const ModelConfig& model,
                                                   const moe::MoEConfig& moe, uint64_t seed,
                                                   dist::Communicator* ep,
                                                   DeviceContext* ctx = nullptr) {
    return Create(model, moe, seed, DecoderParallel{.ep = ep}, ctx);
  }

  DecoderOutput Forward(const DecoderInput& input);
  // Adds every parameter's gradient (the registry's grads); `input` must be the one Forward
  // was given (full recompute runs the blocks' forward again from it: the same step,
  // first_token and training flag give the same routing noise, random second choices and
  // capacity decisions). The losses, MoE statistics and routing are Forward's; a
  // recomputed forward reports nothing. on_done, when given, is called with each part as
  // soon as its gradients are final for this micro-batch, in BackwardParts' order
  // (stage.h: head / final norm, the layers from the last, the embedding; a Backward
  // CHECK-fails out of that order), so data-parallel gradient buckets can be reduced while
  // backward continues.
  void Backward(const DecoderInput& input, DecoderOutput& out,
                const std::function<void(const parallel::PartId& part)>& on_done = nullptr);

  // ZeRO-3 (engine/parallel/zero.h) frees parameters between uses. acquire(part, next) is
  // called before a part's parameters are read — in Forward and again in Backward — with
  // the part read after it (PartId() for none), release(part) after; parts are those
  // Backward reports (the embedding, layer i, the final norm, the head; with tied
  // embeddings the head's part is the embedding's). A training Forward keeps the head for Backward. Under full recompute
  // Backward re-runs a block's forward between that block's acquire and release.
  // gradients(part), when set, is called in Backward just before the part's gradients are
  // first written (after its acquire): ZeRO-2/3 allocate a part's gradients there and free
  // them once its bucket is reduce-scattered (engine/parallel/grad_sync.h). With tied
  // embeddings the head's part is the embedding's, so the table's gradient lives from the head's
  // backward to the embedding's.
  struct ParameterHooks {
    std::function<void(const parallel::PartId& part, const parallel::PartId& next)> acquire;
    std::function<void(const parallel::PartId& part)> release;
    std::function<void(const parallel::PartId& part)> gradients;
  };
  void set_parameter_hooks(ParameterHooks hooks) { hooks_ = std::move(hooks); }

  // What Forward keeps for Backward (engine/model/recompute.h); kNone by default. Applies
  // to the Forward calls after it, each Backward following the mode its Forward ran under.
  void set_recompute(Recompute mode) { recompute_ = mode; }
  Recompute recompute() const { return recompute_; }

  // Head chunking (train.head_chunk_tokens): with 0 < tokens < the micro-batch's rows,
  // Forward runs the head and the cross-entropy `tokens` rows at a time, keeping no logits;
  // Backward computes each chunk's logits again, then its gradient, the head's weight
  // gradient and the chunk's rows of the head input's gradient. At most one chunk's logits
  // (tokens x V/tp f32, and their bf16 operand in backward) exist at once, for one more head
  // forward. The per-row losses and logits are the chunk's rows of the whole product; the
  // sums over rows (the loss, the weight gradient) add chunk by chunk, so results agree
  // with the whole head to rounding, not bit for bit. 0 (the default): whole. Applies to
  // the Forward calls after it; each Backward follows its Forward.
  void set_head_chunk(int64_t tokens) { head_chunk_ = tokens; }
  int64_t head_chunk() const { return head_chunk_; }

  parallel::ParameterRegistry& registry() { return registry_; }
  const ModelConfig& config() const { return model_; }
  const moe::MoEConfig& moe_config() const { return moe_; }
  Device device() const { return ctx_ ? ctx_->device() : Device::Cpu(); }
  DeviceContext* ctx() const { return ctx_; }
  const Stage& stage() const { return parallel_.stage; }
  // The residual stream's shape between stages for a (batch, seq) micro-batch: (B, S, d),
  // or this rank's rows (B*S/tp, d) under sequence parallelism.
  Shape HiddenShape(int64_t batch, int64_t seq) const;
  // The MoE layers in depth order (layer ids in moe_layer_ids()).
  std::vector<moe::MoELayer*> moe_layers();
  const std::vector<int64_t>& moe_layer_ids() const { return moe_ids_; }

 private:
  struct Block {
    dense::Norm norm1, norm2;
    dense::Attention attn;
    std::optional<dense::Mlp> mlp;
    std::optional<moe::MoELayer> moe;
  };
  Decoder(const ModelConfig& model, const moe::MoEConfig& moe, const DecoderParallel& parallel,
          DeviceContext* ctx)
      : model_(model), moe_(moe), parallel_(parallel), ctx_(ctx) {}
  // What Create builds the blocks from, and the scales it draws weights with (std; the
  // residual output projections out_std).
  struct BlockOptions {
    dense::NormOptions norm;
    dense::AttentionOptions attention;
    dense::MlpOptions mlp;
    moe::MoEParallel moe;
  };
  struct InitScales {
    uint64_t seed = 0;
    float std = 0.02f, out_std = 0.02f;
  };
  // The stage's blocks, initialised; errors name the config key the dense MLP rejects.
  Status AddBlocks(const BlockOptions& options, const InitScales& init);
  // On the last stage: the final norm and, untied, the head (weight ~ N(0, std^2) over the
  // whole (d, V) weight, keyed "head.weight", this rank's vocabulary columns kept).
  void AddHead(const dense::NormOptions& norm, const InitScales& init);
  // The untied head's parameters: its weight, a box of (d, V) split over tp by vocabulary.
  std::vector<parallel::Parameter> HeadParameters() const;
  // Every layer's parameters into registry_, named "<part>.<layer's name>" with their part.
  void Register();
  // The checks of Forward's input (SY_CHECK: shapes, dtype, device, the tp/cp layout).
  void CheckForwardInput(const DecoderInput& in) const;
  // The residual stream the stage's first block reads: the embedding's output on the first
  // stage (acquiring the embedding with `next` after it), else the previous stage's hidden.
  Tensor ForwardInput(const DecoderInput& in, const parallel::PartId& next,
                      DecoderActivations& acts);
  // The last stage: the final norm, the head and the cross-entropy of x (the last block's
  // output) into out (its gradient kept in acts.dlogits when training).
  void ForwardHead(const DecoderInput& in, const ResidualStream& x, DecoderOutput& out);
  // The head's backward from Forward's activations: the head's (or the tied table's)
  // weight gradient added, the gradient of acts.head_in (N, d) returned.
  Tensor BackwardHead(const DecoderInput& in, const DecoderActivations& acts);
  // Its chunked form (set_head_chunk): the loss sums of chunks of `chunk` rows.
  void ForwardHeadChunked(const DecoderInput& in, int64_t chunk, DecoderOutput& out);
  // The chunked head's backward: each chunk's logits again, their gradient, the head's
  // weight gradient; returns the gradient of acts.head_in (N, d).
  Tensor BackwardHeadChunked(const DecoderInput& in, const DecoderActivations& acts);
  // The logits (rows, this rank's vocabulary) of the head's input rows; with `kept`, the
  // untied head's activations for its backward.
  Tensor HeadLogits(const Tensor& rows, std::optional<dense::LinearActivations>* kept) const;
  // The cross-entropy of `logits` against `targets` on this rank's path (vocabulary-parallel
  // under tp); with grad, its gradient times grad_scale over the logits. With `sums` (the
  // step readback's 2 f64 slots) the sums go there and nothing is returned.
  kernels::CrossEntropySums HeadLoss(Tensor& logits, const Tensor& targets, bool grad,
                                     float grad_scale, Tensor* sums) const;
  // The head's products backward for `rows` of its input (kept: the untied head's
  // activations of them) and their logits' gradient: the weight gradient added, drows written.
  void HeadProductsBackward(const Tensor& rows, const std::optional<dense::LinearActivations>& kept,
                            const Tensor& dlogits, Tensor& drows);
  // The step readback keeps the cross-entropy sums on the device (a training step on
  // checked ids without tp); the head's loss paths branch on it.
  bool CrossEntropyOnDevice(const DecoderInput& in) const;
  // Block k's forward from x (its input, the previous block's output still unsummed) into
  // ba (x_in: the input summed); returns its output, x_mid + the MLP's or MoE's output, unsummed.
  // core: whether attention keeps its core output (selective recompute drops it).
  ResidualStream ForwardBlock(int64_t k, const ResidualStream& x, const DecoderInput& in,
                              dense::CoreAttention core, BlockActivations& ba);
  // Block k's backward from dx, the gradient of its output; returns that of its input.
  // aux_scale: dLoss/daux = dLoss/dz of the MoE layer's routing group.
  Tensor BackwardBlock(int64_t k, const BlockActivations& ba, Tensor dx,
                       std::span<const float> aux_scale);
  dense::TensorParallel tp() const {
    return {.comm = parallel_.tp, .sequence_parallel = parallel_.sequence_parallel};
  }
  parallel::ContextParallel cp() const { return {.comm = parallel_.cp, .seq_len = model_.seq_len}; }
  // How a micro-batch of `batch` sequences lies over tp_cp (contiguous without cp).
  moe::GroupLayout MoEGroupLayout(int64_t batch) const;
  // The MoE layer's input rows on this rank from the norm's output, and its output rows
  // back in the residual stream's layout (only differ with tp and no sequence parallelism).
  Tensor MoERowsIn(const Tensor& x) const;
  Tensor MoERowsOut(const Tensor& y, const Shape& shape) const;
  // Their backward.
  Tensor MoERowsOutBackward(const Tensor& dy) const;
  Tensor MoERowsInBackward(const Tensor& dh, const Shape& shape) const;
  void Acquire(const parallel::PartId& part, const parallel::PartId& next) const {
    if (hooks_.acquire) hooks_.acquire(part, next);
  }
  void Release(const parallel::PartId& part) const {
    if (hooks_.release) hooks_.release(part);
  }
  // Backward's acquire: the part's parameters, then its gradients (ParameterHooks).
  void AcquireForBackward(const parallel::PartId& part, const parallel::PartId& next) const {
    Acquire(part, next);
    if (hooks_.gradients) hooks_.gradients(part);
  }
  // Block k of this stage is the model's layer first_layer_ + k.
  parallel::PartId LayerPart(int64_t k) const { return parallel::PartId::Layer(first_layer_ + k); }
  parallel::PartId HeadPart() const {
    return head_ ? parallel::PartId::Head() : parallel::PartId::Embed();
  }

  ModelConfig model_;
  moe::MoEConfig moe_;
  DecoderParallel parallel_;
  DeviceContext* ctx_;
  dense::EmbeddingOptions eo_;             // the vocabulary split (every stage)
  std::optional<dense::Embedding> embed_;  // first stage; the last stage's wte when tied
  std::vector<Block> blocks_;
  std::optional<dense::Norm> norm_f_;
  std::optional<dense::Linear> head_;  // untied: (d, this rank's vocabulary columns)
  std::vector<int64_t> moe_ids_;
  int64_t first_layer_ = 0;
  parallel::ParameterRegistry registry_;
  ParameterHooks hooks_;
  Recompute recompute_ = Recompute::kNone;
  int64_t head_chunk_ = 0;
};

}  // namespace switchyard::model
