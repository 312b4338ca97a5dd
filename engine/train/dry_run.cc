#include "engine/train/dry_run.h"

#include <cstdio>
#include <sstream>

namespace switchyard::train {
namespace {

std::string Human(double v, const char* unit) {
  const char* prefixes[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (v >= 1000 && i < 5) v /= 1000, ++i;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f %s%s", v, prefixes[i], unit);
  return buf;
}

std::string Bytes(double v) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (v >= 1024 && i < 4) v /= 1024, ++i;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f %s", v, units[i]);
  return buf;
}

}  // namespace

ModelCost EstimateCost(const Config& c) {
  const model::ModelConfig& m = c.model;
  const moe::MoEConfig& e = c.moe;
  const int64_t d = m.d_model, hd = m.head_dim(), hq = m.n_heads, hkv = m.kv_heads();
  const int64_t mats = m.activation == "swiglu" ? 3 : 2;
  const int64_t emats = e.activation == moe::Activation::kSwiglu ? 3 : 2;
  const int64_t norm = m.norm == "layernorm" ? 2 * d : d;
  ModelCost cost;
  cost.embedding_params = m.vocab_size * d + (m.position == "learned" ? m.seq_len * d : 0);
  const int64_t attn_mat = d * hq * hd + 2 * d * hkv * hd + hq * hd * d;
  const int64_t attn_bias = m.bias ? hq * hd + 2 * hkv * hd + d : 0;
  const int64_t mlp_mat = mats * d * m.ff_hidden();
  const int64_t mlp_bias = m.bias ? m.ff_hidden() + d : 0;
  const int64_t expert_mat = emats * d * e.d_expert;
  const int64_t expert_bias = e.bias ? e.d_expert + d : 0;
  const int64_t shared_h = e.num_shared_experts * e.shared_hidden();
  const int64_t shared_mat = emats * d * shared_h;
  const int64_t shared_bias = e.num_shared_experts > 0 && e.bias ? shared_h + d : 0;
  const int64_t head = m.tie_embeddings ? 0 : m.vocab_size * d;

  int64_t total = cost.embedding_params + norm + head, active = total, matmul = m.vocab_size * d;
  int64_t moe_layers = 0;
  for (int64_t i = 0; i < m.n_layers; ++i) {
    int64_t common = 2 * norm + attn_mat + attn_bias;
    total += common;
    active += common;
    matmul += attn_mat;
    if (e.IsMoeLayer(i)) {
      ++moe_layers;
      const int64_t router = d * e.num_experts;
      const int64_t one = expert_mat + expert_bias;
      total += router + e.num_experts * one + shared_mat + shared_bias;
      active += router + e.top_k * one + shared_mat + shared_bias;
      matmul += router + e.top_k * expert_mat + shared_mat;
      cost.expert_params += e.num_experts * one;
    } else {
      total += mlp_mat + mlp_bias;
      active += mlp_mat + mlp_bias;
      matmul += mlp_mat;
    }
  }
  cost.total_params = total;
  cost.active_params = active;
  cost.flops_per_token = 6.0 * matmul + 12.0 * m.n_layers * m.seq_len * hq * hd;

  const double state = c.train.optimizer == OptimizerKind::kAdamW ? 2 : 1;
  const double local = (total - cost.expert_params) + double(cost.expert_params) / c.parallel.ep;
  cost.param_bytes_per_rank = 4.0 * local * (2 + state);

  // Activations kept per token and layer (f32), from what Forward stores for Backward.
  const double tokens = double(c.train.micro_batch_size) * m.seq_len;
  const double attn_acts = 6.0 * d + 2 * hq * hd + 2 * hkv * hd + hq + 4;
  const double mlp_acts = 2.0 * d + (mats == 3 ? 3 : 2) * m.ff_hidden();
  const double moe_acts = 3.0 * d + 2 * e.num_experts +
                          e.top_k * (3.0 * d + (emats == 3 ? 3 : 2) * e.d_expert) +
                          (shared_h > 0 ? 2.0 * d + 3 * shared_h : 0);
  const double per_token =
      m.n_layers * attn_acts + (m.n_layers - moe_layers) * mlp_acts + moe_layers * moe_acts +
      2.0 * d + m.vocab_size;  // final norm, logits/dlogits
  cost.activation_bytes_per_rank = 4.0 * tokens * per_token;
  return cost;
}

std::string DryRunReport(const Config& c, int world) {
  ModelCost cost = EstimateCost(c);
  const int64_t dp = world / (c.parallel.tp * c.parallel.cp * c.parallel.pp);
  std::ostringstream out;
  out << "dry run: " << c.model.n_layers << " layers, d_model " << c.model.d_model << ", "
      << c.moe.num_experts << " experts (top-" << c.moe.top_k << ", every "
      << c.moe.layer_freq << (c.moe.layer_freq == 1 ? " layer" : " layers") << "), vocab "
      << c.model.vocab_size << ", seq_len " << c.model.seq_len << "\n"
      << "layout: world " << world << " = tp " << c.parallel.tp << " x cp " << c.parallel.cp
      << " x pp " << c.parallel.pp << " x dp " << dp << "; ep " << c.parallel.ep << "\n"
      << "  parameters, total          " << Human(double(cost.total_params), "") << "\n"
      << "  parameters, active / token " << Human(double(cost.active_params), "") << "\n"
      << "  of which routed experts    " << Human(double(cost.expert_params), "") << "\n"
      << "  of which embeddings        " << Human(double(cost.embedding_params), "") << "\n"
      << "  training FLOPs / token      " << Human(cost.flops_per_token, "FLOP") << "\n"
      << "  memory / rank, weights+grads+optimizer (fp32)  " << Bytes(cost.param_bytes_per_rank)
      << "\n"
      << "  memory / rank, activations of one micro-batch   "
      << Bytes(cost.activation_bytes_per_rank) << " (estimate, micro_batch_size "
      << c.train.micro_batch_size << ")\n";
  return out.str();
}

}  // namespace switchyard::train
