// Attention (dense/attention.h): projections through dense::Linear, then kernels/rope.h and
// kernels/attention.h on the (B, S, H, hd) views of the projections (no copies).
#include "dense/attention.h"

#include <vector>

#include "kernels/permute.h"

#include <utility>

#include "dense/ring_attention.h"
#include "kernels/attention.h"
#include "kernels/flash_attention.h"
#include "kernels/rope.h"

namespace switchyard::dense {
namespace {

// One projection's options; checks `o` first, since the shapes are computed from it. q, k
// and v are column-parallel, o row-parallel.
LinearOptions Projection(const AttentionOptions& o, int64_t in, int64_t out,
                         LinearSplit split = LinearSplit::kColumn) {
  SY_CHECK_OK(o.Validate());
  return LinearOptions{.in = in, .out = out, .bias = o.bias, .device = o.device,
                       .split = o.tp.active() ? split : LinearSplit::kNone,
                       .tp_rank = o.tp.rank(), .tp_size = o.tp.size()};
}

// (B, S, H * hd) as (B, S, H, hd).
Tensor Heads(const Tensor& t, int64_t heads, int64_t hd) {
  return t.Reshape({t.dim(0), t.dim(1), heads, hd});
}

// Head `head` of all (B, S, H * hd) as a new (B, S, hd) tensor.
Tensor SelectHead(const Tensor& all, int64_t heads, int64_t head, int64_t hd, DeviceContext* ctx) {
  const int64_t rows = all.numel() / (heads * hd);
  std::vector<int64_t> index(rows);
  for (int64_t i = 0; i < rows; ++i) index[i] = i * heads + head;
  Tensor idx = Tensor::FromVector(index, {rows});
  if (!all.device().is_cpu()) idx = idx.To(all.device(), ctx);
  Tensor out = Tensor::Empty({all.dim(0), all.dim(1), hd}, DType::kF32, all.device());
  Tensor out_rows = out.Reshape({rows, hd});
  kernels::GatherRows(all.Reshape({rows * heads, hd}), idx, out_rows, ctx);
  return out;
}

// The inverse: one head's (B, S, hd) placed at `head` of a (B, S, H * hd) of zeros.
Tensor ExpandHead(const Tensor& one, int64_t heads, int64_t head, int64_t hd, DeviceContext* ctx) {
  const int64_t rows = one.numel() / hd;
  // Source rows: the head's rows, then one zero row every other head reads.
  Tensor src = Tensor::Zeros({rows + 1, hd}, DType::kF32, one.device(), ctx);
  src.Slice(0, rows).CopyFrom(one.Reshape({rows, hd}), ctx);
  std::vector<int64_t> index(rows * heads);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t h = 0; h < heads; ++h) index[i * heads + h] = h == head ? i : rows;
  Tensor idx = Tensor::FromVector(index, {rows * heads});
  if (!one.device().is_cpu()) idx = idx.To(one.device(), ctx);
  Tensor out = Tensor::Empty({one.dim(0), one.dim(1), heads * hd}, DType::kF32, one.device());
  Tensor out_rows = out.Reshape({rows * heads, hd});
  kernels::GatherRows(src, idx, out_rows, ctx);
  return out;
}

// k and v are column-parallel, or whole on every rank when the kv heads are replicated.
LinearSplit KvSplit(const AttentionOptions& o) {
  return o.kv_replicated() ? LinearSplit::kNone : LinearSplit::kColumn;
}

// RoPE of t (B, S, H, hd) in place (backward: the opposite rotation): positions 0..S-1,
// or under cp each chunk's global positions.
void Rotate(const AttentionOptions& o, Tensor& t, bool backward, DeviceContext* ctx) {
  auto rotate = [&](Tensor& rows, int64_t first_position) {
    if (backward) {
      kernels::RopeBackward(rows, rows, o.rope_base, first_position, ctx);
    } else {
      kernels::RopeForward(rows, rows, o.rope_base, first_position, ctx);
    }
  };
  if (!o.cp.active()) return rotate(t, 0);
  const int64_t b = t.dim(0) / 2;
  for (int h = 0; h < 2; ++h) {
    Tensor rows = t.Slice(h * b, (h + 1) * b);
    rotate(rows, o.cp.chunk_start(h));
  }
}

// The core attention a = softmax(q k^T / sqrt(hd)) v with its lse: on this rank, or around
// the cp ring.
void CoreForward(const AttentionOptions& o, const Tensor& q, const Tensor& k, const Tensor& v,
                 Tensor& a, Tensor& lse, DeviceContext* ctx) {
  if (o.cp.active()) return RingAttentionForward(q, k, v, a, lse, *o.cp.comm, ctx);
  kernels::AttentionForward(q, k, v, a, lse, ctx);
}

// The element type of the core attention's output a (CoreOutputInBf16).
DType CoreOutputDType(const AttentionOptions& o, int64_t head_dim, const DeviceContext* ctx) {
  const bool bf16_products = ctx != nullptr && ctx->matmul_dtype() == DType::kBF16;
  return CoreOutputInBf16(kernels::StoresBf16(ctx), bf16_products, o.cp.active(), head_dim)
             ? DType::kBF16
             : DType::kF32;
}

// Whether q, k and v are kept in bf16, the operands the fused kernels read: where the core's
// output is bf16 (CoreOutputInBf16; the dry-run's activation model asks the same).
bool KeepsQkvInBf16(const AttentionOptions& o, int64_t head_dim, const DeviceContext* ctx) {
  return CoreOutputDType(o, head_dim, ctx) == DType::kBF16;
}

// `a` is the kept output: f32, or under bf16 activation storage bf16 (written so, or o's
// kept operand), which the paths that read it (for delta) read as f32.
void CoreBackward(const AttentionOptions& o, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& a, const Tensor& lse, const Tensor& da, Tensor& dq, Tensor& dk,
                  Tensor& dv, DeviceContext* ctx) {
  if (o.cp.active()) {
    return RingAttentionBackward(q, k, v, kernels::KeptAsF32(a, ctx), lse, da, dq, dk, dv,
                                 *o.cp.comm, ctx);
  }
  if (kernels::UseFlashAttention(ctx, q.dim(3))) {
    // The fused bf16 kernel takes delta = rowsum(da * a) from the kept output (FlashAttention-2)
    // rather than recomputing the forward for it.
    Tensor delta = Tensor::Empty(lse.shape(), DType::kF32, q.device());
    kernels::AttentionBackwardDelta(a, da, delta, ctx);
    return kernels::AttentionBackward(q, k, v, lse, da, dq, dk, dv, ctx,
                                      kernels::AttentionMask::kCausal, delta);
  }
  kernels::AttentionBackward(q, k, v, lse, da, dq, dk, dv, ctx);
}

}  // namespace

