// The MoE layer (../shared/MODEL.md sections 2 and 3): it only orchestrates, one call per
// phase,
//   route (per group) -> admit (per group) -> dispatch over ep -> experts (over etp) ->
//   combine -> statistics
// and the mirror image in Backward. Each phase lives in its own file: routing of whole or
// tp-split groups (group_routing: router, aux_loss, capacity), the dispatcher, the experts
// (experts, expert_tp) and the statistics (moe_stats).
//
// Input h: (G * T, d), the G routing groups of T tokens this rank routes, one after the
// other. Capacity, the aux loss and the z-loss are per group. The experts are split over
// the ep group: ep rank r holds global experts [r * E_l, (r + 1) * E_l), E_l = E / ep.
//
// Devices: the layer's parameters live on one device (Init's ctx's, else the CPU); h, dy
// and every tensor the layer makes are on it, and every kernel runs on ctx's stream (ctx
// is required on CUDA, may be null on the CPU). Statistics and per-group values stay host
// values. Host synchronisations of one CUDA Forward: the router's per-group host results
// (admission counts, balance sums, aux and z; under tp also this rank's counts) and the
// dispatch plan's per-expert counts; Backward waits for nothing. ep = 1 never touches the
// communicator, so a CUDA layer may hold a host (local) one; ep > 1 on CUDA needs the NCCL
// communicator.
//
// Tensor (sequence) parallelism, MoEParallel::tp of P > 1 ranks: each routing group of T
// tokens is split over the tp ranks and routed whole on every tp rank from all-gathered
// router logits; moe/group_routing.h explains the split, the routing and its backward.
// Forward gets this rank's rows of G groups, (G * T/P, d), with group_tokens = T/P, and
// first_token = the global index of the first token of group 0 (the same on every tp
// rank). Each rank dispatches its own rows over ep as without tp (under Megatron's folding
// the ep group of the expert view contains the tp ranks) and back-propagates only its own
// rows, so the router's and the shared experts' gradients are partial, summed over tp by
// the gradient sync (both described ReplicatedOver(kTp, grad_summed = true)). Statistics
// count this rank's rows; groups, aux and z sums are reported by tp rank 0, so sums over
// tp x dp are the one-rank numbers. MoEGroupValues are the whole groups', the same on every
// tp rank.
//
// Expert tensor parallelism, MoEParallel::etp (moe/expert_tp.h; independent of tp, as in
// Megatron's MoE parallel folding): each expert's hidden units are split over etp
// (W1/W3 (E, d, f) on dim 2, W2 (E, f, d) and b1 (E, f) on dim 1; b2 whole, added by etp rank
// 0 only). The rows a rank's experts receive are all-gathered over etp, the experts run on
// their hidden slice, and the partial outputs are reduce-scattered back. The shared experts
// are dense: they follow tp (replicated), not etp.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/dist/comm_thread.h"
#include "engine/dist/communicator.h"
#include "engine/parallel/parameter.h"
#include "moe/aux_loss.h"
#include "moe/capacity.h"
#include "moe/dispatcher.h"
#include "moe/expert_tp.h"
#include "moe/experts.h"
#include "moe/group_routing.h"
#include "moe/moe_config.h"
#include "moe/moe_stats.h"
#include "moe/replication.h"
#include "moe/overlap.h"
#include "moe/router.h"

