// The MoE layer (../shared/MODEL.md sections 2 and 3): it only orchestrates
//   route (per group) -> capacity (per group) -> dispatch over ep -> experts -> combine
// and the mirror image in Backward. Each phase lives in its own file (router, capacity,
// aux_loss, dispatcher, experts).
//
// Input h: (G * T, d), the G routing groups of T tokens this rank routes, one after the
// other. Capacity, the aux loss and the z-loss are per group. The experts are split over
// the ep group: ep rank r holds global experts [r * E_l, (r + 1) * E_l), E_l = E / ep.
//
// Devices: the layer's parameters live on one device (Init's ctx's, else the CPU); h, dy
// and every tensor the layer makes are on it, and every kernel runs on ctx's stream (ctx
// is required on CUDA, may be null on the CPU). Statistics and per-group values stay host
// values. Host synchronisations of one CUDA Forward: the router's per-group host results
// (admission counts, balance sums, aux and z) and the dispatch plan's per-expert counts;
// Backward waits for nothing. ep = 1 never touches the communicator, so a CUDA layer may
// hold a host (local) one; ep > 1 on CUDA needs the NCCL communicator.
//
// Tensor parallelism (MoEParallel::tp, with sequence parallelism in the decoder): each
// routing group is spread over the tp ranks, rank r holding its rows [r*T/tp, (r+1)*T/tp)
// (Forward gets G = 1 group of T/tp rows). MODEL.md section 4 keeps the group whole: the
// router's input rows are all-gathered over tp and every tp rank routes the whole group,
// exactly as one rank would (top-k, admission in token order or by probability, aux,
// z, jitter keyed by global token index), then dispatches its own rows. Backward
// all-gathers the gates' gradients so every tp rank runs the router's backward on the whole
// group: the router's gradient is then the whole one on every tp rank (replicated over tp,
// not summed), and each rank keeps its own rows of dh. The shared experts see only a rank's
// rows (their gradients are summed over tp). Statistics count the whole group on tp rank 0
// (zeros on the others), so sums over tp x dp are the one-rank numbers.
//
// Expert tensor parallelism (MoEParallel::etp, moe/expert_tp.h): each expert's hidden units
// are split over etp; the rows a rank's experts receive are gathered over etp and the
// partial outputs reduce-scattered back.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/dist/communicator.h"
#include "engine/parallel/parameter.h"
#include "moe/aux_loss.h"
#include "moe/capacity.h"
#include "moe/dispatcher.h"
#include "moe/expert_tp.h"
#include "moe/experts.h"
#include "moe/moe_config.h"
#include "moe/moe_stats.h"
#include "moe/router.h"

namespace switchyard::moe {

// Per-group values the layer reports (for `switchyard moe-layer` and tests).
struct MoEGroupValues {
  std::vector<float> aux;                          // (G) aux of each group
  std::vector<float> z;                            // (G)
  std::vector<int64_t> tokens_per_expert_kept;     // (G, E) after dropping
  std::vector<int64_t> dropped;                    // (G) dropped assignments
};

// What Backward needs from one Forward (kept by the caller; several may be in flight).
struct MoEActivations {
  int64_t groups = 0, group_tokens = 0;
  std::vector<RouterOutput> router;                // per group
  std::vector<LoadBalanceSums> balance;            // per group
  Tensor gates;                                    // (N, k) router gates, N = G * T (the
                                                   // whole groups under tp)
  Tensor experts_all;                              // (N, k) i32 chosen experts
  Tensor kept_all;                                 // (N, k) u8 admitted by capacity
  std::unique_ptr<DispatchPlan> plan;
  ExpertsActivations experts;
  Tensor expert_out;                               // (A, d) expert outputs back in expert order
  std::optional<ExpertsActivations> shared;
  std::optional<EtpPlan> etp;                      // expert tensor parallelism only
};

struct MoEForward {
  Tensor y;                                        // (N, d)
  MoEGroupValues groups;
  MoEStats stats;                                  // this rank's sums
  MoEActivations acts;
};

// The layer's parameters: router weight (replicated), local experts, optional shared
// experts, and the non-learned expert bias of aux-loss-free balancing.
// The groups a layer communicates in; ep is required (a size-1 group is fine), tp and etp
// may be null (none).
struct MoEParallel {
  dist::Communicator* ep = nullptr;
  dist::Communicator* tp = nullptr;   // the routing group's rows are split over it
  dist::Communicator* etp = nullptr;  // each expert's hidden units are split over it
};

class MoELayer {
 public:
  // ep: the expert-parallel communicator (its size is ep; a size-1 group, e.g.
  // dist::MakeLocalCommunicator(), does no communication). The layer keeps the pointer. Experts get their slice from the ep rank.
  // All parameters on one device; the router gradient is allocated there (zeroed on
  // ctx's stream; ctx required on CUDA).
  MoELayer(const MoEConfig& config, int64_t layer_id, dist::Communicator* ep, Tensor router_weight,
           Experts experts, std::optional<DenseMlp> shared, Tensor expert_bias,
           DeviceContext* ctx = nullptr)
      : MoELayer(config, layer_id, MoEParallel{.ep = ep}, std::move(router_weight),
                 std::move(experts), std::move(shared), std::move(expert_bias), ctx) {}
  // The same under tensor and expert tensor parallelism (experts hold this etp rank's
  // hidden units).
  MoELayer(const MoEConfig& config, int64_t layer_id, const MoEParallel& parallel,
           Tensor router_weight, Experts experts, std::optional<DenseMlp> shared,
           Tensor expert_bias, DeviceContext* ctx = nullptr);

