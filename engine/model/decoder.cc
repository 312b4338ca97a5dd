#include "engine/model/decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/core/profile.h"
#include "engine/model/param_table.h"
#include "kernels/activation_storage.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/random.h"
#include "engine/parallel/tensor_parallel.h"

namespace switchyard::model {

using parallel::PartId;

Tensor ResidualStream::Sum(DeviceContext* ctx) const {
  if (!add.defined()) return x;
  Tensor out = Tensor::Empty(x.shape(), x.dtype(), x.device());
  kernels::Add(x, add.Reshape(x.shape()), out, ctx);
  return out;
}

dense::NormActivations ResidualStream::Norm(const dense::Norm& norm, DeviceContext* ctx,
                                            DType y_dtype) const {
  return add.defined() ? norm.AddForward(x, add, ctx, y_dtype) : norm.Forward(x, ctx, y_dtype);
}

StatusOr<std::unique_ptr<Decoder>> Decoder::Create(const ModelConfig& model,
                                                   const moe::MoEConfig& moe_in, uint64_t seed,
                                                   const DecoderParallel& parallel,
                                                   DeviceContext* ctx) {
  SY_RETURN_IF_ERROR(model.Validate());
  SY_CHECK(parallel.ep != nullptr) << "Decoder::Create needs an ep communicator";
  moe::MoEConfig moe = moe_in;
  moe.d_model = model.d_model;
  moe.seq_len = model.seq_len;
  SY_RETURN_IF_ERROR(moe.Validate());
  SY_RETURN_IF_ERROR(moe.ExpertsPerRank(parallel.ep->size()).status());
  SY_RETURN_IF_ERROR(moe.CheckOverlapChunks(parallel.ep->size()));
  const dense::NormKind norm_kind = model.norm;
  const dense::Activation activation = model.activation;

  SY_RETURN_IF_ERROR(parallel.stage.Validate(model.n_layers));
  std::unique_ptr<Decoder> dec(new Decoder(model, moe, parallel, ctx));
  const Stage& stage = parallel.stage;
  dec->first_layer_ = stage.first_layer;
  const dense::TensorParallel tp = dec->tp();
  const parallel::ContextParallel cp = dec->cp();
  SY_RETURN_IF_ERROR(cp.Validate());
  SY_CHECK(!cp.active() || parallel.tp_cp != nullptr)
      << "Decoder::Create: context parallelism needs DecoderParallel::tp_cp";
  if (tp.active() && tp.sequence_parallel && (cp.local_seq_len() % tp.size()) != 0) {
    return InvalidArgument("model.seq_len=", model.seq_len, cp.active() ? " / (2 * parallel.cp)" : "",
                           " is not divisible by parallel.tp=", tp.size(),
                           " (sequence parallelism splits every sequence's tokens)");
  }
  const Device device = ctx ? ctx->device() : Device::Cpu();
  const float std = model.init_std;
  const float out_std =
      model.scaled_init ? std / std::sqrt(2.0f * static_cast<float>(model.n_layers)) : std;
  dense::EmbeddingOptions eo{.vocab_size = model.vocab_size, .d_model = model.d_model,
                             .max_positions = model.position == Position::kLearned ? model.seq_len : 0,
                             .device = device, .tp = tp, .cp = cp};
  SY_RETURN_IF_ERROR(eo.Validate());
  dec->eo_ = eo;
  if (stage.embedding) {
    dec->embed_.emplace(dense::Embedding::Init(eo, seed, "embed", std, ctx));
  } else if (stage.head && model.tie_embeddings) {
    // The last stage's copy of the token table for the tied head: wte alone, drawn like the
    // first stage's (same name and global indices), so the two start equal.
    dense::EmbeddingOptions table = eo;
    table.max_positions = 0;
    dec->embed_.emplace(dense::Embedding::Init(table, seed, "embed", std, ctx));
  }
  dense::NormOptions no{.kind = norm_kind, .dim = model.d_model, .eps = model.norm_eps,
                        .device = device};
  dense::AttentionOptions ao{.d_model = model.d_model, .n_heads = model.n_heads,
                             .n_kv_heads = model.n_kv_heads,
                             .explicit_head_dim = model.explicit_head_dim, .bias = model.bias,
                             .rope = model.position == Position::kRope, .rope_base = model.rope_base,
                             .device = device, .tp = tp, .seq_len = cp.local_seq_len(),
                             .cp = cp};
  SY_RETURN_IF_ERROR(ao.Validate());
  dense::MlpOptions mo{.d_model = model.d_model, .d_hidden = model.ff_hidden(),
                       .activation = activation, .bias = model.bias, .device = device, .tp = tp};
  // Each routing group's tokens lie over tp, or over cp x tp.
  const moe::MoEParallel mp{.ep = parallel.ep, .tp = parallel.tp, .etp = parallel.etp,
                            .group = cp.active() ? parallel.tp_cp : nullptr};
  const InitScales init{.seed = seed, .std = std, .out_std = out_std};
  SY_RETURN_IF_ERROR(dec->AddBlocks({.norm = no, .attention = ao, .mlp = mo, .moe = mp}, init));
  dec->AddHead(no, init);
  dec->Register();
  // The registry is the parameter table's (param_table.h), which the planner reads: a
  // difference is a bug in one of the two, caught here rather than in a wrong plan.
  const int64_t etp_size = parallel.etp ? parallel.etp->size() : 1;
  const ParamTable table =
      ParamTable::Build(model, moe, {.tp = tp.size(), .etp = etp_size, .ep = parallel.ep->size()});
  SY_CHECK_OK(table.CheckRegistry(dec->registry_, stage, tp.active() && tp.sequence_parallel,
                                  tp.rank(), model.tie_embeddings));
  return dec;
}

Status Decoder::AddBlocks(const BlockOptions& options, const InitScales& init) {
  const Stage& stage = parallel_.stage;
  for (int64_t i = stage.first_layer; i < stage.End(model_.n_layers); ++i) {
    const std::string name = StrCat("layers.", i);
    Block block{dense::Norm(options.norm, ctx_), dense::Norm(options.norm, ctx_),
                dense::Attention::Init(options.attention, init.seed, name + ".attn", init.std,
                                       init.out_std, ctx_),
                std::nullopt, std::nullopt};
    if (moe_.IsMoELayer(i)) {
      block.moe.emplace(
          moe::MoELayer::Init(moe_, i, options.moe, init.seed, init.std, init.out_std, ctx_));
      moe_ids_.push_back(i);
    } else {
      SY_RETURN_IF_ERROR(options.mlp.Validate());
      block.mlp.emplace(
          dense::Mlp::Init(options.mlp, init.seed, name + ".mlp", init.std, init.out_std, ctx_));
    }
    blocks_.push_back(std::move(block));
  }
  return OkStatus();
}

void Decoder::AddHead(const dense::NormOptions& norm, const InitScales& init) {
  if (!parallel_.stage.head) return;
  norm_f_.emplace(norm, ctx_);
  if (model_.tie_embeddings) return;
  // The head's columns are the vocabulary this rank holds (no padding columns), drawn over
  // the whole (d, V) weight and sliced to this rank's box.
  dense::LinearOptions lo{.in = model_.d_model, .out = eo_.valid_rows(), .bias = false,
                          .device = device()};
  head_.emplace(lo, ctx_);
  parallel::Parameter weight = HeadParameters().front();
  parallel::InitNormal(weight, init.seed, init.std, ctx_, "head.weight");
}

std::vector<parallel::Parameter> Decoder::HeadParameters() const {
  std::vector<parallel::Parameter> ps = head_->Parameters();  // "weight" (d, V/tp)
  if (tp().active()) ps.front().Split(1, eo_.vocab_start(), eo_.vocab_size);
  return ps;
}

void Decoder::Register() {
  const dense::TensorParallel tp = this->tp();
  // Every parameter of a part is named "<part>.<its name in the layer>" and records its part.
  auto add = [&](const parallel::PartId& part, const std::string& prefix,
                 std::vector<parallel::Parameter> ps) {
    for (parallel::Parameter& p : ps) {
      p.name = prefix + "." + p.name;
      p.part = part;
      registry_.Add(std::move(p));
    }
  };
  // Norm weights are whole on every tp rank; under sequence parallelism each saw only its
  // rows, so their gradients are summed over tp.
  auto add_norm = [&](const parallel::PartId& part, const std::string& prefix,
                      const dense::Norm& norm) {
    std::vector<parallel::Parameter> ps = norm.Parameters();
    if (tp.active()) {
      for (parallel::Parameter& p : ps) p.ReplicatedOver(dist::Axis::kTp, tp.sequence_parallel);
    }
    add(part, prefix, std::move(ps));
  };
  if (embed_) {
    std::vector<parallel::Parameter> ps = embed_->Parameters();
    // Tied embeddings split over pipeline stages: the first and the last stage hold the
    // token table (wte, the embedding's first parameter), one replica each (its gradients
    // are summed between the two by the trainer, not over the whole pp group).
    if (model_.tie_embeddings && !parallel_.stage.whole(model_.n_layers)) {
      parallel::Parameter& wte = ps.front();
      wte.ReplicatedOver(dist::Axis::kPp, /*grad_summed=*/false);
      wte.tied = true;
    }
    add(parallel::PartId::Embed(), "embed", std::move(ps));
  }
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Block& b = blocks_[i];
    const parallel::PartId part = parallel::PartId::Layer(first_layer_ + static_cast<int64_t>(i));
    const std::string name = part.Name();
    add_norm(part, name + ".norm1", b.norm1);
    add(part, name + ".attn", b.attn.Parameters());
    add_norm(part, name + ".norm2", b.norm2);
    if (b.mlp) add(part, name + ".mlp", b.mlp->Parameters());
    if (b.moe) add(part, name + ".moe", b.moe->Parameters());
  }
  if (norm_f_) add_norm(parallel::PartId::NormF(), "norm_f", *norm_f_);
  if (head_) add(parallel::PartId::Head(), "head", HeadParameters());
}