namespace switchyard::moe {

// What Backward needs from one Forward (kept by the caller; several may be in flight).
// N: this rank's rows (G * T/P under tp).
struct MoEActivations {
  int64_t groups = 0;                              // G
  int64_t group_tokens = 0;                        // T: the whole group's tokens
  std::vector<RouterOutput> router;                // (G) the whole groups' routing (under tp,
                                                   // input and its jitter draw: this rank's rows)
  std::vector<BalanceTerms> balance;               // (G) the whole groups' aux-loss terms
  Tensor gates;                                    // (N, k) router gates of this rank's rows
  Tensor experts_all;                              // (N, k) i32 chosen experts
  Tensor kept_all;                                 // (N, k) u8 admitted by capacity
  std::unique_ptr<DispatchPlan> plan;
  // The plan keeps its per-expert counts on the device (moe.dispatch_counts: device, one ep
  // rank, no etp): DispatchPlan::BuildDeviceSized with device_rows rows (a bound on the kept
  // assignments) and the device-sized experts.
  bool device_counts = false;
  int64_t device_rows = 0;
  bool all_kept = false;  // dropless admission kept every assignment (RoutedGroups)
  ExpertsActivations experts;
  Tensor expert_out;                               // (A, d) expert outputs back in expert order
                                                   // (bf16 under bf16 activation storage)
  std::optional<ExpertsActivations> shared;
  std::optional<EtpPlan> etp;                      // expert tensor parallelism only
  Tensor own_rows;                                 // a non-contiguous GroupLayout's
                                                   // (RoutedGroups::own_rows)
  // Hot-expert replication only (SetReplicaPlan): the dispatch destinations (N, k) i32 in
  // the plan's virtual layout, the rows of this rank's own experts (the first of the
  // grouped rows) and the replica slots' activations (the rest).
  Tensor destinations;
  int64_t owned_rows = 0;
  std::optional<ExpertsActivations> replica;
  // moe.overlap_chunks > 1 (moe/overlap.h): the chunks, and per chunk the experts'
  // activations (and etp plan) instead of `experts` (and `etp`).
  std::unique_ptr<ChunkedExchange> chunks;
  std::vector<ExpertsActivations> chunk_experts;
  std::vector<EtpPlan> chunk_etp;
};

struct MoEForward {
  Tensor y;                                        // (N, d)
  MoEGroupValues groups;
  MoEStats stats;                                  // this rank's sums
  MoEActivations acts;
};

// The groups a layer communicates in; ep is required (a size-1 group is fine), tp and etp
// may be null (none). The layer keeps the pointers.
struct MoEParallel {
  dist::Communicator* ep = nullptr;   // the experts are split over it (token all-to-all)
  dist::Communicator* tp = nullptr;   // each routing group's rows are split over it
  dist::Communicator* etp = nullptr;  // each expert's hidden units are split over it
  // Context parallelism: the routing group's rows are split over tp x cp (this group,
  // ParallelContext::tp_cp) rather than over tp alone; the router and the shared experts'
  // gradients stay partial over it (summed over tp by their description, over cp with the
  // dense gradients). Null: tp.
  dist::Communicator* group = nullptr;
};

// The layer's parameters: router weight (replicated), local experts, optional shared
// experts, and the non-learned expert bias of aux-loss-free balancing.
class MoELayer {
 public:
  // ep: the expert-parallel communicator (its size is ep; a size-1 group, e.g.
  // dist::MakeLocalCommunicator(), does no communication). The layer keeps the pointer.
  // `experts` must be ep rank r's slice [r * E_l, +E_l). All parameters on one device; the
  // router gradient is allocated there (zeroed on ctx's stream; ctx required on CUDA).
  MoELayer(const MoEConfig& config, int64_t layer_id, dist::Communicator* ep, Tensor router_weight,
           Experts experts, std::optional<DenseMlp> shared, Tensor expert_bias,
           DeviceContext* ctx = nullptr)
      : MoELayer(config, layer_id, MoEParallel{.ep = ep}, std::move(router_weight),
                 std::move(experts), std::move(shared), std::move(expert_bias), ctx) {}
  // The same under tensor and expert tensor parallelism (`experts` hold this etp rank's
  // hidden units [etp_rank * f / etp, +f / etp), ExpertsOptions::hidden_offset).
  MoELayer(const MoEConfig& config, int64_t layer_id, const MoEParallel& parallel,
           Tensor router_weight, Experts experts, std::optional<DenseMlp> shared,
           Tensor expert_bias, DeviceContext* ctx = nullptr);

  // Fresh weights from the counter-based generator (normal, std), keyed by parameter name
  // ("layers.<id>.moe.router.weight", ".moe.experts.w1", ".moe.shared.w1", ...) and global
  // element index (parallel::FillNormalBox), so every ep / etp / tp layout holds boxes of
  // the same model. Biases and the expert bias start at zero. With ctx the parameters live
  // on ctx's device (the same values as on the CPU), else on the CPU. Fails (SY_CHECK) with
  // MoEConfig's message naming parallel.ep / parallel.etp when they do not divide E / f.
  static MoELayer Init(const MoEConfig& config, int64_t layer_id, dist::Communicator* ep,
                       uint64_t seed, float std = 0.02f, DeviceContext* ctx = nullptr) {
    return Init(config, layer_id, MoEParallel{.ep = ep}, seed, std, ctx);
  }
  static MoELayer Init(const MoEConfig& config, int64_t layer_id, const MoEParallel& parallel,
                       uint64_t seed, float std = 0.02f, DeviceContext* ctx = nullptr) {
    return Init(config, layer_id, parallel, seed, std, std, ctx);
  }
  // The same with the output projections of the routed and shared experts (experts.w2,
  // shared.w2) drawn with out_std (Megatron's output_layer_init_method, e.g. the scaled
  // residual init), the router and the input projections with std.
  static MoELayer Init(const MoEConfig& config, int64_t layer_id, const MoEParallel& parallel,
                       uint64_t seed, float std, float out_std, DeviceContext* ctx = nullptr);