bool CoreOutputInBf16(bool bf16_storage, bool bf16_products, bool cp, int64_t head_dim) {
  return bf16_storage && bf16_products && !cp && kernels::FlashAttentionSupports(head_dim);
}

Status AttentionOptions::Validate() const {
  if (d_model <= 0) return InvalidArgument("attention.d_model=", d_model, " must be > 0");
  if (n_heads <= 0) return InvalidArgument("attention.n_heads=", n_heads, " must be > 0");
  if (explicit_head_dim < 0) {
    return InvalidArgument("attention.explicit_head_dim=", explicit_head_dim, " must be >= 0");
  }
  if (explicit_head_dim == 0 && d_model % n_heads != 0) {
    return InvalidArgument("attention.n_heads=", n_heads,
                           " does not divide attention.d_model=", d_model);
  }
  if (n_kv_heads < 0) return InvalidArgument("attention.n_kv_heads=", n_kv_heads, " must be >= 0");
  if (n_heads % kv_heads() != 0) {
    return InvalidArgument("attention.n_kv_heads=", n_kv_heads,
                           " does not divide attention.n_heads=", n_heads);
  }
  if (rope && head_dim() % 2 != 0) {
    return InvalidArgument("attention.rope needs an even head_dim, got ", head_dim());
  }
  const int tp_size = tp.size();
  if (n_heads % tp_size != 0) {
    return InvalidArgument("parallel.tp=", tp_size, " does not divide model.n_heads=", n_heads);
  }
  if (kv_heads() % tp_size != 0 && tp_size % kv_heads() != 0) {
    return InvalidArgument("parallel.tp=", tp_size, " and model.n_kv_heads=", kv_heads(),
                           ": tp must divide the kv heads or be a multiple of them");
  }
  if (tp.active() && tp.sequence_parallel && seq_len <= 0) {
    return InvalidArgument("attention.seq_len=", seq_len, " must be > 0 with sequence parallelism");
  }
  if (rope && !(rope_base > 0.0f)) {
    return InvalidArgument("attention.rope_base=", rope_base, " must be > 0");
  }
  return cp.Validate();
}

