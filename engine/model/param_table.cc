#include "engine/model/param_table.h"

#include <algorithm>
#include <deque>
#include <mutex>

namespace switchyard::model {
namespace {

constexpr DimSplit kNo = DimSplit::kNone;

// Appends the tensors one layer registers (dense/attention.h, dense/mlp.h, moe/moe_layer.h,
// moe/experts.h), in registry order.
class LayerTensors {
 public:
  LayerTensors(const ModelConfig& m, const moe::MoEConfig& e, const ParamLayout& layout,
               std::vector<ParamShape>& out)
      : m_(m), e_(e), layout_(layout), out_(out) {}

  void Add(int64_t layer) {
    layer_ = layer;
    Norm("layers.{}.norm1.weight", "layers.{}.norm1.bias");
    Attention();
    Norm("layers.{}.norm2.weight", "layers.{}.norm2.bias");
    if (e_.IsMoELayer(layer)) {
      MoE();
    } else {
      Mlp();
    }
  }

  // The final norm (the head's).
  void FinalNorm() {
    layer_ = -1;
    Norm("norm_f.weight", "norm_f.bias");
  }

 private:
  // A norm's weight (d) and, for layernorm, its bias (d): whole on every tp rank.
  void Norm(const char* weight, const char* bias) {
    const int64_t d = m_.d_model;
    Push({.pattern = weight, .role = ParamRole::kNorm, .dims = 1, .shape = {d},
          .whole_over_tp = true});
    if (m_.norm == dense::NormKind::kLayerNorm) {
      Push({.pattern = bias, .role = ParamRole::kNorm, .dims = 1, .shape = {d}, .bias = true,
            .whole_over_tp = true});
    }
  }

  void Push(ParamShape p) {
    p.part = layer_ < 0 ? parallel::PartId::NormF() : parallel::PartId::Layer(layer_);
    out_.push_back(p);
  }

  // q and k, v column-parallel (k and v whole when tp does not divide the kv heads), o
  // row-parallel with its bias whole.
  void Attention() {
    const int64_t d = m_.d_model, q = m_.n_heads * m_.head_dim(), kv = m_.kv_heads() * m_.head_dim();
    const bool kv_whole = KvReplicated(m_, layout_.tp);
    const DimSplit kv_split = kv_whole ? kNo : DimSplit::kTp;
    const ParamRole r = ParamRole::kAttention;
    Push({.pattern = "layers.{}.attn.q.weight", .role = r, .dims = 2, .shape = {d, q},
          .split = {kNo, DimSplit::kTp}});
    if (m_.bias) {
      Push({.pattern = "layers.{}.attn.q.bias", .role = r, .dims = 1, .shape = {q},
            .split = {DimSplit::kTp}, .bias = true});
    }
    const char* const kv_names[2][2] = {{"layers.{}.attn.k.weight", "layers.{}.attn.k.bias"},
                                        {"layers.{}.attn.v.weight", "layers.{}.attn.v.bias"}};
    for (const auto& [weight, bias] : kv_names) {
      Push({.pattern = weight, .role = r, .dims = 2, .shape = {d, kv}, .split = {kNo, kv_split},
            .whole_over_tp = kv_whole});
      if (m_.bias) {
        Push({.pattern = bias, .role = r, .dims = 1, .shape = {kv}, .split = {kv_split},
              .bias = true, .whole_over_tp = kv_whole});
      }
    }
    Push({.pattern = "layers.{}.attn.o.weight", .role = r, .dims = 2, .shape = {q, d},
          .split = {DimSplit::kTp, kNo}});
    if (m_.bias) {
      Push({.pattern = "layers.{}.attn.o.bias", .role = r, .dims = 1, .shape = {d}, .bias = true,
            .whole_over_tp = true});
    }
  }