  // h: (G * T, d) f32 on the parameters' device. first_token: the global index of h's
  // first token (keys the jitter and random second-expert draws). training selects
  // capacity_factor vs eval_capacity_factor and turns jitter on. Under tp (P ranks):
  // h (G * T/P, d) is this rank's rows of each group in turn, group_tokens = T/P (the rows
  // per group here), and first_token the global index of group 0's first token (the same
  // on every tp rank). Collective over ep, tp and etp. layout: how each group's tokens lie
  // over the tp group when not in contiguous blocks (context parallelism,
  // moe/group_routing.h); first_token is then the group's first token. valid_tokens >= 0:
  // the statistics (MoEForward::stats) count only the first valid_tokens of the G x T
  // group tokens, the rest being an evaluation's padding rows (RoutingStats). rng_values:
  // undefined, or every layer's RouterRngValues for this step and first_token on the
  // layer's device (runtime.cuda_graphs: the router's draws read their keys there).
  MoEForward Forward(const Tensor& h, int64_t group_tokens, bool training, int64_t step,
                     int64_t first_token, DeviceContext* ctx = nullptr,
                     const GroupLayout& layout = {}, int64_t valid_tokens = -1,
                     const Tensor& rng_values = Tensor());

  // dy: (N, d). daux, dz: (G) dLoss/daux and dLoss/dz of each group (the same on every tp
  // rank). Returns dh (N, d) and adds into every parameter gradient (under tp the router's
  // and shared experts' are this rank's part; under etp b2's is etp rank 0's).
  Tensor Backward(const MoEActivations& acts, const Tensor& dy, std::span<const float> daux,
                  std::span<const float> dz, DeviceContext* ctx = nullptr);

  void ZeroGrad(DeviceContext* ctx = nullptr);

  // Hot-expert replication (moe/replication.h): from the next Forward, assignments are
  // dispatched by `plan` (built for this layer's E and ep group; empty: no replica) and
  // this rank runs its replica slots too. Replica weights are pulled from their owners at
  // the first Forward after this call or after MarkExpertsUpdated; each Backward pushes the
  // replicas' gradients into the owners' gradients. Call on every rank of the ep group with
  // the same plan, between steps (not between a Forward and its Backward). Not with etp.
  void SetReplicaPlan(const ReplicaPlan& plan, DeviceContext* ctx = nullptr);
  const ReplicaPlan& replica_plan() const { return replica_plan_; }
  // The owners' expert weights changed (an optimizer step, a load): replicas are refreshed
  // at the next Forward.
  void MarkExpertsUpdated() { replicas_stale_ = true; }
  const ExpertReplicas* replicas() const { return replicas_.get(); }

  // The layer's parameters as descriptions, named relative to the layer:
  //   router.weight (d, E)        dense, no weight decay; under tp ReplicatedOver(kTp, summed)
  //   experts.w1/w3 (E, d, f)     expert view over edp; Split(0) over ep, Split(2) over etp
  //   experts.w2 (E, f, d)        Split(0) over ep, Split(1) over etp
  //   experts.b1 (E, f), b2 (E, d) no weight decay; b1 Split(1) over etp, b2 whole on every
  //                               etp rank, ReplicatedOver(kTp = etp, summed)
  //   shared.w1, ... (whole)      dense; under tp ReplicatedOver(kTp, summed)
  //   expert_bias (E)             dense, not trainable (grad undefined)
  //   expert_load (E)             aux_loss_scope: global; dense, not trainable
  std::vector<parallel::Parameter> Parameters() const;

  const MoEConfig& config() const { return config_; }
  int64_t layer_id() const { return layer_id_; }
  Device device() const { return router_weight_.device(); }
  int64_t first_expert() const { return experts_.options().first; }
  Tensor router_weight() const { return router_weight_; }        // (d, E)
  Tensor grad_router_weight() const { return grad_router_weight_; }
  Tensor expert_bias() const { return expert_bias_; }            // (E), or undefined
  // aux_loss_scope: global's f (E) f32: the fractions of the previous optimizer step's
  // top-k assignments over the whole global batch; 1/E before the first step. Undefined
  // for the other scopes.
  Tensor expert_load() const { return expert_load_; }
  // After an optimizer step: expert_load_i = counts_i / sum_j counts_j, counts (E) the
  // step's assignments per expert over every micro-batch and data-parallel rank (unchanged
  // when the sum is 0). No-op unless aux_loss_scope is global.
  void UpdateExpertLoad(std::span<const int64_t> counts, DeviceContext* ctx = nullptr);
  // The layer's end of a training step, after the optimizer (moe/moe_layer_step.cc): `stats`
  // are the layer's statistics of the step summed over the whole world (the same on every
  // rank); `updated`: the optimizer changed the weights (a finite step); `replica_plan`: the
  // next hot-expert replica plan, or null to keep the current one. In order: the global aux
  // loss's expert load from the step's counts (aux_loss_scope: global; updated only), the
  // replicas marked stale and given the new plan (moe.replicate_hot_experts > 0), and
  // aux-loss-free balancing's expert bias moved by the counts (expert_bias_rate > 0; updated
  // only). Call on every rank of the layer's groups.
  void EndOfStep(const MoEStats& stats, bool updated, const ReplicaPlan* replica_plan,
                 DeviceContext* ctx = nullptr);
  Experts& experts() { return experts_; }
  const Experts& experts() const { return experts_; }
  DenseMlp* shared() { return shared_ ? &*shared_ : nullptr; }

