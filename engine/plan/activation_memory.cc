#include "engine/plan/activation_memory.h"

#include <algorithm>

#include "engine/model/recompute.h"
#include "moe/capacity.h"

namespace switchyard::plan {

using parallel::ActionKind;

// Per token of the micro-batch, in f32 elements (4 bytes; i32 ids and u8 masks as their
// share of 4 bytes). Names follow the layers' activation structs (dense/*.h, moe/*.h).
ActivationBytes EstimateActivationBytes(const config::Config& c) {
  const model::ModelConfig& m = c.model;
  const moe::MoEConfig& e = c.moe;
  const config::ParallelConfig& p = c.parallel;
  const double P = p.tp, d = m.d_model, hd = m.head_dim();
  const double hq = m.n_heads, hkv = m.kv_heads();
  const bool tp = p.tp > 1, sp = tp && p.sequence_parallel;
  const double etp = p.etp > 0 ? p.etp : p.tp;
  const double rows = sp ? 1.0 / P : 1.0;  // residual-stream rows per token on this rank
  const double stats = m.norm == "layernorm" ? 2 : 1;  // mean and rstd, or rstd
  const double norm = (d + stats) * rows;                 // y and the statistics
  // Attention (dense/attention.h): the gathered input under sp; q, k and v of this rank's
  // heads (k and v whole, plus this rank's head, when tp does not divide the kv heads); the
  // log-sum-exp (B, Hq, S); the attention output o.x and o.y (partial sums, every row); the
  // output after the tp reduction.
  const bool kv_whole = tp && int64_t(hkv) % p.tp != 0;
  const double q = hq * hd / P;
  const double kv = kv_whole ? 2 * hkv * hd + 2 * hd : 2 * hkv * hd / P;
  const double attention = (sp ? d : 0) + q + kv + hq / P + q + d + (tp ? d * rows : 0);
  // x_mid, the layer's output (the residual stream, this rank's rows).
  const double residual = 2 * d * rows;
  // Dense MLP (dense/mlp.h): the gathered input under sp, fc1's output (and fc3's under
  // swiglu), the activation h, fc2's partial output, the output after the tp reduction.
  const double f = double(m.ff_hidden()) / P;
  const double mats = m.activation == "swiglu" ? 3 : 2;
  const double mlp = (sp ? d : 0) + mats * f + d + (tp ? d * rows : 0);
  // MoE (moe/moe_layer.h), per row this rank routes (its 1/tp of the tokens under tp):
  // the router's input (jittered: the noisy copy and the noise; unjittered it is the norm's
  // output, or under tp without sp this rank's copied rows), logits and probabilities (E
  // each), chosen experts, gates and keep masks (router and capacity: k each), the dispatch
  // plan (4 per assignment); per admitted assignment the expert input, a (and b under
  // swiglu), h and y (d + 2..3 f / etp + d), and the combine's returned rows under ep; the
  // shared experts (whole under tp: a, (b), h, y); the layer's output.
  const double routed = tp ? 1.0 / P : 1.0;
  const double k = e.top_k, E = e.num_experts;
  // Context parallelism: this rank holds 1/cp of the tokens (the per-token figures below are
  // per token it holds), but every rank of the routing group keeps the whole group's
  // routing: logits and probabilities (E each) and two sets of choices, gates and keep masks
  // (2.25 k each), gathered over tp x cp.
  const double cp = p.cp;
  const double whole_router = (tp || cp > 1 ? cp : routed) * (2 * E + 2 * 2.25 * k);
  const double group = double(c.train.micro_batch_size) * m.seq_len;  // routing group T
  const int64_t cap = moe::ExpertCapacity(e.capacity_factor, int64_t(group), e.top_k, e.num_experts);
  const double admitted = cap < 0 ? k : std::min(k, E * double(cap) / group);  // per token
  const double emats = e.activation == moe::Activation::kSwiglu ? 3 : 2;
  const double fe = double(e.d_expert) / etp;
  const double per_row = 2 * d + emats * fe + (p.ep > 1 ? d : 0);  // x, y; a, (b), h
  const double shared_h = double(e.num_shared_experts) * e.shared_hidden();
  const double router_in = e.jitter_eps > 0 ? 2 * d : (tp && !sp ? d : 0);
  const double moe = whole_router + routed * (router_in + 4 * k + admitted * per_row +
                                              (shared_h > 0 ? emats * shared_h + d : 0) + d);

  // Backward scratch, beyond the kept activations: the residual gradient (this rank's rows)
  // and, in the largest phase: attention — the FFN's input gradient, dx of the projections,
  // the attention output's gradient and dq, dk, dv; MLP — dy and dh (and db); MoE — per
  // admitted row dy, dx and dh (and db), a gate gradient per assignment, four (E) router
  // gradients.
  // Under cp the ring's backward also holds the key/value block in hand and the one
  // arriving, with their gradients travelling alongside (kv each), and the delta (Hq).
  const double ring_bwd = cp > 1 ? 4 * kv + hq / P : 0;
  const double attention_bwd = 2 * d * rows + d + 2 * q + kv + ring_bwd;
  const double mlp_bwd = d * rows + d + (mats - 1) * f;
  const double moe_bwd =
      d * rows + routed * (admitted * (2 * d + (emats - 1) * fe) + k + 4 * E);

  ActivationBytes a;
  const double bytes = 4.0 * group / cp;  // f32 elements per token -> bytes per micro-batch
  for (int64_t i = 0; i < m.n_layers; ++i) {
    const bool is_moe = e.IsMoeLayer(i);
    const double kept = norm + attention + residual + norm + (is_moe ? moe : mlp);
    const double scratch = std::max(attention_bwd, is_moe ? moe_bwd : mlp_bwd);
    switch (c.train.recompute) {
      case model::Recompute::kNone:
        a.layer.push_back(bytes * kept);
        a.layer_backward.push_back(bytes * scratch);
        break;
      case model::Recompute::kSelective:  // the core attention output and its lse go
        a.layer.push_back(bytes * (kept - q - hq / P));
        a.layer_backward.push_back(bytes * (scratch + q + hq / P));
        break;
      case model::Recompute::kFull:  // the layer's output (the next one's input) stays;
                                     // Backward rebuilds the rest one block at a time
        a.layer.push_back(bytes * d * rows);
        a.layer_backward.push_back(bytes * (kept + scratch));
        break;
    }
  }
  // Embedding (dense/embedding.h): its output; under tp the partial lookup and the reduced
  // (or reduce-scattered) rows.
  a.embedding = bytes * (tp ? d + d * rows : d);
  // Head: the final norm, the gathered rows under sp, the logits' gradient (B*S, V/tp).
  a.head = bytes * (norm + (sp ? d : 0) + double(m.vocab_size) / P);
  a.head_backward = bytes * (d + d * rows);
  a.hidden = bytes * d * rows;
  // tokens and targets on the device (this rank's chunks under cp); on the CPU the loader's
  // batch (inputs, targets, document labels: whole sequences) is in the same ledger.
  a.tokens = bytes * (c.runtime.device == "cpu" ? 3 * cp + 2 : 2);
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

StepWorkspace SimulateStepWorkspace(const StepWorkspaceInputs& in) {
  StepWorkspace out;
  double live = 0, kept = 0;  // all workspace bytes; the kept activations among them
  int in_flight = 0;
  // A new peak and where it is (formatted only then: the dry-run walks many lists).
  auto at = [&](double bytes, const parallel::Action* action, const char* what) {
    if (bytes <= out.peak) return;
    out.peak = bytes;
    out.peak_at = action ? parallel::FormatAction(*action) + what : std::string(what);
  };
  // Per (micro-batch, chunk): whether its token ids and its received gradient are held.
  int micro_batches = 0;
  for (const parallel::Action& a : in.actions) micro_batches = std::max(micro_batches, a.micro_batch + 1);
  std::vector<bool> has_tokens(micro_batches, false);
  // The gradient tree: open levels (the stack), buffers kept for reuse.
  std::vector<int> levels;
  int buffers = 0, spare = 0;
  int last_backward = -1;
  for (size_t i = 0; i < in.actions.size(); ++i)
    if (in.actions[i].kind == ActionKind::kBackward) last_backward = static_cast<int>(i);

  for (size_t i = 0; i < in.actions.size(); ++i) {
    const parallel::Action& a = in.actions[i];
    const model::Stage& stage = in.chunks[a.chunk];
    if (!has_tokens[a.micro_batch]) {
      has_tokens[a.micro_batch] = true;
      live += in.tokens;
    }
    switch (a.kind) {
      case ActionKind::kRecvActivation:  // kept by the runner until the step ends
      case ActionKind::kRecvGradient:    // goes with the activations
        live += in.hidden;
        break;
      case ActionKind::kForward:
        live += in.kept[a.chunk];
        kept += in.kept[a.chunk];
        ++in_flight;
        out.in_flight = std::max(out.in_flight, in_flight);
        out.activations_peak = std::max(out.activations_peak, kept);
        break;
      case ActionKind::kSendActivation:  // the output, already counted with the activations
        break;
      case ActionKind::kBackward: {
        const double sync = static_cast<int>(i) == last_backward && !in.ordered_accum ? in.sync : 0;
        at(live + in.backward[a.chunk] + sync, &a, "");
        if (!stage.embedding) live += in.hidden;  // the input gradient, kept for its send
        if (in.ordered_accum) {
          const bool fresh = spare == 0;
          at(live + in.gradients * (fresh ? 2 : 1), &a, " (gradient packed into the tree)");
          if (fresh) {
            ++buffers;
            live += in.gradients;
          } else {
            --spare;
          }
          int level = 0;
          while (!levels.empty() && levels.back() == level) levels.pop_back(), ++spare, ++level;
          levels.push_back(level);
        }
        if (stage.embedding) {
          // The activations go. Before the last stage, the output sent on stays until the
          // end of the step and the received gradient (as large) goes: the same bytes.
          live -= in.kept[a.chunk];
          kept -= in.kept[a.chunk];
          --in_flight;
        }
        break;
      }
      case ActionKind::kSendGradient:
        // The activations go (as above: the sent output stays, the received gradient goes);
        // the input gradient stays until the end of the step.
        live -= in.kept[a.chunk];
        kept -= in.kept[a.chunk];
        --in_flight;
        break;
    }
  }
  // The end of the step: the sends are waited for and the runner's inputs go; the tree's
  // buffers stay with its sum (one more copy), then the sync's buckets.
  if (in.ordered_accum) {
    const double tree = in.gradients * buffers;
    at(tree + in.gradients + in.tokens * micro_batches, nullptr, "gradient tree sum");
    at(tree + in.sync, nullptr, "gradient sync");
  } else if (last_backward < 0) {
    at(in.sync, nullptr, "gradient sync");
  }
  return out;
}

}  // namespace switchyard::plan