std::vector<moe::MoELayer*> Decoder::moe_layers() {
  std::vector<moe::MoELayer*> out;
  for (Block& b : blocks_)
    if (b.moe) out.push_back(&*b.moe);
  return out;
}

Shape Decoder::HiddenShape(int64_t batch, int64_t seq) const {
  const dense::TensorParallel tp = this->tp();
  if (tp.active() && tp.sequence_parallel) return {batch * seq / tp.size(), model_.d_model};
  return {batch, seq, model_.d_model};
}

void Decoder::CheckForwardInput(const DecoderInput& in) const {
  const int64_t batch = in.tokens.dim(0), seq = in.tokens.dim(1);
  SY_CHECK(in.tokens.dtype() == DType::kI32 && in.targets.shape() == in.tokens.shape())
      << "tokens " << in.tokens.DebugString() << ", targets " << in.targets.DebugString();
  SY_CHECK_LE(seq, model_.seq_len) << "sequence longer than model.seq_len";
  const dense::TensorParallel tp = this->tp();
  const parallel::ContextParallel cp = this->cp();
  SY_CHECK(!(tp.active() && tp.sequence_parallel) || seq == cp.local_seq_len())
      << "sequence parallelism needs sequences of model.seq_len=" << model_.seq_len;
  SY_CHECK(!cp.active() || (seq == cp.chunk_len() && batch % 2 == 0))
      << "context parallelism: tokens are this rank's chunks (2B, " << cp.chunk_len()
      << "), got " << ShapeString(in.tokens.shape());
  SY_CHECK(in.tokens.device() == device() && in.targets.device() == device())
      << "tokens on " << in.tokens.device() << ", targets on " << in.targets.device()
      << ": the decoder runs on " << device();
}