 private:
  // The phases of Forward (route and admit are group_routing.h's, statistics
  // moe_stats.h's) and their mirrors in Backward.
  // Dispatch: this rank's kept assignments (acts.experts_all, kept_all) over ep; h (N, d)
  // -> (R, d) rows grouped by local expert. Builds acts.plan.
  Tensor Dispatch(const Tensor& h, MoEActivations& acts, DeviceContext* ctx) const;
  // Experts: (R, d) -> (R, d), over etp when split.
  Tensor RunExperts(const Tensor& grouped, MoEActivations& acts, DeviceContext* ctx) const;
  Tensor RunExpertsBackward(const MoEActivations& acts, const Tensor& dgrouped,
                            DeviceContext* ctx);
  // The same with replica slots: own experts on the first acts.owned_rows rows, the replica
  // slots on the rest.
  Tensor RunWithReplicas(const Tensor& grouped, MoEActivations& acts, DeviceContext* ctx) const;
  Tensor RunWithReplicasBackward(const MoEActivations& acts, const Tensor& dgrouped,
                                 DeviceContext* ctx);
  // The global token of each of this rank's rows (the replica split's key).
  std::vector<int64_t> RowTokens(const RoutedGroups& routed, int64_t first_token,
                                 DeviceContext* ctx) const;
  // Combine: the experts' rows back over ep, gate-weighted per token, plus the shared
  // experts of h: (N, d).
  Tensor CombineOutputs(const Tensor& h, const Tensor& expert_y, MoEActivations& acts,
                        DeviceContext* ctx) const;
  // Combine of acts.expert_out (and the shared experts' output), then what Backward keeps of
  // them: the returned rows (rounded under bf16 storage), none of the experts' outputs.
  Tensor CombineAndKeep(MoEActivations& acts, DeviceContext* ctx) const;
  // Backward runs the same helpers' mirrors in reverse order:
  //   CombineOutputsBackward -> RunExpertsBackward -> DispatchBackward -> RouteGroupsBackward
  // CombineOutputs' mirror: dh (N, d) = the shared experts' dx (or, without shared experts,
  // allocated and not yet written: DispatchBackward sets it), dgates (N, k) the gate
  // gradients; returns the experts' output gradient grouped by local expert (R, d).
  Tensor CombineOutputsBackward(const MoEActivations& acts, const Tensor& dy, Tensor& dgates,
                                Tensor& dh, DeviceContext* ctx);
  // Dispatch's mirror: the experts' input gradient (R, d) back over ep into dh (N, d): added
  // to the shared experts' dx, else written.
  void DispatchBackward(const Tensor& dgrouped_x, const MoEActivations& acts, Tensor& dh,
                        DeviceContext* ctx) const;
  // Dispatch, experts and combine in moe.overlap_chunks chunks (moe/overlap.h, in
  // moe_layer_overlap.cc): h (N, d) -> y (N, d), the same bits as the three above.
  Tensor ForwardOverlapped(const Tensor& h, MoEActivations& acts, DeviceContext* ctx);
  // Their backward: adds the routed and shared experts' part into dh (N, d, returned) and
  // the parameter gradients; dgates (N, k) gets the combine's gate gradients.
  Tensor BackwardOverlapped(const MoEActivations& acts, const Tensor& dy, Tensor& dgates,
                            DeviceContext* ctx);
  int tp_rank() const { return group_ ? group_->rank() : 0; }  // this rank's piece of a group
  int etp_size() const { return etp_ ? etp_->size() : 1; }

  MoEConfig config_;
  int64_t layer_id_;
  dist::Communicator* ep_;
  dist::Communicator* tp_ = nullptr;     // dense tp: the router's and shared experts' description
  dist::Communicator* group_ = nullptr;  // the ranks a routing group's rows are split over
  dist::Communicator* etp_ = nullptr;
  Tensor router_weight_, grad_router_weight_, expert_bias_, expert_load_;
  Experts experts_;
  std::optional<DenseMlp> shared_;
  ReplicaPlan replica_plan_;
  std::unique_ptr<ExpertReplicas> replicas_;  // null without replicas
  bool replicas_stale_ = true;
  std::unique_ptr<dist::CommThread> comm_thread_;  // the chunks' exchanges over ep
};

}  // namespace switchyard::moe