  // Fresh weights from the counter-based generator (normal, std), keyed by parameter name
  // and global index, so every ep layout starts from the same model. With ctx the
  // parameters live on ctx's device (the same values as on the CPU), else on the CPU.
  static MoELayer Init(const MoEConfig& config, int64_t layer_id, dist::Communicator* ep,
                       uint64_t seed, float std = 0.02f, DeviceContext* ctx = nullptr) {
    return Init(config, layer_id, MoEParallel{.ep = ep}, seed, std, ctx);
  }
  static MoELayer Init(const MoEConfig& config, int64_t layer_id, const MoEParallel& parallel,
                       uint64_t seed, float std = 0.02f, DeviceContext* ctx = nullptr);

  // h: (G * T, d) f32 on the parameters' device. first_token: the global index of h's
  // first token (keys the jitter and random second-expert draws). training selects
  // capacity_factor vs eval_capacity_factor and turns jitter on. Under tp: G = 1, h is this
  // rank's T rows of the group of tp * T, and first_token the group's first token.
  MoEForward Forward(const Tensor& h, int64_t group_tokens, bool training, int64_t step,
                     int64_t first_token, DeviceContext* ctx = nullptr);

  // dy: (N, d). daux, dz: (G) dLoss/daux and dLoss/dz of each group. Returns dh (N, d)
  // and adds into every parameter gradient.
  Tensor Backward(const MoEActivations& acts, const Tensor& dy, std::span<const float> daux,
                  std::span<const float> dz, DeviceContext* ctx = nullptr);

  void ZeroGrad(DeviceContext* ctx = nullptr);

  // "router.weight", "experts.w1", ..., "shared.w1", ..., "expert_bias": the layer's
  // parameters as descriptions (routed experts in the expert view, over edp, split over ep
  // on dim 0 and over etp on the hidden dim).
  std::vector<parallel::Parameter> Parameters() const;

  const MoEConfig& config() const { return config_; }
  int64_t layer_id() const { return layer_id_; }
  Device device() const { return router_weight_.device(); }
  int64_t first_expert() const { return experts_.options().first; }
  Tensor router_weight() const { return router_weight_; }        // (d, E)
  Tensor grad_router_weight() const { return grad_router_weight_; }
  Tensor expert_bias() const { return expert_bias_; }            // (E), or undefined
  Experts& experts() { return experts_; }
  const Experts& experts() const { return experts_; }
  DenseMlp* shared() { return shared_ ? &*shared_ : nullptr; }

 private:
  // The phases of Forward and Backward.
  Tensor GatherGroup(const Tensor& h, DeviceContext* ctx) const;
  void Route(const Tensor& group_h, int64_t group_tokens, bool training, int64_t step,
             int64_t first_token, MoEForward& out, DeviceContext* ctx);
  Tensor OwnRows(const Tensor& whole) const;
  Tensor RunExperts(const Tensor& grouped, MoEActivations& acts, DeviceContext* ctx) const;
  Tensor RunExpertsBackward(const MoEActivations& acts, const Tensor& dgrouped, DeviceContext* ctx);
  void RouterBackwardAll(const MoEActivations& acts, const Tensor& dgates,
                         std::span<const float> daux, std::span<const float> dz, Tensor& dh,
                         DeviceContext* ctx);
  int tp_size() const { return tp_ ? tp_->size() : 1; }
  int tp_rank() const { return tp_ ? tp_->rank() : 0; }
  int etp_size() const { return etp_ ? etp_->size() : 1; }

  MoEConfig config_;
  int64_t layer_id_;
  dist::Communicator* ep_;
  dist::Communicator* tp_ = nullptr;
  dist::Communicator* etp_ = nullptr;
  Tensor router_weight_, grad_router_weight_, expert_bias_;
  Experts experts_;
  std::optional<DenseMlp> shared_;
};

}  // namespace switchyard::moe