  // w1 (and w3) column-parallel, w2 row-parallel with its bias whole.
  void Mlp() {
    const int64_t d = m_.d_model, f = m_.ff_hidden();
    const ParamRole r = ParamRole::kMlp;
    Push({.pattern = "layers.{}.mlp.w1.weight", .role = r, .dims = 2, .shape = {d, f},
          .split = {kNo, DimSplit::kTp}});
    if (m_.bias) {
      Push({.pattern = "layers.{}.mlp.w1.bias", .role = r, .dims = 1, .shape = {f},
            .split = {DimSplit::kTp}, .bias = true});
    }
    Push({.pattern = "layers.{}.mlp.w2.weight", .role = r, .dims = 2, .shape = {f, d},
          .split = {DimSplit::kTp, kNo}});
    if (m_.bias) {
      Push({.pattern = "layers.{}.mlp.w2.bias", .role = r, .dims = 1, .shape = {d}, .bias = true,
            .whole_over_tp = true});
    }
    if (m_.activation == dense::Activation::kSwiglu) {
      Push({.pattern = "layers.{}.mlp.w3.weight", .role = r, .dims = 2, .shape = {d, f},
            .split = {kNo, DimSplit::kTp}});
    }
  }

  // The router (whole), the routed experts (E over ep, the hidden units over etp; b2 whole
  // over etp) and the shared experts (one block of num_shared x d_shared hidden units,
  // whole on every tp rank).
  void MoE() {
    const int64_t d = m_.d_model, E = e_.num_experts, f = e_.d_expert;
    Push({.pattern = "layers.{}.moe.router.weight", .role = ParamRole::kRouter, .dims = 2,
          .shape = {d, E}, .whole_over_tp = true});
    const ParamRole x = ParamRole::kExpert;
    const DimSplit ep = DimSplit::kEp, etp = DimSplit::kEtp;
    Push({.pattern = "layers.{}.moe.experts.w1", .role = x, .dims = 3, .shape = {E, d, f},
          .split = {ep, kNo, etp}, .expert_view = true});
    Push({.pattern = "layers.{}.moe.experts.w2", .role = x, .dims = 3, .shape = {E, f, d},
          .split = {ep, etp, kNo}, .expert_view = true});
    if (e_.activation == dense::Activation::kSwiglu) {
      Push({.pattern = "layers.{}.moe.experts.w3", .role = x, .dims = 3, .shape = {E, d, f},
            .split = {ep, kNo, etp}, .expert_view = true});
    }
    if (e_.bias) {
      Push({.pattern = "layers.{}.moe.experts.b1", .role = x, .dims = 2, .shape = {E, f},
            .split = {ep, etp}, .expert_view = true, .bias = true});
      Push({.pattern = "layers.{}.moe.experts.b2", .role = x, .dims = 2, .shape = {E, d},
            .split = {ep, kNo}, .expert_view = true, .bias = true, .whole_over_tp = true});
    }
    const int64_t h = e_.num_shared_experts * e_.shared_hidden();
    if (e_.num_shared_experts <= 0) return;
    const ParamRole s = ParamRole::kSharedExpert;
    Push({.pattern = "layers.{}.moe.shared.w1", .role = s, .dims = 3, .shape = {1, d, h},
          .whole_over_tp = true});
    Push({.pattern = "layers.{}.moe.shared.w2", .role = s, .dims = 3, .shape = {1, h, d},
          .whole_over_tp = true});
    if (e_.activation == dense::Activation::kSwiglu) {
      Push({.pattern = "layers.{}.moe.shared.w3", .role = s, .dims = 3, .shape = {1, d, h},
            .whole_over_tp = true});
    }
    if (e_.bias) {
      Push({.pattern = "layers.{}.moe.shared.b1", .role = s, .dims = 2, .shape = {1, h},
            .bias = true, .whole_over_tp = true});
      Push({.pattern = "layers.{}.moe.shared.b2", .role = s, .dims = 2, .shape = {1, d},
            .bias = true, .whole_over_tp = true});
    }
  }

  const ModelConfig& m_;
  const moe::MoEConfig& e_;
  const ParamLayout& layout_;
  std::vector<ParamShape>& out_;
  int64_t layer_ = -1;
};

// A parameter a token is multiplied by: a weight matrix past the embedding lookup.
bool IsMatrix(const ParamShape& p) {
  return !p.bias && p.role != ParamRole::kNorm && p.role != ParamRole::kEmbedding;
}

}  // namespace

std::string ParamShape::Name() const {
  std::string name = pattern;
  const size_t at = name.find("{}");
  if (at != std::string::npos) name.replace(at, 2, std::to_string(part.layer));
  return name;
}

int64_t ParamShape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < dims; ++i) n *= shape[i];
  return n;
}

int64_t ParamShape::active(int64_t top_k) const {
  if (role != ParamRole::kExpert || shape[0] <= 0) return numel();
  return numel() / shape[0] * top_k;
}

