#include "engine/plan/activation_memory.h"

#include <algorithm>

#include "dense/attention.h"
#include "engine/core/check.h"
#include "engine/model/param_table.h"
#include "engine/model/recompute.h"
#include "kernels/activation.h"
#include "moe/capacity.h"

namespace switchyard::plan {

using parallel::ActionKind;

namespace {

// The layout's sizes as the per-token figures use them.
struct Shape {
  double P, d, hd, hq, hkv;  // tp, d_model, head_dim, query and kv heads
  bool tp, sp;               // tensor parallel; sequence parallel (with tp)
  double rows;               // residual-stream rows per token on this rank
  double norm;               // a norm's y and statistics
  double cp;                 // context-parallel ranks
  double q, kv;              // q, and k and v, of this rank's heads
  double qkv_kept;           // what attention keeps of them (below)
  double stats;              // a norm's statistics per row (mean and rstd, or rstd)
  // runtime.activation_dtype=bf16 (MODEL.md "Activation storage"): the products' inputs
  // are kept as bf16 operands (without tp the norms write them: no f32 outputs, but a MoE
  // block's norm2's where the router or shared experts read it: MoENormKeepsOutput), the MLPs' and experts' pre-activations and hidden activations, and
  // the MoE combine's rows, in bf16: `half` (0.5) of an f32 element each; the activations'
  // and the combine's backward read them as they are kept.
  bool bf16 = false;
  double half = 1;
  // The core attention writes its output in bf16 (dense::CoreOutputInBf16), also when
  // selective recompute rebuilds it; the final norm writes the head's rows as its bf16
  // operand (model::NormsWriteBf16Operands).
  bool core_bf16 = false;
  bool norm_bf16 = false;
  // bf16 products (runtime.precision): the activations' backward writes the hidden layer's
  // gradients as the bf16 operands W1's (W3's) products read, beside the f32 dh it reads,
  // instead of in place over dh (HiddenGradients).
  bool grads16 = false;
};

Shape ShapeOf(const config::Config& c) {
  const model::ModelConfig& m = c.model;
  const config::ParallelConfig& p = c.parallel;
  Shape s;
  s.P = p.tp, s.d = m.d_model, s.hd = m.head_dim();
  s.hq = m.n_heads, s.hkv = m.kv_heads();
  s.tp = p.tp > 1, s.sp = s.tp && p.sequence_parallel;
  s.rows = s.sp ? 1.0 / s.P : 1.0;
  const double stats = m.norm == dense::NormKind::kLayerNorm ? 2 : 1;  // mean and rstd, or rstd
  s.norm = (s.d + stats) * s.rows;
  s.stats = stats;
  s.bf16 = c.runtime.activation_dtype == config::ActivationDtype::kBf16;
  s.half = s.bf16 ? 0.5 : 1.0;
  s.cp = p.cp;
  s.grads16 = c.runtime.bf16_products();
  // bf16 storage needs bf16 products (config::RuntimeConfig::Validate).
  s.core_bf16 = dense::CoreOutputInBf16(s.bf16, s.bf16, p.cp > 1, s.hd);
  s.norm_bf16 = model::NormsWriteBf16Operands(s.bf16, s.tp);
  // q, k and v of this rank's heads (k and v whole, plus this rank's head, when tp does not
  // divide the kv heads).
  const bool kv_whole = model::KvReplicated(m, p.tp);
  s.q = s.hq * s.hd / s.P;
  s.kv = kv_whole ? 2 * s.hkv * s.hd + 2 * s.hd : 2 * s.hkv * s.hd / s.P;
  // Where the core attention's output is bf16, q, k and v are kept as the fused kernels' bf16
  // operands too (k and v: this rank's heads only, also when the kv heads are replicated).
  s.qkv_kept = s.core_bf16 ? 0.5 * (s.q + (kv_whole ? 2 * s.hd : s.kv)) : s.q + s.kv;
  return s;
}

// What one layer keeps and its Backward's scratch beyond that, per token.
struct Piece {
  double kept = 0, backward = 0;
};

// Attention (dense/attention.h): the gathered input under sp; q, k and v; the log-sum-exp
// (B, Hq, S); the attention output o.x (its projection o.y, and the output after the tp
// reduction, go once the residual has them: Decoder::ForwardBlock). Backward: the residual
// gradient (this rank's rows), the FFN's input gradient, dx of the projections, the
// attention output's gradient and dq, dk, dv; under cp the ring's backward also holds the
// key/value block in hand and the one arriving, with their gradients travelling alongside
// (kv each), and the delta (Hq). Under bf16 storage
// q, k and v keep one bf16 operand of the (gathered) input instead, and o.x is bf16; the
// ring path's backward reads o.x back as an f32 copy (q), before dx (d >= q) exists, so the
// copy does not raise the peak (the fused path reads the bf16 o.x itself, and q, k and v are
// kept in bf16: Shape::qkv_kept).
Piece AttentionElements(const Shape& s) {
  const double input = s.bf16 ? s.half * s.d : (s.sp ? s.d : 0);
  const double attention = input + s.qkv_kept + s.hq / s.P + s.half * s.q;
  const double ring_bwd = s.cp > 1 ? 4 * s.kv + s.hq / s.P : 0;
  return {.kept = attention, .backward = 2 * s.d * s.rows + s.d + 2 * s.q + s.kv + ring_bwd};
}

// The scratch of an MLP's (or an expert's) backward beyond dy, per row of width d and hidden
// width f with `grads` hidden gradients (da; and db under swiglu): in f32 they are written
// over dh (and db beside it), then dx (d) comes; as the products' bf16 operands
// (kernels::HiddenGradsInBf16: bf16 products, but relu's with a bias, whose bias gradient
// reads an f32 da) dh (f) is held with them while the activation's backward runs and let go
// before dx.
double HiddenGradients(const Shape& s, double d, double f, double grads, bool relu_bias) {
  if (!kernels::HiddenGradsInBf16(s.grads16, relu_bias)) return d + grads * f;
  return 0.5 * grads * f + std::max(f, d);
}

// Dense MLP (dense/mlp.h): the gathered input under sp, fc1's output (and fc3's under
// swiglu), the activation h (fc2's output, and the output after the tp reduction, go once
// the residual has them).
// Backward: dy, then HiddenGradients. Under bf16 storage: x's bf16 operand (gathered or not),
// a, (b) and h in bf16, which the activation's backward reads as they are.
Piece MlpElements(const config::Config& c, const Shape& s) {
  const double f = double(c.model.ff_hidden()) / s.P;
  const double mats = double(model::MlpMatrices(c.model.activation));
  const double input = s.bf16 ? s.half * s.d : (s.sp ? s.d : 0);
  const bool relu_bias = c.model.activation == dense::Activation::kRelu && c.model.bias;
  return {.kept = input + s.half * mats * f,
          .backward = s.d * s.rows + HiddenGradients(s, s.d, f, mats - 1, relu_bias)};
}

// MoE (moe/moe_layer.h), per row this rank routes (its 1/tp of the tokens under tp):
// the router's input (jittered: the noisy copy, whose noise is drawn again in backward, not
// kept; unjittered it is the norm's output, counted with the norm (MoENormKeepsOutput), or
// under tp without sp this rank's copied rows, which the shared experts also read), logits and probabilities (E
// each), chosen experts, gates and keep masks (router and capacity: k each), the dispatch
// plan (4 per assignment); per admitted assignment the expert input, a (and b under
// swiglu), h and the combine's rows (d + 2..3 f / etp + d: the experts' output itself,
// and under ep the rows it was sent from, are let go once combined); the shared experts
// (whole under tp: a, (b), h; their output likewise let go). The layer's output goes once
// the residual has it.
// Context parallelism: this rank holds 1/cp of the tokens (the per-token figures are per
// token it holds), but every rank of the routing group keeps the whole group's routing:
// logits and probabilities (E each) and two sets of choices, gates and keep masks (2.25 k
// each), gathered over tp x cp.
// Backward: per admitted row dy (bf16 when ExpertGradRowsInBf16), then HiddenGradients, a
// gate gradient per assignment, four (E) router gradients. Under bf16 storage the expert input x, a, (b), h and the combine's
// rows are bf16 (the shared experts' a, (b), h too; their input is the layer's, kept f32
// for the router); backward reads a (and b) and the combine's rows as kept.
Piece MoEElements(const config::Config& c, const Shape& s) {
  const moe::MoEConfig& e = c.moe;
  const double d = s.d;
  const double routed = s.tp ? 1.0 / s.P : 1.0;
  const double k = e.top_k, E = e.num_experts;
  const double whole_router = (s.tp || s.cp > 1 ? s.cp : routed) * (2 * E + 2 * 2.25 * k);
  const double group = double(c.train.micro_batch_size) * c.model.seq_len;  // routing group T
  const int64_t cap = moe::ExpertCapacity(e.capacity_factor, int64_t(group), e.top_k, e.num_experts);
  const double admitted = cap < 0 ? k : std::min(k, E * double(cap) / group);  // per token
  const double emats = double(model::MlpMatrices(e.activation));
  const double fe = double(e.d_expert) / c.parallel.expert_tp();
  const double per_row = s.half * (2 * d + emats * fe);  // x, the combine's row; a, (b), h
  const double shared_h = double(e.num_shared_experts) * e.shared_hidden();
  // The router's input: jittered, h * noise; under tp without sp, this rank's copy of its
  // rows (kept for the router unjittered, and for the shared experts either way).
  const bool jitter = e.jitter_eps > 0;
  const double router_in = (jitter ? d : 0) + (s.tp && !s.sp && e.KeepsLayerInput() ? d : 0);
  const bool relu_bias = e.activation == dense::Activation::kRelu && e.bias;
  // The experts' incoming gradient rows: bf16 as the combine's backward writes them (replicas
  // counted as on: a step may have them).
  const double dy_rows =
      e.ExpertGradRowsInBf16(s.grads16, c.parallel.expert_tp(), e.replicate_hot_experts > 0)
          ? 0.5 * d
          : d;
  return {.kept = whole_router + routed * (router_in + 4 * k + admitted * per_row +
                                           (shared_h > 0 ? s.half * emats * shared_h : 0)),
          .backward = d * s.rows +
                      routed * (admitted * (dy_rows + HiddenGradients(s, d, fe, emats - 1,
                                                                      relu_bias)) +
                                k + 4 * E)};
}

// Whether a MoE block's norm2 output (f32, (N, d) on this rank's rows) outlives the forward:
// the block lets it go (Decoder::ForwardBlock), and the layer keeps it as the unjittered
// router's input or the shared experts' input, unless under tp without sp the layer reads a
// copy of this rank's rows instead.
bool MoENormKeepsOutput(const config::Config& c, const Shape& s) {
  return (!s.tp || s.sp) && c.moe.KeepsLayerInput();
}

// Each layer's kept bytes and Backward scratch under train.recompute.
void AddLayers(const config::Config& c, const Shape& s, double bytes, ActivationBytes& a) {
  const Piece attention = AttentionElements(s), mlp = MlpElements(c, s), moe = MoEElements(c, s);
  // x_mid, the layer's output (the residual stream, this rank's rows).
  const double residual = 2 * s.d * s.rows;
  // A norm's output that only products read goes under bf16 storage (its statistics stay).
  const double stats_only = s.stats * s.rows;
  for (int64_t i = 0; i < c.model.n_layers; ++i) {
    const bool is_moe = c.moe.IsMoELayer(i);
    const double norm1 = s.bf16 ? stats_only : s.norm;
    const double norm2 = is_moe ? (MoENormKeepsOutput(c, s) ? s.norm : stats_only)
                                : (s.bf16 ? stats_only : s.norm);
    const double kept = norm1 + attention.kept + residual + norm2 + (is_moe ? moe.kept : mlp.kept);
    const double scratch = std::max(attention.backward, is_moe ? moe.backward : mlp.backward);
    // A device-sized dispatch plan also keeps its (E + 1) i64 offsets per micro-batch.
    const double offsets =
        is_moe && c.moe.DeviceDispatchCounts(c.parallel.ep, c.parallel.expert_tp())
            ? 8.0 * double(c.moe.num_experts + 1)
            : 0.0;
    switch (c.train.recompute) {
      case model::Recompute::kNone:
        a.layer.push_back(bytes * kept + offsets);
        a.layer_backward.push_back(bytes * scratch);
        break;
      case model::Recompute::kSelective:  // the core attention output and its lse go (and
                                          // come back, in f32 or CoreOutputDType's bf16)
        a.layer.push_back(bytes * (kept - s.half * s.q - s.hq / s.P) + offsets);
        a.layer_backward.push_back(bytes * (scratch + (s.core_bf16 ? 0.5 : 1.0) * s.q +
                                            s.hq / s.P));
        break;
      case model::Recompute::kFull:  // the layer's output (the next one's input) stays;
                                     // Backward rebuilds the rest one block at a time
        a.layer.push_back(bytes * s.d * s.rows);
        a.layer_backward.push_back(bytes * (kept + scratch) + offsets);
        break;
    }
  }
}

}  // namespace

// Per token of the micro-batch, in f32 elements (4 bytes; i32 ids and u8 masks as their
// share of 4 bytes, bf16 tensors as half an element). Names follow the layers' activation
// structs (dense/*.h, moe/*.h).
ActivationBytes EstimateActivationBytes(const config::Config& c) {
  const Shape s = ShapeOf(c);
  const double group = double(c.train.micro_batch_size) * c.model.seq_len;
  ActivationBytes a;
  const double bytes = 4.0 * group / s.cp;  // f32 elements per token -> bytes per micro-batch
  AddLayers(c, s, bytes, a);
  const double d = s.d, rows = s.rows;
  // Embedding (dense/embedding.h): its output; under tp the partial lookup and the reduced
  // (or reduce-scattered) rows.
  a.embedding = bytes * (s.tp ? d + d * rows : d);
  // Head: the final norm (under bf16 storage without tp its output is the head's bf16
  // operand), the gathered rows under sp, the logits' gradient (B*S, V/tp).
  // Chunked (train.head_chunk_tokens), no logits are kept: Backward holds one chunk's
  // logits (its rows x V/tp) beside the input's gradient, before the final norm's backward.
  const int64_t head_rows = int64_t(group / s.cp);
  const int64_t chunk = c.train.head_rows(head_rows);
  const double vocab = double(c.model.vocab_size) / s.P;
  const double norm_f = s.norm_bf16 ? (s.half * d + s.stats) * rows : s.norm;
  a.head = bytes * (norm_f + (s.sp ? d : 0) + (chunk < head_rows ? 0 : vocab));
  a.head_backward = bytes * (d + d * rows);
  if (chunk < head_rows) a.head_backward = std::max(a.head_backward, bytes * d + 4.0 * double(chunk) * vocab);
  a.hidden = bytes * d * rows;
  // tokens and targets on the device (this rank's chunks under cp); on the CPU the loader's
  // batch (inputs, targets, document labels: whole sequences) is in the same ledger.
  a.tokens = bytes * (c.runtime.device.is_cpu() ? 3 * s.cp + 2 : 2);
  return a;
}

double ActivationBytes::Stage(const model::Stage& stage) const {
  double sum = 0;
  const int64_t n = static_cast<int64_t>(layer.size());
  for (int64_t i = stage.first_layer; i < stage.End(n); ++i) sum += layer[i];
  if (stage.embedding) sum += embedding;
  if (stage.head) sum += head;
  return sum;
}

double ActivationBytes::StageBackward(const model::Stage& stage) const {
  double most = stage.head ? head_backward : 0;
  const int64_t n = static_cast<int64_t>(layer_backward.size());
  for (int64_t i = stage.first_layer; i < stage.End(n); ++i) most = std::max(most, layer_backward[i]);
  return most;
}

namespace {

// One step of one pipeline rank walked action by action (SimulateStepWorkspace's rules).
class WorkspaceWalk {
 public:
  explicit WorkspaceWalk(const StepWorkspaceInputs& in) : in_(in) {
    for (const parallel::Action& a : in.actions) micro_batches_ = std::max(micro_batches_, a.micro_batch + 1);
    has_tokens_.assign(micro_batches_, false);
    const size_t n = in.actions.size();
    for (size_t i = 0; i < n; ++i)
      if (in.actions[i].kind == ActionKind::kBackward) last_backward_ = static_cast<int>(i);
    const size_t per_chunk = static_cast<size_t>(micro_batches_) * in.chunks.size();
    received_.assign(per_chunk, 0);
    grad_input_.assign(per_chunk, 0);
    activation_send_.assign(per_chunk, -1);
    send_owns_.assign(n, 0);
    send_open_.assign(n, false);
    std::vector<bool> embedding;
    for (const model::Stage& s : in.chunks) embedding.push_back(s.embedding);
    frees_ = parallel::ActivationReleases(in.actions, embedding);
    SY_CHECK(in.send_release.empty() || in.send_release.size() == n)
        << in.send_release.size() << " send releases for " << n << " actions";
    // The sends released after each action, by a counting sort of the releases (sends in
    // list order within an action): two arrays, not a list per action (the planner walks
    // thousands of steps).
    released_start_.assign(n + 1, 0);
    const auto releases = [&](auto each) {
      for (size_t i = 0; i < in.send_release.size(); ++i) {
        const int j = in.send_release[i];
        if (j >= 0 && static_cast<size_t>(j) < n) each(static_cast<size_t>(j), static_cast<int>(i));
      }
    };
    releases([&](size_t j, int) { ++released_start_[j + 1]; });
    for (size_t j = 0; j < n; ++j) released_start_[j + 1] += released_start_[j];
    released_.resize(released_start_[n]);
    std::vector<int> filled(released_start_.begin(), released_start_.end() - 1);
    releases([&](size_t j, int send) { released_[filled[j]++] = send; });
  }