Attention::Attention(const AttentionOptions& options, DeviceContext* ctx)
    : Attention(
          options,
          Linear(Projection(options, options.d_model, options.n_heads * options.head_dim()), ctx),
          Linear(Projection(options, options.d_model, options.kv_heads() * options.head_dim(),
                            KvSplit(options)),
                 ctx),
          Linear(Projection(options, options.d_model, options.kv_heads() * options.head_dim(),
                            KvSplit(options)),
                 ctx),
          Linear(Projection(options, options.n_heads * options.head_dim(), options.d_model,
                            LinearSplit::kRow),
                 ctx)) {
}

Attention::Attention(const AttentionOptions& options, Linear q, Linear k, Linear v, Linear o)
    : options_(options), q_(std::move(q)), k_(std::move(k)), v_(std::move(v)), o_(std::move(o)) {}

Attention Attention::Init(const AttentionOptions& options, uint64_t seed, const std::string& name,
                          float std, float out_std, DeviceContext* ctx) {
  const int64_t d = options.d_model, hd = options.head_dim();
  return Attention(
      options,
      Linear::Init(Projection(options, d, options.n_heads * hd), seed, name + ".q", std, ctx),
      Linear::Init(Projection(options, d, options.kv_heads() * hd, KvSplit(options)), seed,
                   name + ".k", std, ctx),
      Linear::Init(Projection(options, d, options.kv_heads() * hd, KvSplit(options)), seed,
                   name + ".v", std, ctx),
      Linear::Init(Projection(options, options.n_heads * hd, d, LinearSplit::kRow), seed,
                   name + ".o", out_std, ctx));
}

