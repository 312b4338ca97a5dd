// One table of the decoder's parameter tensors, derived from the model and MoE settings once
// (llm.c's fill_in_parameter_sizes): every tensor the decoder registers (dense/*.h, moe/*.h
// through Decoder::Create), with its registry name, logical shape, the part of the model
// that holds it, how each dimension is split over tp / ep / etp, and whether its copies are
// replicated over tensor-parallel ranks. What is derived from parameter shapes reads it:
// the dry-run's counts, FLOPs per token, per-rank parameters and memory
// (engine/plan/dry_run.h) and the pipeline's stage costs (stage.h).
// tests/engine/plan/param_table_test.cc checks it against the decoder's registry.
//
// It lives in engine/model, not engine/plan: the shapes are the decoder's, and the stage
// costs that balance the pipeline are needed by Config::Validate (below plan) through
// PartitionLayers.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/dist/mesh.h"
#include "engine/model/model_config.h"
#include "engine/model/stage.h"
#include "engine/parallel/parameter.h"
#include "moe/moe_config.h"

namespace switchyard::model {

// How one dimension of a parameter is split over the mesh.
enum class DimSplit {
  kNone,   // whole on every rank
  kTp,     // over tp: size / tp each
  kVocab,  // vocabulary rows over tp: ceil(V / tp) per rank, the padding left out
  kEp,     // experts over ep
  kEtp,    // each expert's hidden units over etp
};

// What a parameter is, for the figures that weigh kinds differently.
enum class ParamRole {
  kEmbedding,     // wte, wpe: looked up, never multiplied
  kNorm,          // a norm's weight or bias
  kAttention,     // q, k, v, o and their biases
  kMlp,           // the dense MLP's w1, w2 (w3) and biases
  kRouter,        // the MoE router's weight
  kSharedExpert,  // the shared experts (applied to every token)
  kExpert,        // the routed experts (each token uses top_k of num_experts)
  kHead,          // the head's table (its own, or the last stage's copy of a tied wte)
};

// The tensor-parallel sizes the table splits for (the mesh's tp, etp and ep).
struct ParamLayout {
  int64_t tp = 1, etp = 1, ep = 1;
  bool operator==(const ParamLayout&) const = default;
};

// One parameter tensor.
struct ParamShape {
  const char* pattern = "";  // the registry name, "{}" standing for the layer index
  // The part of the decoder it belongs to, as the decoder records it (Parameter::part):
  // the embedding (wte, wpe, and the last stage's copy of a tied wte), layer i, the final
  // norm, the head.
  parallel::PartId part{};
  ParamRole role = ParamRole::kAttention;
  int dims = 0;                          // how many of shape / split are used
  std::array<int64_t, 3> shape{};        // the logical (global) shape
  std::array<DimSplit, 3> split{};       // per dimension
  bool expert_view = false;  // routed experts: the expert view (etp, ep, edp)
  bool bias = false;         // a bias vector (added, not multiplied by)
  // Copies on several ranks of its tensor-parallel group (tp, or etp for the expert view):
  // whole there (norms, router, row-parallel biases, wpe, shared experts; k and v when tp
  // does not divide the kv heads; the experts' b2). Only when that group has more than one
  // rank (ParamTable::Replicated).
  bool whole_over_tp = false;
  // The last stage's copy of the tied token table ("embed.wte"): held by a head stage
  // without the embedding, and counted once in the totals (as the embedding's).
  bool tied_copy = false;
  // The token table ("embed.wte", and its copy): with tied embeddings over pipeline stages
  // both stages' copies are marked Parameter::tied.
  bool token_table = false;