  StepWorkspace Run() {
    for (size_t i = 0; i < in_.actions.size(); ++i) {
      Step(in_.actions[i], static_cast<int>(i));
      for (int k = released_start_[i]; k < released_start_[i + 1]; ++k) Release(released_[k]);
    }
    // The end of the step: the sends are waited for and the runner's inputs go; the tree's
    // buffers stay with its sum (one more copy), then the sync's buckets.
    if (in_.ordered_accum) {
      const double tree = in_.gradients * buffers_;
      At(tree + in_.gradients + in_.tokens * micro_batches_, nullptr, "gradient tree sum");
      At(tree + in_.sync, nullptr, "gradient sync");
    } else if (last_backward_ < 0 || in_.sync_after_schedule) {
      At(in_.sync, nullptr, "gradient sync");
    }
    out_.peak_at = peak_action_ ? parallel::FormatAction(*peak_action_) + peak_what_ : peak_what_;
    return out_;
  }

 private:
  // A new peak and where it is (formatted once, at the end: the planner walks many lists).
  void At(double bytes, const parallel::Action* action, const char* what) {
    if (bytes <= out_.peak) return;
    out_.peak = bytes;
    peak_action_ = action;
    peak_what_ = what;
  }

  void Step(const parallel::Action& a, int index) {
    if (!has_tokens_[a.micro_batch]) {
      has_tokens_[a.micro_batch] = true;
      live_ += in_.tokens;
    }
    const int at = a.chunk * micro_batches_ + a.micro_batch;
    switch (a.kind) {
      case ActionKind::kRecvActivation:  // the stage's input, kept with the activations
      case ActionKind::kRecvGradient:    // goes with the activations
        live_ += in_.hidden;
        received_[at] += in_.hidden;
        break;
      case ActionKind::kForward:
        live_ += in_.kept[a.chunk];
        kept_ += in_.kept[a.chunk];
        ++in_flight_;
        out_.in_flight = std::max(out_.in_flight, in_flight_);
        out_.activations_peak = std::max(out_.activations_peak, kept_);
        break;
      case ActionKind::kSendActivation:  // the output, already counted with the activations
        send_open_[index] = true;
        activation_send_[at] = index;
        break;
      case ActionKind::kBackward:
        Backward(a, index);
        break;
      case ActionKind::kSendGradient:
        // The input gradient stays with its send until released.
        send_open_[index] = true;
        send_owns_[index] = grad_input_[at];
        grad_input_[at] = 0;
        break;
    }
    // The activations go after the action the executor's rule names.
    if (frees_[index]) DropActivations(a.chunk, at);
  }