AttentionActivations Attention::Forward(const Tensor& x_in, DeviceContext* ctx,
                                        CoreAttention core) const {
  const TensorParallel& tp = options_.tp;
  const bool sp = tp.active() && tp.sequence_parallel;
  SY_CHECK((sp ? x_in.ndim() == 2 : x_in.ndim() == 3) && x_in.dim(-1) == options_.d_model)
      << "Attention::Forward: x " << ShapeString(x_in.shape()) << ", expected "
      << (sp ? "(B*S/tp, " : "(B, S, ") << options_.d_model << ")";
  AttentionActivations acts;
  // Under bf16 activation storage the projections keep x's operand instead.
  if (!kernels::StoresBf16(ctx)) acts.x = x_in;
  acts.x_shape = x_in.shape();
  Tensor x = EnterTensorParallel(tp, x_in, ctx);
  if (sp) x = x.Reshape({x.dim(0) / options_.seq_len, options_.seq_len, options_.d_model});
  const int64_t b = x.dim(0), s = x.dim(1), hq = options_.local_heads(),
                hkv = options_.local_kv_heads(), hd = options_.head_dim();
  // q, k and v read x: under bf16 activation storage it is converted once for the three,
  // which keep that operand.
  const Tensor x_mm = kernels::KeptOperand(x, ctx);
  // Where the fused kernels read q, k and v in bf16 (below), the projections write them so,
  // unless RoPE (q, k) or a kv head's selection (k, v) reads them first in f32.
  const bool bf16_qkv = KeepsQkvInBf16(options_, hd, ctx);
  const auto y_dtype = [&](bool f32_reader) {
    return bf16_qkv && !f32_reader ? DType::kBF16 : DType::kF32;
  };
  acts.q = q_.Forward(x_mm, ctx, true, kernels::KeepInput::kOperand, y_dtype(options_.rope));
  acts.k = k_.Forward(x_mm, ctx, true, kernels::KeepInput::kOperand,
                      y_dtype(options_.rope || options_.kv_replicated()));
  acts.v = v_.Forward(x_mm, ctx, true, kernels::KeepInput::kOperand,
                      y_dtype(options_.kv_replicated()));
  acts.k_heads = acts.k.y;
  acts.v_heads = acts.v.y;
  if (options_.kv_replicated()) {
    const int64_t all = options_.kv_heads(), head = tp.rank() * all / tp.size();
    acts.k_heads = SelectHead(acts.k.y, all, head, hd, ctx);
    acts.v_heads = SelectHead(acts.v.y, all, head, hd, ctx);
  }
  Tensor q = Heads(acts.q.y, hq, hd), k = Heads(acts.k_heads, hkv, hd),
         v = Heads(acts.v_heads, hkv, hd);
  if (options_.rope) {
    Rotate(options_, q, /*backward=*/false, ctx);
    Rotate(options_, k, /*backward=*/false, ctx);
  }
  if (bf16_qkv) {
    // The fused kernels read q, k and v as bf16 operands: kept so (the same bits as their f32
    // values rounded, kernels/flash_attention.h), the f32 outputs (of RoPE, of a kv head's
    // selection) go; the projections' bf16 outputs are kept as they are.
    acts.q.y = kernels::KeepRounded(acts.q.y, ctx);
    acts.k_heads = kernels::KeepRounded(acts.k_heads, ctx);
    acts.v_heads = kernels::KeepRounded(acts.v_heads, ctx);
    acts.k.y = acts.k_heads;
    acts.v.y = acts.v_heads;
    q = Heads(acts.q.y, hq, hd);
    k = Heads(acts.k_heads, hkv, hd);
    v = Heads(acts.v_heads, hkv, hd);
  }
  Tensor a = Tensor::Empty({b, s, hq, hd}, CoreOutputDType(options_, hd, ctx), x.device());
  acts.lse = Tensor::Empty({b, hq, s}, DType::kF32, x.device());
  CoreForward(options_, q, k, v, a, acts.lse, ctx);
  // o keeps its input as its product's operand (bf16 under bf16 activation storage: a itself
  // on the fused path, CoreOutputDType); the core attention's backward reads it too (delta,
  // on the fused and ring paths), as f32.
  acts.o = o_.Forward(a.Reshape({b, s, hq * hd}), ctx);
  if (core == CoreAttention::kRecompute) {
    acts.o.x = Tensor();  // a and lse go with the last references to them
    acts.lse = Tensor();
  }
  // Under sequence parallelism the reduce-scatter splits the micro-batch's B * S rows, as
  // the embedding's does (a rank's rows may end inside a sequence when tp does not divide B).
  acts.out = LeaveTensorParallel(tp, sp ? acts.o.y.Reshape({b * s, options_.d_model}) : acts.o.y, ctx);
  return acts;
}

