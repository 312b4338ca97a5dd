// The attention block of the decoder (MODEL.md section 1), x (B, S, d) -> y (B, S, d):
//   q = x Wq (+ bq)  (B, S, Hq * hd)      k = x Wk (+ bk), v = x Wv (+ bv)  (B, S, Hkv * hd)
//   q, k <- RoPE(q), RoPE(k)               when rope (kernels/rope.h, positions 0..S-1)
//   a = causal GQA attention(q, k, v)      (B, S, Hq, hd)  (kernels/attention.h)
//   y = a Wo (+ bo)                        Wo (Hq * hd, d)
// with Hq = n_heads, Hkv = n_kv_heads (default n_heads), hd = explicit_head_dim or d / n_heads,
// scale 1/sqrt(hd). Hq * hd need not be d (Qwen3, GPT-OSS: wider or narrower than the model).
// Four separate Linear projections ("q", "k", "v", "o"), as Llama stores them, so that a
// tensor-parallel split by heads slices each one on its own.
//
// Tensor parallelism (options.tp, Megatron-LM): q, k and v are column-parallel and o is
// row-parallel, so rank r computes the heads [r*Hq/tp, (r+1)*Hq/tp) and their kv heads
// [r*Hkv/tp, ...). When tp does not divide Hkv (grouped-query attention with few kv heads,
// tp a multiple of Hkv), the kv heads are replicated as in Megatron-LM: every rank holds
// the whole Wk and Wv (their gradients summed over tp), projects all kv heads and keeps the
// one its query heads use, kv head r*Hkv/tp. The block enters and leaves the
// tensor-parallel region once (dense/tp_block.h). With sequence parallelism x and y are this rank's rows
// of the (B*S, d) token matrix, and seq_len gives S to shape the gathered rows.
//
// Context parallelism (options.cp, engine/parallel/context_parallel.h): x holds this rank's two chunks
// of every sequence, (2B, S/(2c), d); RoPE rotates each chunk by its global positions and
// the core attention is dense/ring_attention.h's, the keys and values (kv heads only)
// passed around the cp ring. The projections are per token and unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/parallel/context_parallel.h"
#include "dense/linear.h"
#include "dense/tp_block.h"
#include "dense/parameter.h"
#include "engine/core/device_context.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"

namespace switchyard::dense {

struct AttentionOptions {
  int64_t d_model = 0;     // d; required, a multiple of n_heads unless explicit_head_dim
  int64_t n_heads = 0;     // Hq; required
  int64_t n_kv_heads = 0;  // Hkv; 0 means n_heads; must divide n_heads
  int64_t explicit_head_dim = 0;  // hd when > 0; 0 means d_model / n_heads
  bool bias = false;       // biases on the four projections
  bool rope = false;       // rotary positions on q and k (position = rope)
  float rope_base = 10000.0f;
  Device device = Device::Cpu();
  TensorParallel tp;     // none by default
  int64_t seq_len = 0;   // S of x's rows; required with tp.sequence_parallel (the local
                         // S/(2c) under cp)
  parallel::ContextParallel cp;    // none by default; x (2B, S/(2c), d) in cp's local layout

  int64_t local_heads() const { return n_heads / tp.size(); }
  // Whether every tp rank holds all kv heads (tp does not divide them).
  bool kv_replicated() const { return tp.active() && kv_heads() % tp.size() != 0; }
  int64_t local_kv_heads() const { return kv_replicated() ? 1 : kv_heads() / tp.size(); }