  // The runner drops a completed send: what only the send still held goes.
  void Release(int send) {
    if (!send_open_[send]) return;
    send_open_[send] = false;
    live_ -= send_owns_[send];
    send_owns_[send] = 0;
  }

  void Backward(const parallel::Action& a, int index) {
    const model::Stage& stage = in_.chunks[a.chunk];
    const bool during = !in_.ordered_accum && !in_.sync_after_schedule;
    const double sync = index == last_backward_ && during ? in_.sync : 0;
    At(live_ + in_.backward[a.chunk] + sync, &a, "");
    const int at = a.chunk * micro_batches_ + a.micro_batch;
    if (!stage.embedding) {  // the input gradient, kept for its send
      live_ += in_.hidden;
      grad_input_[at] = in_.hidden;
    }
    if (in_.ordered_accum) PackIntoTree(a);
  }

  // The gradient packed (one copy) and added to the pairwise tree: a fresh buffer unless a
  // merged level left one spare.
  void PackIntoTree(const parallel::Action& a) {
    const bool fresh = spare_ == 0;
    At(live_ + in_.gradients * (fresh ? 2 : 1), &a, " (gradient packed into the tree)");
    if (fresh) {
      ++buffers_;
      live_ += in_.gradients;
    } else {
      --spare_;
    }
    int level = 0;
    while (!levels_.empty() && levels_.back() == level) levels_.pop_back(), ++spare_, ++level;
    levels_.push_back(level);
  }