int64_t MlpMatrices(dense::Activation activation) {
  return activation == dense::Activation::kSwiglu ? 3 : 2;
}

bool KvReplicated(const ModelConfig& model, int64_t tp) {
  return tp > 1 && model.kv_heads() % tp != 0;
}

ParamTable ParamTable::Build(const ModelConfig& m, const moe::MoEConfig& e, ParamLayout layout) {
  return *Shared(m, e, layout);
}

std::shared_ptr<const ParamTable> ParamTable::Shared(const ModelConfig& m, const moe::MoEConfig& e,
                                                     ParamLayout layout) {
  struct Entry {
    ModelConfig model;
    moe::MoEConfig moe;
    ParamLayout layout;
    std::shared_ptr<const ParamTable> table;
  };
  static std::mutex mu;
  static std::deque<Entry> recent;  // newest first
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const Entry& x : recent) {
      if (x.layout == layout && x.model == m && x.moe == e) return x.table;
    }
  }
  auto t = std::make_shared<const ParamTable>(BuildUncached(m, e, layout));
  std::lock_guard<std::mutex> lock(mu);
  recent.push_front({m, e, layout, t});
  if (recent.size() > 16) recent.pop_back();
  return t;
}

ParamTable ParamTable::BuildUncached(const ModelConfig& m, const moe::MoEConfig& e,
                                     ParamLayout layout) {
  ParamTable t;
  t.layout_ = layout;
  t.n_layers_ = m.n_layers;
  t.top_k_ = e.top_k;
  t.attention_ = m.seq_len * m.n_heads * m.head_dim();
  const int64_t d = m.d_model, V = m.vocab_size;
  const ParamShape wte{.pattern = "embed.wte", .part = parallel::PartId::Embed(),
                       .role = ParamRole::kEmbedding, .dims = 2, .shape = {V, d},
                       .split = {DimSplit::kVocab, kNo}, .token_table = true};
  t.params_.push_back(wte);
  if (m.position == Position::kLearned) {
    t.params_.push_back({.pattern = "embed.wpe", .part = parallel::PartId::Embed(),
                         .role = ParamRole::kEmbedding, .dims = 2, .shape = {m.seq_len, d},
                         .whole_over_tp = true});
  }
  LayerTensors layers(m, e, t.layout_, t.params_);
  for (int64_t i = 0; i < m.n_layers; ++i) layers.Add(i);
  layers.FinalNorm();
  if (m.tie_embeddings) {
    ParamShape copy = wte;
    copy.role = ParamRole::kHead;
    copy.tied_copy = true;
    t.params_.push_back(copy);
  } else {
    t.params_.push_back({.pattern = "head.weight", .part = parallel::PartId::Head(),
                         .role = ParamRole::kHead, .dims = 2, .shape = {d, V},
                         .split = {kNo, DimSplit::kVocab}});
  }
  t.SumPieces();
  return t;
}

bool ParamTable::Replicated(const ParamShape& p) const {
  return p.whole_over_tp && (p.expert_view ? layout_.etp : layout_.tp) > 1;
}

int64_t ParamTable::LocalNumel(const ParamShape& p, int64_t tp_rank) const {
  int64_t n = 1;
  for (int i = 0; i < p.dims; ++i) {
    const int64_t size = p.shape[i];
    switch (p.split[i]) {
      case DimSplit::kNone:
        n *= size;
        break;
      case DimSplit::kTp:
        n *= size / layout_.tp;
        break;
      case DimSplit::kVocab: {
        const int64_t rows = (size + layout_.tp - 1) / layout_.tp;
        n *= std::max<int64_t>(0, std::min(rows, size - tp_rank * rows));
        break;
      }
      case DimSplit::kEp:
        n *= size / layout_.ep;
        break;
      case DimSplit::kEtp:
        n *= size / layout_.etp;
        break;
    }
  }
  return n;
}

void ParamTable::SumPieces() {
  pieces_.assign(n_layers_ + 2, PieceParams{});
  for (const ParamShape& p : params_) {
    PieceParams& s = pieces_[PieceIndex(p)];
    if (IsMatrix(p)) s.matmul += p.active(top_k_);
    if (p.tied_copy) continue;
    s.params += p.numel();
    s.active += p.active(top_k_);
  }
  for (int64_t i = 0; i < n_layers_; ++i) pieces_[1 + i].attention = attention_;
  for (const PieceParams& s : pieces_) {
    total_.params += s.params;
    total_.active += s.active;
    total_.matmul += s.matmul;
    total_.attention += s.attention;
  }
}