  int64_t head_dim() const {
    return explicit_head_dim > 0 ? explicit_head_dim : n_heads > 0 ? d_model / n_heads : 0;
  }
  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  // Names the field and the value it rejects ("attention.n_kv_heads=3 does not divide
  // attention.n_heads=4").
  Status Validate() const;
};

// What Forward keeps of the core attention, a = softmax(q k^T / sqrt(hd)) v: kKeep keeps a
// (o's input, (B, S, Hq * hd)) and lse (B, Hq, S); kRecompute drops both and Backward
// recomputes them from the kept q, k and v with the same kernel, bit for bit (Megatron-LM's
// selective recompute of "core attention", Korthikanti et al. 2022 section 5). The (S, S)
// probabilities are never kept either way: kernels/attention.h recomputes them from lse.
enum class CoreAttention { kKeep, kRecompute };

// What Backward needs from one Forward.
// Under bf16 activation storage (kernels/activation_storage.h) q, k and v keep one bf16
// operand of x (converted once for the three products) and x itself is not kept; o keeps
// the attention output o.x as its bf16 operand too, which the core attention's backward
// reads back as f32 where it reads it (delta = rowsum(da * o.x): the fused and ring paths).
struct AttentionActivations {
  Tensor x;                   // the block's input as given (this rank's rows under sp);
                              // undefined under bf16 activation storage
  Shape x_shape;              // x's shape (the shape of Backward's dx)
  LinearActivations q, k, v;  // q.x = k.x = v.x = x (B, S, d); q.y (B, S, Hq * hd) and
                              // k.y (B, S, Hkv * hd) hold q and k AFTER RoPE (rotated in place)
  Tensor k_heads, v_heads;    // (B, S, local kv heads * hd) what attention read (k after
                              // RoPE); k.y / v.y themselves unless the kv heads are replicated.
                              // Where the core's output is bf16 (CoreOutputInBf16) q.y,
                              // k_heads and v_heads are their bf16 roundings, and k.y / v.y
                              // are k_heads / v_heads (the f32 projections let go)
  Tensor lse;                 // (B, Hq, S) from kernels::AttentionForward; undefined
                              // under CoreAttention::kRecompute
  LinearActivations o;        // o.x the attention output (B, S, Hq * hd) (undefined under
                              // CoreAttention::kRecompute), o.y = y (B, S, d)

  Tensor out;                 // the block's output y (B, S, d), or this rank's rows under sp

  const Tensor& y() const { return out; }
};

// Whether the core attention writes its output in bf16 (the kernel rounds it as it stores
// it: o's operand, kept for o's weight gradient and read for delta): under bf16 activation
// storage and bf16 products, without cp (the ring merges f32 blocks), on the fused path
// (kernels::FlashAttentionSupports(head_dim)). Attention and the dry-run's activation model
// both ask this.
bool CoreOutputInBf16(bool bf16_storage, bool bf16_products, bool cp, int64_t head_dim);

class Attention {
 public:
  // Projections allocated and zeroed. Checks Validate().
  explicit Attention(const AttentionOptions& options, DeviceContext* ctx = nullptr);
  // Each projection from Linear::Init under name + ".q" (".k", ".v", ".o"): weights
  // N(0, std^2), the output projection N(0, out_std^2) (GPT-2 scales it by 1/sqrt(2 L)),
  // biases zero.
  static Attention Init(const AttentionOptions& options, uint64_t seed, const std::string& name,
                        float std = 0.02f, float out_std = 0.02f, DeviceContext* ctx = nullptr);

  Attention(Attention&&) = default;
  Attention& operator=(Attention&&) = default;

  // x (B, S, d) -> acts.y() (B, S, d); under sequence parallelism x and y are this rank's
  // rows (B*S/tp, d). core: whether acts keep the core attention's output and lse.
  AttentionActivations Forward(const Tensor& x, DeviceContext* ctx = nullptr,
                               CoreAttention core = CoreAttention::kKeep) const;
  // dy (B, S, d). Adds into every projection's gradients; returns dx (B, S, d). Recomputes
  // the core attention first when Forward dropped it.
  Tensor Backward(const AttentionActivations& acts, const Tensor& dy, DeviceContext* ctx = nullptr);
  void ZeroGrad(DeviceContext* ctx = nullptr);

  const AttentionOptions& options() const { return options_; }
  Linear& q() { return q_; }
  Linear& k() { return k_; }
  Linear& v() { return v_; }
  Linear& o() { return o_; }
  // "q.weight", ("q.bias",) "k.weight", ..., "o.weight" (, "o.bias").
  std::vector<Parameter> Parameters() const;

 private:
  Attention(const AttentionOptions& options, Linear q, Linear k, Linear v, Linear o);

  AttentionOptions options_;
  Linear q_, k_, v_, o_;
};

}  // namespace switchyard::dense