DecoderOutput Decoder::Forward(const DecoderInput& in) {
  CheckForwardInput(in);
  const Stage& stage = parallel_.stage;
  const parallel::ContextParallel cp = this->cp();
  DecoderOutput out;
  DecoderActivations& acts = out.acts;
  const int64_t layers = static_cast<int64_t>(blocks_.size());
  const PartId after_layers = stage.head ? PartId::NormF() : PartId();
  // (B, S, d), or this rank's rows (N/tp, d) under sp
  ResidualStream x{ForwardInput(in, layers > 0 ? LayerPart(0) : after_layers, acts)};
  const dense::CoreAttention core = recompute_ == Recompute::kSelective
                                        ? dense::CoreAttention::kRecompute
                                        : dense::CoreAttention::kKeep;
  for (int64_t i = 0; i < layers; ++i) {
    Acquire(LayerPart(i), i + 1 < layers ? LayerPart(i + 1) : after_layers);
    BlockActivations ba;
    ResidualStream y = ForwardBlock(i, x, in, core, ba);
    if (ba.moe) {
      if (cp.rank() == 0) {  // the cp ranks share each group: one reports its losses
        for (const PendingSum& a : ba.moe->groups.aux) out.aux_sum += a;
        for (const PendingSum& z : ba.moe->groups.z) out.z_sum += z;
      }
      out.moe_stats.push_back(ba.moe->stats);
      out.moe_indices.push_back(ba.moe->acts.router[0].indices);
    }
    // Full recompute: the block's input alone; Backward runs the block again from it.
    if (recompute_ == Recompute::kFull) {
      Tensor x_in = ba.x_in;
      ba = BlockActivations();
      ba.x_in = x_in;
      ba.recompute = true;
    }
    acts.blocks.push_back(std::move(ba));
    x = y;
    Release(LayerPart(i));
  }
  if (!stage.head) {
    out.hidden = x.Sum(ctx_);
    return out;
  }
  ForwardHead(in, x, out);
  return out;
}