  // "layers.3.attn.q.weight".
  std::string Name() const;
  // The view of the mesh its layout refers to (Parameter::view).
  dist::View view() const { return expert_view ? dist::View::kExpert : dist::View::kDense; }
  // Elements of the logical tensor.
  int64_t numel() const;
  // Elements used by one token: a routed expert tensor's top_k of num_experts, else numel.
  int64_t active(int64_t top_k) const;
};

// What a piece of the model (the embedding, one layer, the head) holds and uses per token.
struct PieceParams {
  int64_t params = 0;  // elements (a tied copy not counted)
  int64_t active = 0;  // elements one token uses (routed experts: top_k of them)
  // Matrix elements one token is multiplied by (the head's product included, the embedding
  // lookup excluded, biases and norms excluded): forward FLOPs 2 x this.
  int64_t matmul = 0;
  // Attention's scores and values per token: S x (n_heads x head_dim) (a layer; 0 else).
  int64_t attention = 0;
};

class ParamTable {
 public:
  // Every tensor of the whole model, split for `layout`. The last few tables built are
  // kept and returned again for the same model, MoE config and layout (the planner asks for
  // one model's under many layouts, each for every rank).
  static ParamTable Build(const ModelConfig& model, const moe::MoEConfig& moe,
                          ParamLayout layout = {});
  // The same table without the copy: the kept one itself (the planner's per-rank callers).
  static std::shared_ptr<const ParamTable> Shared(const ModelConfig& model,
                                                  const moe::MoEConfig& moe,
                                                  ParamLayout layout = {});

  const std::vector<ParamShape>& params() const { return params_; }
  const ParamLayout& layout() const { return layout_; }
  int64_t n_layers() const { return n_layers_; }

  // Whether `p` has copies on several ranks of its tensor-parallel group under the layout.
  bool Replicated(const ParamShape& p) const;
  // The axes (of p.view()) its gradient is summed over (Parameter::grad_sum): dense over
  // dp x cp, routed experts over edp; a replicated copy (Replicated) also over tp (etp),
  // except norm weights without sequence parallelism (every tp rank computes the whole
  // gradient).
  parallel::AxisSet GradSum(const ParamShape& p, bool sequence_parallel) const;
  // The tensors a decoder of `stage` registers, in its registration order
  // (Decoder::Register): the embedding's (on a stage with the head but not the embedding,
  // under tied embeddings, the token table's copy alone), the stage's layers, the final
  // norm, the untied head.
  std::vector<ParamShape> StageParams(const Stage& stage) const;
  // The elements of `p` the rank at tensor-parallel coordinate `tp_rank` holds.
  int64_t LocalNumel(const ParamShape& p, int64_t tp_rank) const;

  // The registry of a decoder of `stage` against the table: its trainable parameters are
  // StageParams(stage), in that order, each with the table's name, logical shape, part,
  // view, gradient axes (GradSum), box size on tensor-parallel rank tp_rank (LocalNumel)
  // and tied flag (the token table when tie_embeddings and the stage is not the whole
  // model). The first difference is an error naming the parameter and both values.
  Status CheckRegistry(const parallel::ParameterRegistry& registry, const Stage& stage,
                       bool sequence_parallel, int64_t tp_rank, bool tie_embeddings) const;

  // Sums over one piece, and over the whole model.
  const PieceParams& Embedding() const { return pieces_.front(); }
  const PieceParams& Layer(int64_t layer) const { return pieces_[1 + layer]; }
  const PieceParams& Head() const { return pieces_.back(); }
  const PieceParams& Total() const { return total_; }
  // The index of the piece `p` belongs to: 0 the embedding, 1 + i layer i, n_layers + 1
  // the head (the final norm, the head, and a tied table's copy).
  size_t PieceIndex(const ParamShape& p) const;
  // Elements of the routed experts (all of them) and of the embedding tables (wte, wpe).
  int64_t expert_params() const;
  int64_t embedding_params() const;

 private:
  static ParamTable BuildUncached(const ModelConfig& model, const moe::MoEConfig& moe,
                                  ParamLayout layout);
  void SumPieces();

  std::vector<ParamShape> params_;
  std::vector<PieceParams> pieces_;  // PieceIndex order
  PieceParams total_;
  ParamLayout layout_;
  int64_t n_layers_ = 0, top_k_ = 1, attention_ = 0;
};

// The dense MLP's (and the experts') weight matrices: 3 under swiglu, else 2.
int64_t MlpMatrices(dense::Activation activation);
// Whether k and v are whole on every tp rank: tp does not divide the kv heads
// (dense/attention.h).
bool KvReplicated(const ModelConfig& model, int64_t tp);

}  // namespace switchyard::model