size_t ParamTable::PieceIndex(const ParamShape& p) const {
  using Kind = parallel::PartId::Kind;
  if (p.part.kind == Kind::kEmbed && !p.tied_copy) return 0;
  if (p.part.kind == Kind::kLayer) return static_cast<size_t>(1 + p.part.layer);
  return static_cast<size_t>(n_layers_ + 1);
}

parallel::AxisSet ParamTable::GradSum(const ParamShape& p, bool sequence_parallel) const {
  using dist::Axis;
  parallel::AxisSet axes = p.expert_view ? parallel::AxisSet{Axis::kDp}
                                         : parallel::AxisSet{Axis::kDp, Axis::kCp};
  const bool summed_over_tp = p.role != ParamRole::kNorm || sequence_parallel;
  if (Replicated(p) && summed_over_tp) axes = axes.With(Axis::kTp);
  return axes;
}

std::vector<ParamShape> ParamTable::StageParams(const Stage& stage) const {
  using Kind = parallel::PartId::Kind;
  std::vector<ParamShape> out;
  for (const ParamShape& p : params_) {
    if (p.part.kind != Kind::kEmbed) continue;
    if (stage.embedding ? !p.tied_copy : stage.head && p.tied_copy) out.push_back(p);
  }
  for (const ParamShape& p : params_) {
    const bool layer = p.part.kind == Kind::kLayer && p.part.layer >= stage.first_layer &&
                       p.part.layer < stage.End(n_layers_);
    const bool head = stage.head && (p.part.kind == Kind::kNormF || p.part.kind == Kind::kHead);
    if (layer || head) out.push_back(p);
  }
  return out;
}

int64_t ParamTable::expert_params() const {
  int64_t n = 0;
  for (const ParamShape& p : params_) n += p.role == ParamRole::kExpert ? p.numel() : 0;
  return n;
}

int64_t ParamTable::embedding_params() const { return pieces_[0].params; }

Status ParamTable::CheckRegistry(const parallel::ParameterRegistry& registry, const Stage& stage,
                                 bool sequence_parallel, int64_t tp_rank,
                                 bool tie_embeddings) const {
  const std::vector<ParamShape> want = StageParams(stage);
  const bool tied = tie_embeddings && !stage.whole(n_layers_);
  size_t k = 0;
  for (const parallel::Parameter& p : registry.params()) {
    if (!p.trainable) continue;
    if (k == want.size()) {
      return Internal("parameter table: the decoder registers ", p.name,
                      " beyond the table's ", want.size(), " tensors of ",
                      stage.Describe(n_layers_));
    }
    const ParamShape& t = want[k++];
    auto differs = [&](const char* what, const auto& registered, const auto& table) {
      return Internal("parameter table: ", p.name, "'s ", what, " is ", registered,
                      " in the decoder's registry, ", table, " in the table (", t.Name(), ")");
    };
    if (p.name != t.Name()) return differs("name", p.name, t.Name());
    const Shape shape(t.shape.begin(), t.shape.begin() + t.dims);
    if (p.global_shape != shape) {
      return differs("logical shape", ShapeString(p.global_shape), ShapeString(shape));
    }
    if (p.part != t.part) return differs("part", p.part.Name(), t.part.Name());
    if (p.view != t.view()) {
      return differs("view", p.view == dist::View::kDense ? "dense" : "expert",
                     t.expert_view ? "expert" : "dense");
    }
    const parallel::AxisSet sum = GradSum(t, sequence_parallel);
    if (!(p.grad_sum == sum)) {
      return differs("gradient group", p.grad_sum.ToString(p.view), sum.ToString(t.view()));
    }
    if (p.value.numel() != LocalNumel(t, tp_rank)) {
      return differs("box size", p.value.numel(), LocalNumel(t, tp_rank));
    }
    if (p.tied != (tied && t.token_table)) return differs("tied flag", p.tied, tied && t.token_table);
  }
  if (k != want.size()) {
    return Internal("parameter table: the decoder of ", stage.Describe(n_layers_), " registers ",
                    k, " trainable tensors, the table ", want.size(), " (the first missing: ",
                    want[k].Name(), ")");
  }
  return OkStatus();
}

}  // namespace switchyard::model