  // The micro-batch's activations go, with what it received; the output it sent on (the
  // last of its kept tensors) stays while that send is open.
  void DropActivations(int chunk, int at) {
    live_ -= in_.kept[chunk] + received_[at];
    received_[at] = 0;
    kept_ -= in_.kept[chunk];
    --in_flight_;
    const int send = activation_send_[at];
    if (send >= 0 && send_open_[send]) {
      live_ += in_.hidden;
      send_owns_[send] += in_.hidden;
    }
  }

  const StepWorkspaceInputs& in_;
  StepWorkspace out_;
  const parallel::Action* peak_action_ = nullptr;  // where out_.peak is (an element of in_.actions)
  const char* peak_what_ = "";
  double live_ = 0, kept_ = 0;  // all workspace bytes; the kept activations among them
  int in_flight_ = 0;
  int micro_batches_ = 0;
  std::vector<bool> has_tokens_;  // per micro-batch: whether its token ids are held
  // The gradient tree: open levels (the stack), buffers, buffers kept for reuse.
  std::vector<int> levels_;
  int buffers_ = 0, spare_ = 0;
  int last_backward_ = -1;
  // Per (chunk, micro-batch), chunk * micro_batches + m: the bytes received for it (its
  // input activation and output gradient), its input gradient before the send, and the
  // index of its activation's send (-1: none).
  std::vector<double> received_, grad_input_;
  std::vector<int> activation_send_;
  // Per action (sends): what only the send holds, whether it is still held, and the sends
  // the runner releases after each action: released_[released_start_[i] ..
  // released_start_[i + 1]) after action i.
  std::vector<double> send_owns_;
  std::vector<bool> send_open_;
  std::vector<int> released_start_, released_;
  // Per action: it frees its micro-batch's activations (parallel::ActivationReleases).
  std::vector<bool> frees_;
};

}  // namespace

StepWorkspace SimulateStepWorkspace(const StepWorkspaceInputs& in) {
  return WorkspaceWalk(in).Run();
}

}  // namespace switchyard::plan