Tensor Decoder::ForwardInput(const DecoderInput& in, const PartId& next,
                             DecoderActivations& acts) {
  const Stage& stage = parallel_.stage;
  if (!stage.embedding) {
    const Shape want = HiddenShape(in.tokens.dim(0), in.tokens.dim(1));
    SY_CHECK(in.hidden.defined() && in.hidden.shape() == want && in.hidden.device() == device())
        << "stage " << stage.Describe(model_.n_layers) << " reads the previous stage's output "
        << ShapeString(want) << " on " << device() << ", got " << in.hidden.DebugString();
    return in.hidden;
  }
  Acquire(PartId::Embed(), next);
  ScopedPhase phase(Phase::kEmbeddingHeadLoss);
  acts.embed = embed_->Forward(
      in.tokens, ctx_, in.ids_checked ? kernels::IdCheck::kOnHost : kernels::IdCheck::kOnDevice);
  Release(PartId::Embed());
  return acts.embed.y;
}

ResidualStream Decoder::ForwardBlock(int64_t k, const ResidualStream& stream,
                                     const DecoderInput& in, dense::CoreAttention core,
                                     BlockActivations& ba) {
  Block& b = blocks_[k];
  DeviceContext* ctx = ctx_;
  // Under bf16 activation storage without tp the norms write their outputs as the bf16
  // operands of the products that read them (attention's q, k, v; the dense MLP's W1): no
  // f32 copy and no conversion. Under tp the tp region's entry communicates them in f32;
  // a MoE block's norm2 output is the router's f32 input.
  const DType operand =
      NormsWriteBf16Operands(kernels::StoresBf16(ctx), tp().active()) ? DType::kBF16 : DType::kF32;
  {
    // The previous block's residual add and norm1 in one kernel.
    ScopedPhase phase(Phase::kNorms);
    ba.norm1 = stream.Norm(b.norm1, ctx, operand);
  }
  const Tensor x = ba.norm1.x;  // the block's input, summed
  ba.x_in = x;
  {
    ScopedPhase phase(Phase::kAttention);
    ba.attn = b.attn.Forward(ba.norm1.y, ctx, core);
  }
  {
    // x_mid = x + attention, and norm2 of it, in one kernel (bit-identical to the two).
    ScopedPhase phase(Phase::kNorms);
    ba.norm2 = b.norm2.AddForward(x, ba.attn.y(), ctx, b.mlp ? operand : DType::kF32);
    ba.x_mid = ba.norm2.x;
  }
  Tensor ffn;
  if (b.mlp) {
    ScopedPhase phase(Phase::kDenseMlp);
    ba.mlp = b.mlp->Forward(ba.norm2.y, ctx);
    ffn = ba.mlp->y();
  } else {
    // One routing group: the micro-batch's N tokens (this rank's N/tp rows under tp).
    const dense::TensorParallel tp = this->tp();
    const int64_t n = in.tokens.numel();
    const int64_t moe_rows = tp.active() ? n / tp.size() : n;
    const int64_t batch = cp().active() ? in.tokens.dim(0) / 2 : in.tokens.dim(0);
    // Group token b * S + s is sequence b's position s (S = model.seq_len under cp, whose
    // layout numbers the tokens so, else the input's sequence length).
    const int64_t seq = cp().active() ? model_.seq_len : in.tokens.dim(1);
    ba.moe = b.moe->Forward(MoERowsIn(ba.norm2.y), moe_rows, in.training, in.step,
                            in.first_token, ctx, MoEGroupLayout(batch),
                            in.valid_rows >= 0 ? in.valid_rows * seq : -1, in.rng_values);
    ffn = MoERowsOut(ba.moe->y, x.shape());
  }
  // The norms' backward reads their inputs, not their outputs: the block lets the outputs go,
  // and each lives on only where a sublayer kept it (an f32 product input; under bf16
  // activation storage the products keep bf16 operands instead, dense/attention.h,
  // dense/mlp.h; in a MoE block the router's input when it is not jittered, and the shared
  // experts' input). So a jittered router's h goes (it keeps h * noise), as does h under tp
  // without sp (the layer keeps this rank's rows).
  ba.norm1.y = Tensor();
  ba.norm2.y = Tensor();
  // No backward reads the sublayers' outputs: they go (the attention's once the residual
  // sum has it, the MLP's or MoE's once the next norm sums it in), with the attention's and
  // the dense MLP's partial sums under tp.
  ba.attn.o.y = ba.attn.out = Tensor();
  if (ba.mlp) ba.mlp->fc2.y = ba.mlp->out = Tensor();
  if (ba.moe) ba.moe->y = Tensor();
  return {ba.x_mid, ffn};
}

