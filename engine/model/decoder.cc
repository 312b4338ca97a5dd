#include "engine/model/decoder.h"

#include <cmath>
#include <cstring>

#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/random.h"

namespace switchyard::model {
namespace {

// a += b, elementwise over equal numbers of elements.
void AddInto(Tensor& a, const Tensor& b, DeviceContext* ctx) {
  SY_CHECK_EQ(a.numel(), b.numel());
  kernels::Axpy(1.0f, b.Reshape(a.shape()), a, ctx);
}

// A new tensor a + b.
Tensor Sum(const Tensor& a, const Tensor& b, DeviceContext* ctx) {
  Tensor out = Tensor::Empty(a.shape(), a.dtype(), a.device());
  kernels::Add(a, b.Reshape(a.shape()), out, ctx);
  return out;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// AdamW decays matrices (embeddings, projections, expert weights), not biases or norms.
bool Decays(const std::string& name, const Tensor& value) {
  return value.ndim() >= 2 && !EndsWith(name, ".b1") && !EndsWith(name, ".b2") &&
         !EndsWith(name, "bias");
}

}  // namespace

StatusOr<std::unique_ptr<Decoder>> Decoder::Create(const ModelConfig& model,
                                                   const moe::MoEConfig& moe_in, uint64_t seed,
                                                   dist::Communicator* ep,
                                                   DeviceContext* ctx) {
  SY_RETURN_IF_ERROR(model.Validate());
  moe::MoEConfig moe = moe_in;
  moe.d_model = model.d_model;
  SY_RETURN_IF_ERROR(moe.Validate());
  SY_RETURN_IF_ERROR(moe.ExpertsPerRank(ep->size()).status());
  SY_ASSIGN_OR_RETURN(dense::NormKind norm_kind, dense::ParseNormKind(model.norm));
  SY_ASSIGN_OR_RETURN(dense::Activation activation, dense::ParseActivation(model.activation));

  std::unique_ptr<Decoder> dec(new Decoder(model, moe, ctx));
  const Device device = ctx ? ctx->device() : Device::Cpu();
  const float std = model.init_std;
  const float out_std =
      model.scaled_init ? std / std::sqrt(2.0f * static_cast<float>(model.n_layers)) : std;
  dense::EmbeddingOptions eo{.vocab_size = model.vocab_size, .d_model = model.d_model,
                             .max_positions = model.position == "learned" ? model.seq_len : 0,
                             .device = device};
  dec->embed_.emplace(dense::Embedding::Init(eo, seed, "embed", std, ctx));
  dense::NormOptions no{.kind = norm_kind, .dim = model.d_model, .eps = model.norm_eps,
                        .device = device};
  dense::AttentionOptions ao{.d_model = model.d_model, .n_heads = model.n_heads,
                             .n_kv_heads = model.n_kv_heads, .bias = model.bias,
                             .rope = model.position == "rope", .rope_base = model.rope_base,
                             .device = device};
  dense::MlpOptions mo{.d_model = model.d_model, .d_hidden = model.ff_hidden(),
                       .activation = activation, .bias = model.bias, .device = device};
  for (int64_t i = 0; i < model.n_layers; ++i) {
    const std::string name = StrCat("layers.", i);
    Block block{dense::Norm(no, ctx), dense::Norm(no, ctx),
                dense::Attention::Init(ao, seed, name + ".attn", std, out_std, ctx), std::nullopt,
                std::nullopt};
    if (moe.IsMoeLayer(i)) {
      block.moe.emplace(moe::MoELayer::Init(moe, i, ep, seed, std, ctx));
      if (out_std != std) {
        // Scaled residual init of the expert output projections: the same draws as Init,
        // with the smaller std (keys as in moe/experts.h).
        moe::Experts& ex = block.moe->experts();
        Tensor w2 = ex.w2();
        kernels::FillNormal(w2, {seed, StreamId(name + ".moe.experts.w2")},
                            ex.options().first * ex.options().d_hidden * model.d_model, 0.0f,
                            out_std, ctx);
        if (moe::DenseMlp* shared = block.moe->shared()) {
          Tensor sw2 = shared->experts().w2();
          kernels::FillNormal(sw2, {seed, StreamId(name + ".moe.shared.w2")}, 0, 0.0f, out_std,
                              ctx);
        }
      }
      dec->moe_ids_.push_back(i);
    } else {
      block.mlp.emplace(dense::Mlp::Init(mo, seed, name + ".mlp", std, out_std, ctx));
    }
    dec->blocks_.push_back(std::move(block));
  }
  dec->norm_f_.emplace(no, ctx);
  if (!model.tie_embeddings) {
    dense::LinearOptions lo{.in = model.d_model, .out = model.vocab_size, .bias = false,
                            .device = device};
    dec->head_.emplace(dense::Linear::Init(lo, seed, "head", std, ctx));
  }
  dec->Register();
  return dec;
}

void Decoder::Register() {
  auto add_dense = [&](const std::string& prefix, const std::vector<dense::NamedParameter>& ps) {
    for (const auto& p : ps) {
      const std::string name = prefix + "." + p.name;
      registry_.Add({.name = name, .global_shape = p.value.shape(), .group = GradGroup::kDense,
                     .weight_decay = Decays(name, p.value), .value = p.value, .grad = p.grad});
    }
  };
  add_dense("embed", embed_->Parameters());
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Block& b = blocks_[i];
    const std::string name = StrCat("layers.", i);
    add_dense(name + ".norm1", b.norm1.Parameters());
    add_dense(name + ".attn", b.attn.Parameters());
    add_dense(name + ".norm2", b.norm2.Parameters());
    if (b.mlp) add_dense(name + ".mlp", b.mlp->Parameters());
    if (b.moe) {
      moe::MoELayer& m = *b.moe;
      registry_.Add({.name = name + ".moe.router.weight",
                     .global_shape = m.router_weight().shape(), .group = GradGroup::kDense,
                     .weight_decay = false, .value = m.router_weight(),
                     .grad = m.grad_router_weight()});
      for (const moe::NamedParameter& p : m.experts().Parameters()) {
        const std::string pname = name + ".moe.experts." + p.name;
        Shape global = p.value.shape();
        global[0] = moe_.num_experts;
        registry_.Add({.name = pname, .global_shape = global, .shard_dim = 0,
                       .shard_offset = m.first_expert(), .group = GradGroup::kExpert,
                       .weight_decay = Decays(pname, p.value), .value = p.value,
                       .grad = p.grad});
      }
      if (moe::DenseMlp* shared = m.shared()) {
        for (const moe::NamedParameter& p : shared->experts().Parameters()) {
          const std::string pname = name + ".moe.shared." + p.name;
          registry_.Add({.name = pname, .global_shape = p.value.shape(), .group = GradGroup::kDense,
                         .weight_decay = Decays(pname, p.value), .value = p.value, .grad = p.grad});
        }
      }
      if (m.expert_bias().defined()) {
        registry_.Add({.name = name + ".moe.expert_bias", .global_shape = m.expert_bias().shape(),
                       .group = GradGroup::kDense, .trainable = false, .weight_decay = false,
                       .value = m.expert_bias(), .grad = Tensor()});
      }
    }
  }
  add_dense("norm_f", norm_f_->Parameters());
  if (head_) add_dense("head", head_->Parameters());
}

std::vector<moe::MoELayer*> Decoder::moe_layers() {
  std::vector<moe::MoELayer*> out;
  for (Block& b : blocks_)
    if (b.moe) out.push_back(&*b.moe);
  return out;
}

DecoderOutput Decoder::Forward(const DecoderInput& in) {
  const int64_t batch = in.tokens.dim(0), seq = in.tokens.dim(1), d = model_.d_model;
  const int64_t n = batch * seq;
  SY_CHECK(in.tokens.dtype() == DType::kI32 && in.targets.shape() == in.tokens.shape())
      << "tokens " << in.tokens.DebugString() << ", targets " << in.targets.DebugString();
  SY_CHECK_LE(seq, model_.seq_len) << "sequence longer than model.seq_len";
  SY_CHECK(in.tokens.device() == device() && in.targets.device() == device())
      << "tokens on " << in.tokens.device() << ", targets on " << in.targets.device()
      << ": the decoder runs on " << device();
  DeviceContext* ctx = ctx_;
  DecoderOutput out;
  DecoderActivations& acts = out.acts;
  acts.embed = embed_->Forward(in.tokens, ctx);
  Tensor x = acts.embed.y;  // (B, S, d)
  for (Block& b : blocks_) {
    BlockActivations ba;
    ba.x_in = x;
    ba.norm1 = b.norm1.Forward(x, ctx);
    ba.attn = b.attn.Forward(ba.norm1.y, ctx);
    ba.x_mid = Sum(x, ba.attn.y(), ctx);
    ba.norm2 = b.norm2.Forward(ba.x_mid, ctx);
    Tensor ffn;
    if (b.mlp) {
      ba.mlp = b.mlp->Forward(ba.norm2.y, ctx);
      ffn = ba.mlp->y();
    } else {
      ba.moe = b.moe->Forward(ba.norm2.y.Reshape({n, d}), n, in.training, in.step, in.first_token,
                              ctx);
      ffn = ba.moe->y;
      out.aux_sum += ba.moe->stats.aux_sum;
      out.z_sum += ba.moe->stats.z_sum;
      out.moe_stats.push_back(ba.moe->stats);
    }
    x = Sum(ba.x_mid, ffn, ctx);
    acts.blocks.push_back(std::move(ba));
  }
  acts.norm_f = norm_f_->Forward(x, ctx);
  Tensor hidden = acts.norm_f.y.Reshape({n, d});
  Tensor logits;
  if (head_) {
    acts.head = head_->Forward(hidden, ctx);
    logits = acts.head->y;
  } else {
    logits = Tensor::Empty({n, model_.vocab_size}, DType::kF32, device());
    kernels::Gemm(hidden, false, embed_->wte(), true, logits, 1.0f, 0.0f, ctx);
  }
  Tensor targets = in.targets.Reshape({n});
  kernels::CrossEntropySums ce;
  if (in.training) {
    ce = kernels::CrossEntropyForwardBackward(logits, targets, logits, in.ce_grad_scale,
                                              kernels::kIgnoreIndex, ctx);
    acts.dlogits = logits;
  } else {
    ce = kernels::CrossEntropyForward(logits, targets, kernels::kIgnoreIndex, ctx);
  }
  out.ce_sum = ce.loss_sum;
  out.ce_count = ce.count;
  return out;
}

void Decoder::Backward(const DecoderInput& in, DecoderOutput& out,
                       const std::function<void(const std::string& prefix)>& on_done) {
  auto done = [&](const std::string& prefix) {
    if (on_done) on_done(prefix);
  };
  DecoderActivations& acts = out.acts;
  SY_CHECK(acts.dlogits.defined()) << "Backward needs a training Forward";
  const int64_t n = acts.dlogits.dim(0), d = model_.d_model;
  DeviceContext* ctx = ctx_;
  Tensor dhidden;
  if (head_) {
    dhidden = head_->Backward(*acts.head, acts.dlogits, ctx);
  } else {
    dhidden = Tensor::Empty({n, d}, DType::kF32, device());
    kernels::Gemm(acts.dlogits, false, embed_->wte(), false, dhidden, 1.0f, 0.0f, ctx);
    Tensor grad_wte = embed_->grad_wte();
    kernels::Gemm(acts.dlogits, true, acts.norm_f.y.Reshape({n, d}), false, grad_wte, 1.0f, 1.0f,
                  ctx);
  }
  if (head_) done("head");
  Tensor dx = norm_f_->Backward(acts.norm_f, dhidden.Reshape(acts.norm_f.y.shape()), ctx);
  done("norm_f");
  const float aux_scale[1] = {in.aux_grad_scale};
  for (int64_t i = static_cast<int64_t>(blocks_.size()) - 1; i >= 0; --i) {
    Block& b = blocks_[i];
    BlockActivations& ba = acts.blocks[i];
    Tensor dnorm2;
    if (b.mlp) {
      dnorm2 = b.mlp->Backward(*ba.mlp, dx, ctx);
    } else {
      dnorm2 = b.moe->Backward(ba.moe->acts, dx.Reshape({n, d}), aux_scale, aux_scale, ctx)
                   .Reshape(dx.shape());
    }
    Tensor dmid = dx;  // the residual path
    AddInto(dmid, b.norm2.Backward(ba.norm2, dnorm2, ctx), ctx);
    Tensor dnorm1 = b.attn.Backward(ba.attn, dmid, ctx);
    dx = dmid;
    AddInto(dx, b.norm1.Backward(ba.norm1, dnorm1, ctx), ctx);
    done(StrCat("layers.", i));
  }
  embed_->Backward(acts.embed, dx, ctx);
  done("embed");
}

}  // namespace switchyard::model
