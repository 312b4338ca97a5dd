// The step-time model of cost_model.h; docs/plan.md writes out each formula used here.
#include "engine/plan/cost_model.h"

#include <algorithm>
#include <cmath>

#include "engine/model/param_table.h"
#include "engine/plan/dry_run.h"

namespace switchyard::plan {
namespace {

// What one layout sees of the model and the machine, per micro-batch of one rank.
struct Ctx {
  const PlanInputs& in;
  const Layout& l;
  const Hardware& hw;
  double peak = 0;   // FLOP/s of the matrix products' type, this rank's share of them
  double bandwidth = 0;  // memory bytes/s, this rank's share
  double op_s = 0;       // fixed seconds per operation (hw.op_latency; more when time-sliced)
  double b = 2;      // bytes per activation element
  double half_flops = 0;  // gemm.half_flops at this precision (fp8: the bf16 file's, rescaled)
  double cast_bytes = 0;  // fp8: bytes each product's cast moves per operand element
  bool fp8_dispatch = false;  // the all-to-all's dispatch carries 8-bit rows
  double t = 0;      // tokens of the micro-batch on this rank's cp shard: mbs * S / cp
  double t_moe = 0;  // tokens an MoE layer works on: t / tp under sequence parallelism
  double skew = 1;   // busiest expert-parallel rank's load over the mean
  bool sp = false;   // sequence parallelism active (tp > 1)
};

// Seconds of forward, tensor-parallel, context-parallel and expert-parallel work of one
// piece for one micro-batch.
struct Pass {
  double compute = 0, attention = 0, tp = 0, cp = 0, ep = 0;
  double ep_backward = 0;  // exposed all-to-all of the backward (ep's, unless overlapped)
  double ops = 0;       // operations launched (kernels, element-wise passes), for op_latency
  double comm_ops = 0;  // collective calls (each launches too): once forward, once backward
};

// Operations one micro-batch's forward launches per piece (kernels on a GPU, passes on a
// CPU): what op_latency multiplies. A count of the engine's forward: attention (norm,
// projections, biases, the core, residual), a dense MLP, the router (scores, top-k,
// permutation, combine), each local expert (two products, bias, activation), the head
// (norm, product, loss) and the embedding.
constexpr double kAttentionOps = 12, kMlpOps = 6, kRouterOps = 12, kExpertOps = 4, kHeadOps = 4,
                 kEmbeddingOps = 2;

const Link& LinkFor(const Hardware& hw, int64_t span) {
  return span <= hw.gpus_per_node ? hw.intra_node : hw.inter_node;
}

// Ring all-gather or reduce-scatter over p ranks of a tensor of `bytes` in all: p - 1
// steps, each moving bytes / p.
double RingStep(int p, double bytes, const Link& link) {
  return p <= 1 ? 0 : (p - 1) * (link.latency + bytes / p / link.bandwidth);
}

// Bytes an fp8 product's cast moves per operand element. Block-wise scales (fp8): the 16-bit
// value read and the 8-bit one written, the block's max taken in the same pass. Per-tensor
// current scaling (fp8-cs): a pass for the tensor's max first (read), then the cast with the
// transposed copy Hopper's fp8 products need for the backward (read, two 8-bit writes).
constexpr double kFp8CastBytes = 2 + 1, kFp8CurrentScalingCastBytes = 2 + 2 + 1 + 1;

// Roofline of one matrix product (m, k) x (k, n): its FLOPs at the shape's efficiency, or
// its operands' bytes at the memory bandwidth, whichever is longer. In fp8 the operands are
// cast first (the activations and the weights, each once per product): a memory pass the
// tensor cores' doubled rate does not shorten.
// `efficiency`: the file's share of the peak for this kind of product (gemm_efficiency, or
// grouped_gemm_efficiency for the device-sized expert products).
double Gemm(const Ctx& c, double m, double n, double k, double efficiency) {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  const double flops = 2 * m * n * k;
  const double eff = efficiency * flops / (flops + c.half_flops);
  const double bytes = c.b * (m * k + k * n + m * n);
  const double cast = c.cast_bytes * (m * k + k * n) / c.bandwidth;
  return std::max(flops / (c.peak * eff), bytes / c.bandwidth) + cast;
}

double Gemm(const Ctx& c, double m, double n, double k) {
  return Gemm(c, m, n, k, c.hw.gemm_efficiency);
}

// Memory-bound passes over `elements` activation elements (each read or write counted), at
// the share of the bandwidth the engine's own such kernels reach (elementwise_efficiency).
double Elementwise(const Ctx& c, double elements) {
  return c.b * elements / (c.bandwidth * c.hw.elementwise_efficiency);
}

// Attention: q/k/v and output projections split over tp, the core (scores and values,
// 4 t S d / tp FLOPs, causal masking not subtracted) at attention_efficiency, the
// context-parallel ring of keys and values hidden behind the core where it can be.
Pass Attention(const Ctx& c) {
  const model::ModelConfig& m = c.in.config.model;
  const double d = m.d_model, hd = m.head_dim(), tp = c.l.tp;
  const double kv = m.kv_heads() * hd;
  const double kv_local = model::KvReplicated(m, c.l.tp) ? kv : kv / tp;
  Pass p;
  p.compute = Gemm(c, c.t, m.n_heads * hd / tp + 2 * kv_local, d) + Gemm(c, c.t, d, m.n_heads * hd / tp);
  p.attention = 4.0 * c.t * m.seq_len * m.n_heads * hd / tp / (c.peak * c.hw.attention_efficiency);
  p.compute += p.attention + Elementwise(c, c.t * (8 * d / (c.sp ? tp : 1)));
  p.ops = kAttentionOps;
  p.comm_ops = (tp > 1 ? 2 : 0) + (c.l.cp - 1);
  // Sequence parallelism: all-gather before, reduce-scatter after; else one all-reduce.
  p.tp = 2 * RingStep(c.l.tp, c.t * d * c.b, LinkFor(c.hw, c.l.tp));
  if (c.l.cp > 1) {
    const Link& link = LinkFor(c.hw, int64_t{c.l.tp} * c.l.cp);
    p.cp = (c.l.cp - 1) * (link.latency + 2 * c.t * kv_local * c.b / link.bandwidth);
  }
  return p;
}

// The dense MLP split over tp.
Pass DenseMlp(const Ctx& c) {
  const model::ModelConfig& m = c.in.config.model;
  const double d = m.d_model, ff = double(m.ff_hidden()) / c.l.tp;
  const double in_mats = model::MlpMatrices(m.activation) - 1;
  Pass p;
  p.compute = in_mats * Gemm(c, c.t, ff, d) + Gemm(c, c.t, d, ff) +
              Elementwise(c, c.t * (8 * d / (c.sp ? c.l.tp : 1) + 3 * in_mats * ff));
  p.ops = kMlpOps;
  p.comm_ops = c.l.tp > 1 ? 2 : 0;
  p.tp = 2 * RingStep(c.l.tp, c.t * d * c.b, LinkFor(c.hw, c.l.tp));
  return p;
}

// The expert-parallel all-to-all of `bytes` per rank: the busiest rank receives skew x the
// mean; inside a node while ep x etp fits one, else hierarchical (the node's share over
// NVLink, then one exchange between nodes for the rest).
double AllToAll(const Ctx& c, double bytes) {
  const int ep = c.l.ep;
  if (ep <= 1) return 0;
  const int64_t span = int64_t{ep} * c.l.etp;
  const double moved = c.skew * bytes * (ep - 1) / ep;
  if (span <= c.hw.gpus_per_node) {
    return (ep - 1) * c.hw.intra_node.latency + moved / c.hw.intra_node.bandwidth;
  }
  const double local_ranks = std::max(1.0, double(c.hw.gpus_per_node) / c.l.etp);
  const double nodes = double(span) / c.hw.gpus_per_node;
  const double inside = moved * (local_ranks - 1) / (ep - 1);
  return (local_ranks - 1) * c.hw.intra_node.latency + inside / c.hw.intra_node.bandwidth +
         (nodes - 1) * c.hw.inter_node.latency + (moved - inside) / c.hw.inter_node.bandwidth;
}

// The dispatch and return of one MoE layer's pass (`exchange` seconds each way) left exposed
// by moe.overlap_chunks = C (moe/overlap.h): chunks of whole local experts, chunk i + 1's
// dispatch and chunk i - 1's return in flight while chunk i computes, the shared experts
// behind the first dispatch. Exposed: the first dispatch beyond the shared experts, the last
// return, and between chunks what the exchanges take beyond a chunk's compute. C = 1: both.
double ExposedExchange(double exchange, double experts, double shared, int64_t chunks, double local) {
  const double C = std::clamp(double(chunks), 1.0, std::max(1.0, local));
  if (C <= 1) return 2 * exchange;
  return std::max(0.0, exchange / C - shared) + exchange / C +
         (C - 1) * std::max(0.0, 2 * exchange / C - experts / C);
}

// Element-wise passes per routed row of d, forward: the sender's permutation into
// destination order before the dispatch and its weighted sum of the returned rows (read and
// write each), and the receiver's sort into expert order and back (read and write each).
constexpr double kRoutedRowPasses = 8;

// The MoE layer: router, dispatch (all-to-all), the busiest rank's experts, combine; etp's
// gather and scatter of the routed rows count as tensor-parallel communication.
Pass MoeMlp(const Ctx& c) {
  const model::ModelConfig& m = c.in.config.model;
  const moe::MoEConfig& e = c.in.config.moe;
  const double d = m.d_model, k = e.top_k, E = e.num_experts;
  const double in_mats = model::MlpMatrices(e.activation) - 1;
  const double rows = c.skew * c.t_moe * k * c.l.ep * c.l.etp / E;  // per local expert
  const double f = double(e.d_expert) / c.l.etp;
  Pass p;
  // The engine's own grouped kernels where the dispatch keeps its counts on the device
  // (grouped_gemm_efficiency, when the file has one), else cuBLAS's products.
  const double eff = e.DeviceDispatchCounts(c.l.ep, c.l.etp) && c.hw.grouped_gemm_efficiency > 0
                         ? c.hw.grouped_gemm_efficiency
                         : c.hw.gemm_efficiency;
  const double experts =
      (E / c.l.ep) * (in_mats * Gemm(c, rows, f, d, eff) + Gemm(c, rows, d, f, eff));
  double shared = 0;
  if (e.num_shared_experts > 0) {
    const double s = double(e.num_shared_experts) * e.shared_hidden();
    shared = in_mats * Gemm(c, c.t_moe, s, d) + Gemm(c, c.t_moe, d, s);
  }
  // Routed rows: t_moe k sent (and summed on return), rows x E / ep received at the busiest
  // rank, each moved through memory kRoutedRowPasses / 2 times on each side.
  const double sent = c.t_moe * k, received = rows * (E / c.l.ep);
  p.compute = Gemm(c, c.t_moe, E, d) + experts + shared +
              Elementwise(c, c.t_moe * 10 * d + received * 3 * in_mats * f +
                                 (sent + received) * kRoutedRowPasses / 2 * d);
  p.ops = kRouterOps + kExpertOps * (E / c.l.ep) + (e.num_shared_experts > 0 ? kMlpOps : 0);
  p.comm_ops = (c.l.ep > 1 ? 2 : 0) + (c.l.etp > 1 ? 2 : 0);
  // One way, dispatch or return: their mean. In fp8 the dispatch (forward, and the gradient's
  // backward) carries the products' 8-bit inputs, the return stays 16-bit (as DeepSeek-V3's
  // recipe, arXiv 2412.19437 section 3.3.2).
  const double dispatch_b = c.fp8_dispatch ? 1 : c.b;
  const double exchange = AllToAll(c, c.t_moe * k * d * (dispatch_b + c.b) / 2);
  p.ep = ExposedExchange(exchange, experts, shared, e.overlap_chunks, E / c.l.ep);
  p.ep_backward = ExposedExchange(exchange, 2 * experts, 2 * shared, e.overlap_chunks, E / c.l.ep);
  const double etp_rows = c.skew * c.t_moe * k * c.l.etp;
  p.tp = 2 * RingStep(c.l.etp, etp_rows * d * c.b, LinkFor(c.hw, c.l.etp));
  return p;
}

Pass Scale(Pass a, double n) {
  a.compute *= n, a.attention *= n, a.tp *= n, a.cp *= n, a.ep *= n, a.ep_backward *= n, a.ops *= n, a.comm_ops *= n;
  return a;
}

Pass Add(Pass a, const Pass& b) {
  a.compute += b.compute, a.attention += b.attention, a.tp += b.tp, a.cp += b.cp, a.ep += b.ep;
  a.ep_backward += b.ep_backward, a.ops += b.ops, a.comm_ops += b.comm_ops;
  return a;
}

// One rank's chunks for one micro-batch, forward and backward (backward = 2 x forward
// work; recompute adds attention's core (selective) or the whole forward (full)).
StepTime MicroBatch(const Ctx& c, const std::vector<model::Stage>& chunks) {
  const model::ModelConfig& m = c.in.config.model;
  // Every dense layer costs the same, and every MoE layer: count them.
  const Pass attention = Attention(c), dense = Add(attention, DenseMlp(c));
  const Pass moe_layer = Add(attention, MoeMlp(c));
  Pass f;
  double head_again = 0;  // head chunking: Backward's second head forward
  for (const model::Stage& s : chunks) {
    double n_moe = 0, n_dense = 0;
    for (int64_t i = s.first_layer; i < s.End(m.n_layers); ++i) {
      (c.in.config.moe.IsMoELayer(i) ? n_moe : n_dense) += 1;
    }
    f = Add(f, Add(Scale(dense, n_dense), Scale(moe_layer, n_moe)));
    if (s.head) {
      const double v = double(m.vocab_size) / c.l.tp;
      f.compute += Gemm(c, c.t, v, m.d_model) + Elementwise(c, 3 * c.t * v);
      f.ops += kHeadOps;
      if (c.l.head_chunk_tokens > 0 && c.l.head_chunk_tokens < int64_t(c.t)) {
        head_again += Gemm(c, c.t, v, m.d_model) + Elementwise(c, 2 * c.t * v);
      }
    }
    if (s.embedding) f.compute += Elementwise(c, 2 * c.t * m.d_model), f.ops += kEmbeddingOps;
  }
  const bool full = c.l.recompute == model::Recompute::kFull;
  const double redo = (full ? f.compute : c.l.recompute == model::Recompute::kSelective ? f.attention : 0) +
                      head_again;
  // Every operation's fixed cost: forward, backward (twice the operations), full recompute;
  // a collective's once forward and once backward (and again under full recompute).
  f.compute += f.ops * c.op_s;
  StepTime t;
  t.compute = 3 * f.compute + redo + (full ? 3 : 2) * f.comm_ops * c.op_s;
  t.tp = (full ? 3 : 2) * f.tp;
  t.ep = (full ? 2 : 1) * f.ep + f.ep_backward;
  // The ring hides behind attention's core: forward once, backward twice the traffic.
  t.cp = (full ? 2 : 1) * std::max(0.0, f.cp - f.attention) + std::max(0.0, 2 * (f.cp - f.attention));
  if (c.l.pp > 1) {
    const Link& link = LinkFor(c.hw, c.in.world);
    const double msg = c.t * m.d_model * c.b / (c.sp ? c.l.tp : 1);
    t.pp = 2.0 * chunks.size() * (link.latency + msg / link.bandwidth);
  }
  return t;
}

}  // namespace

namespace {

// Elements one pipeline rank holds: (dense, routed experts).
std::pair<double, double> RankElements(const std::vector<std::pair<double, double>>& pieces,
                                       const std::vector<model::Stage>& chunks, int64_t n_layers,
                                       bool tied) {
  std::pair<double, double> sum;
  const auto add = [&](size_t i) { sum.first += pieces[i].first, sum.second += pieces[i].second; };
  for (const model::Stage& s : chunks) {
    if (s.embedding) add(0);
    for (int64_t i = s.first_layer; i < s.End(n_layers); ++i) add(1 + i);
    if (s.head) add(n_layers + 1);
    // The last stage's copy of a tied token table (its gradient is synced too).
    if (s.head && !s.embedding && tied) sum.first += pieces[0].first;
  }
  return sum;
}

// Data-parallel gradient sync and ZeRO of one pipeline rank, and its optimizer step:
// (exposed communication, optimizer seconds). `mb` is the rank's micro-batch time.
std::pair<double, double> DataParallel(const Ctx& c, std::pair<double, double> elements,
                                       const StepTime& mb) {
  const Layout& l = c.l;
  const int world = c.in.world;
  const int dense_group = l.dp(world) * l.cp, expert_group = l.edp(world);
  const Link& dense_link = LinkFor(c.hw, int64_t{world} / l.pp);
  const Link& expert_link = dense_link;  // edp spans the same ranks of the pipeline stage
  const double param_bytes = c.in.precision == "fp32" ? 4 : 2;
  const double buckets_d = std::max(1.0, std::ceil(4 * elements.first / c.in.config.train.bucket_bytes()));
  const double buckets_e = std::max(1.0, std::ceil(4 * elements.second / c.in.config.train.bucket_bytes()));
  // Gradients: reduce-scatter (ZeRO >= 1) or all-reduce (2 x) of 4-byte gradients; the
  // latency is paid once per bucket.
  const auto sync = [&](double n, int p, const Link& link, double buckets) {
    if (n <= 0) return 0.0;
    const double rs = RingStep(p, 4 * n, link) + (p > 1 ? (buckets - 1) * (p - 1) * link.latency : 0);
    return l.zero_stage == 0 ? 2 * rs : rs;
  };
  const double grads = sync(elements.first, dense_group, dense_link, buckets_d) +
                       sync(elements.second, expert_group, expert_link, buckets_e);
  const auto gathered = [&](double n, int p, const Link& link) {
    return n <= 0 ? 0.0 : RingStep(p, param_bytes * n, link);
  };
  const double gather = gathered(elements.first, dense_group, dense_link) +
                        gathered(elements.second, expert_group, expert_link);
  double exposed = 0;
  if (l.zero_stage == 3) {
    // Every micro-batch gathers the weights for forward and again for backward and
    // reduce-scatters its gradients; the next block's gather runs during this one's compute.
    const double per_mb = 2 * gather + grads;
    const double layers = double(c.in.config.model.n_layers) / l.pp;
    exposed = l.micro_batches * std::max(0.0, per_mb - mb.compute) + gather / std::max(1.0, layers);
  } else {
    // Buckets go while the last micro-batch's backward runs (not with ordered_grad_accum,
    // whose tree sum ends first); the last bucket is always exposed. ZeRO 1-2 then gather
    // the updated weights.
    const double backward = c.in.config.train.ordered_grad_accum && l.micro_batches > 1 ? 0 : mb.compute * 2 / 3;
    const double last = grads / std::max(1.0, buckets_d + buckets_e - 1);
    exposed = std::max(std::min(grads, last), grads - backward) + (l.zero_stage >= 1 ? gather : 0);
  }
  // AdamW: read weights, gradients and two moments, write weights and moments (f32), on the
  // rank's shard of the optimizer state under ZeRO >= 1.
  const double shard_d = l.zero_stage >= 1 ? dense_group : 1, shard_e = l.zero_stage >= 1 ? expert_group : 1;
  const double optimizer = 28.0 * (elements.first / shard_d + elements.second / shard_e) / c.bandwidth;
  return {exposed, optimizer};
}

}  // namespace

StepTime PredictStepTime(const PlanInputs& in, const Layout& l, const Hardware& hw, CostCache& cache) {
  const model::ModelConfig& m = in.config.model;
  Ctx c{.in = in, .l = l, .hw = hw};
  c.peak = hw.Peak(in.precision) * hw.ComputeShare(in.world);
  c.bandwidth = hw.memory_bandwidth * hw.ComputeShare(in.world);
  // runtime.cuda_graphs where the runtime captures (config::CheckCudaGraphs, the one rule):
  // the micro-batches replay as a CUDA graph, whose operations cost the file's
  // graph_op_latency each (op_latency when it gives none).
  const bool graphed = hw.graph_op_latency >= 0 && in.config.runtime.cuda_graphs &&
                       config::CheckCudaGraphs(in.config, in.world).ok();
  c.op_s = (graphed ? hw.graph_op_latency : hw.op_latency) *
           std::max(1.0, 1.0 / hw.ComputeShare(in.world));
  c.b = in.precision == "fp32" ? 4 : 2;
  // gemm.half_flops stands for a fixed time (launch and tail, F_half / (P e) seconds) fitted at
  // the file's 16-bit peak; fp8 runs the same tiles at its own peak, so the same seconds are
  // more FLOPs there.
  const bool fp8 = in.precision == "fp8" || in.precision == "fp8-cs";
  c.half_flops = hw.gemm_half_flops * (fp8 ? hw.Peak("fp8") / hw.Peak("bf16") : 1.0);
  c.cast_bytes = in.precision == "fp8" ? kFp8CastBytes : in.precision == "fp8-cs" ? kFp8CurrentScalingCastBytes : 0;
  c.fp8_dispatch = in.precision == "fp8";
  c.t = double(l.micro_batch_size) * m.seq_len / l.cp;
  c.sp = l.tp > 1 && in.config.parallel.sequence_parallel;
  c.t_moe = c.sp ? c.t / l.tp : c.t;
  c.skew = in.skew.ForEp(l.ep);
  const auto& stages = cache.Stages(in.config, l.pp, l.virtual_stages, l.pipeline_layers);
  const auto& pieces = cache.PieceParams(in.config, l.tp, l.etp, l.ep);
  // The slowest pipeline rank paces the pipeline; each rank then syncs its own gradients.
  StepTime slowest;
  double after = 0, after_dp = 0, after_opt = 0;
  for (int r = 0; r < l.pp; ++r) {
    const StepTime mb = MicroBatch(c, stages[r]);
    if (mb.total() > slowest.total()) slowest = mb;
    const auto [dp, opt] = DataParallel(c, RankElements(pieces, stages[r], m.n_layers, m.tie_embeddings), mb);
    if (dp + opt > after) after = dp + opt, after_dp = dp, after_opt = opt;
  }
  const int backward_cost = l.recompute == model::Recompute::kFull ? 3 : 2;
  const double idle = cache.Bubble(l.schedule, l.pp, l.micro_batches, l.virtual_stages, backward_cost);
  const double n = double(l.micro_batches);
  StepTime t;
  t.compute = n * slowest.compute + after_opt;
  t.tp = n * slowest.tp, t.cp = n * slowest.cp, t.ep = n * slowest.ep, t.pp = n * slowest.pp;
  t.bubble = n * slowest.total() * idle / (1 - idle);
  t.dp = after_dp;
  return t;
}

double ModelFlopsPerToken(const config::Config& config) { return EstimateCost(config).flops_per_token; }

}  // namespace switchyard::plan