Tensor Decoder::BackwardBlock(int64_t k, const BlockActivations& ba, Tensor dx,
                              std::span<const float> aux_scale) {
  Block& b = blocks_[k];
  DeviceContext* ctx = ctx_;
  Tensor dnorm2;
  if (b.mlp) {
    ScopedPhase phase(Phase::kDenseMlp);
    dnorm2 = b.mlp->Backward(*ba.mlp, dx, ctx);
  } else {
    Tensor dh = b.moe->Backward(ba.moe->acts, MoERowsOutBackward(dx), aux_scale, aux_scale, ctx);
    dnorm2 = MoERowsInBackward(dh, dx.shape());
  }
  Tensor dmid = dx;  // the residual path
  Tensor dnorm1;
  {
    ScopedPhase phase(Phase::kNorms);
    b.norm2.BackwardInto(ba.norm2, dnorm2, dmid, ctx);  // dmid += the norm's dx
  }
  {
    ScopedPhase phase(Phase::kAttention);
    dnorm1 = b.attn.Backward(ba.attn, dmid, ctx);
  }
  dx = dmid;
  ScopedPhase phase(Phase::kNorms);
  b.norm1.BackwardInto(ba.norm1, dnorm1, dx, ctx);  // dx += the norm's dx
  return dx;
}