Tensor Attention::Backward(const AttentionActivations& acts, const Tensor& dy_in,
                           DeviceContext* ctx) {
  const TensorParallel& tp = options_.tp;
  const Tensor& x = acts.q.x;
  const int64_t b = x.dim(0), s = x.dim(1), hq = options_.local_heads(),
                hkv = options_.local_kv_heads(), hd = options_.head_dim();
  // Selective recompute: the core attention again from q and k (after RoPE) and v, the
  // inputs Forward gave kernels::AttentionForward.
  LinearActivations o = acts.o;
  Tensor lse = acts.lse;
  if (!lse.defined()) {
    Tensor a = Tensor::Empty({b, s, hq, hd}, CoreOutputDType(options_, hd, ctx), x.device());
    lse = Tensor::Empty({b, hq, s}, DType::kF32, x.device());
    CoreForward(options_, Heads(acts.q.y, hq, hd), Heads(acts.k_heads, hkv, hd),
                Heads(acts.v_heads, hkv, hd), a, lse, ctx);
    o.x = a.Reshape({b, s, hq * hd});
  }
  // o.y's shape (the decoder lets o.y itself go once the residual has it).
  const Tensor dy = LeaveTensorParallelBackward(tp, dy_in, ctx).Reshape({b, s, options_.d_model});
  const Tensor da = o_.Backward(o, dy, ctx);  // (B, S, Hq * hd)
  Tensor dq = Tensor::Empty({b, s, hq * hd}, DType::kF32, x.device());
  Tensor dk = Tensor::Empty({b, s, hkv * hd}, DType::kF32, x.device());
  Tensor dv = Tensor::Empty({b, s, hkv * hd}, DType::kF32, x.device());
  Tensor dq4 = Heads(dq, hq, hd), dk4 = Heads(dk, hkv, hd), dv4 = Heads(dv, hkv, hd);
  CoreBackward(options_, Heads(acts.q.y, hq, hd), Heads(acts.k_heads, hkv, hd),
               Heads(acts.v_heads, hkv, hd), Heads(o.x, hq, hd), lse, Heads(da, hq, hd), dq4,
               dk4, dv4, ctx);
  if (options_.rope) {
    Rotate(options_, dq4, /*backward=*/true, ctx);
    Rotate(options_, dk4, /*backward=*/true, ctx);
  }
  if (options_.kv_replicated()) {
    // This rank's kv head's gradient, zero for the others: summed over tp, the whole one.
    const int64_t all = options_.kv_heads(), head = tp.rank() * all / tp.size();
    dk = ExpandHead(dk, all, head, hd, ctx);
    dv = ExpandHead(dv, all, head, hd, ctx);
  }
  // x feeds all three projections: dx = dq Wq^T + dk Wk^T + dv Wv^T.
  Tensor dx = Tensor::Empty(x.shape(), DType::kF32, x.device());
  q_.BackwardInto(acts.q, dq, dx, 0.0f, ctx);
  k_.BackwardInto(acts.k, dk, dx, 1.0f, ctx);
  v_.BackwardInto(acts.v, dv, dx, 1.0f, ctx);
  return EnterTensorParallelBackward(tp, dx.Reshape({x.numel() / options_.d_model, options_.d_model}), ctx)
      .Reshape(acts.x_shape);
}

void Attention::ZeroGrad(DeviceContext* ctx) {
  for (Linear* l : {&q_, &k_, &v_, &o_}) l->ZeroGrad(ctx);
}

std::vector<Parameter> Attention::Parameters() const {
  std::vector<Parameter> out;
  AppendPrefixed("q", q_.Parameters(), out);
  for (const char* name : {"k", "v"}) {
    std::vector<Parameter> ps = (name[0] == 'k' ? k_ : v_).Parameters();
    if (options_.kv_replicated()) {
      for (Parameter& p : ps) p.ReplicatedOver(dist::Axis::kTp, /*grad_summed=*/true);
    }
    AppendPrefixed(name, std::move(ps), out);
  }
  AppendPrefixed("o", o_.Parameters(), out);
  return out;
}

}  // namespace switchyard::dense