void Decoder::Backward(const DecoderInput& in, DecoderOutput& out,
                       const std::function<void(const PartId& part)>& on_done) {
  // The parts finish in BackwardParts' order (stage.h): the order the gradient sync and
  // the planner expect.
  const std::vector<parallel::PartId> order =
      BackwardParts({&parallel_.stage, 1}, model_.n_layers, model_.tie_embeddings);
  size_t finished = 0;
  auto done = [&](const PartId& part) {
    SY_CHECK(finished < order.size() && order[finished] == part)
        << "Decoder::Backward finished part " << part.Name() << " out of BackwardParts' order";
    ++finished;
    if (on_done) on_done(part);
  };
  const Stage& stage = parallel_.stage;
  DecoderActivations& acts = out.acts;
  const dense::TensorParallel tp = this->tp();
  DeviceContext* ctx = ctx_;
  const int64_t layers = static_cast<int64_t>(blocks_.size());
  const PartId before_layers = stage.embedding ? PartId::Embed() : PartId();
  Tensor dx;  // the gradient of the residual stream after the current layer
  if (stage.head) {
    SY_CHECK(acts.dlogits.defined() || acts.head_chunk > 0) << "Backward needs a training Forward";
    AcquireForBackward(HeadPart(), PartId::NormF());
    ScopedPhase phase(Phase::kEmbeddingHeadLoss);
    Tensor dhidden = BackwardHead(in, acts);  // (N, d): this rank's vocabulary's contribution
    if (head_) done(PartId::Head());
    Release(HeadPart());
    dhidden = dense::EnterTensorParallelBackward(tp, dhidden, ctx);
    AcquireForBackward(PartId::NormF(), layers > 0 ? LayerPart(layers - 1) : before_layers);
    dx = norm_f_->Backward(acts.norm_f, dhidden.Reshape(acts.norm_f.y.shape()), ctx);
    Release(PartId::NormF());
    done(PartId::NormF());
    // A tied head without the embedding on this stage: its table's gradient is final here.
    if (!stage.embedding && embed_) done(PartId::Embed());
  } else {
    SY_CHECK(out.hidden.defined() && out.grad_hidden.defined() &&
             out.grad_hidden.shape() == out.hidden.shape())
        << "stage " << stage.Describe(model_.n_layers)
        << ": Backward needs the gradient of its output (DecoderOutput::grad_hidden) "
        << ShapeString(out.hidden.shape()) << ", got " << out.grad_hidden.DebugString();
    dx = out.grad_hidden.Clone(ctx);  // accumulated into below; the caller's stays intact
  }
  const float aux_scale[1] = {in.aux_grad_scale};
  for (int64_t i = layers - 1; i >= 0; --i) {
    AcquireForBackward(LayerPart(i), i > 0 ? LayerPart(i - 1) : before_layers);
    const BlockActivations& kept = acts.blocks[i];
    BlockActivations again;  // full recompute: the block's forward once more, from its input
    if (kept.recompute) {
      ForwardBlock(i, ResidualStream{kept.x_in}, in, dense::CoreAttention::kKeep, again);
    }
    dx = BackwardBlock(i, again.x_in.defined() ? again : kept, dx, aux_scale);
    Release(LayerPart(i));
    done(LayerPart(i));
  }
  if (!stage.embedding) {
    out.grad_input = dx;
    return;
  }
  AcquireForBackward(PartId::Embed(), PartId());
  ScopedPhase phase(Phase::kEmbeddingHeadLoss);
  embed_->Backward(acts.embed, dx, ctx);
  Release(PartId::Embed());
  done(PartId::Embed());
}

}  // namespace switchyard::model
