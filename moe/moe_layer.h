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
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/dist/communicator.h"
#include "moe/aux_loss.h"
#include "moe/capacity.h"
#include "moe/dispatcher.h"
#include "moe/experts.h"
#include "moe/moe_config.h"
#include "moe/router.h"

namespace switchyard::moe {

// Section 3's statistics as sums, so that adding (all-reducing) them over ranks gives the
// statistics of the whole data-parallel world whatever the layout.
struct MoEStats {
  std::vector<int64_t> tokens_per_expert;          // (E) top-k assignments, before dropping
  std::vector<int64_t> tokens_per_expert_kept;     // (E) assignments the experts processed
  int64_t tokens = 0;                              // tokens routed
  int64_t assignments = 0;                         // tokens * k
  double entropy_sum = 0;                          // sum over tokens of -sum_e p log p
  double aux_sum = 0, z_sum = 0;                   // sums over groups
  int64_t groups = 0;

  // Adds another rank's (or group's) sums.
  void Add(const MoEStats& other);
  // Sums over the ranks of `comm` in place (every rank ends with the totals). A
  // communicator on a CUDA device reduces through device memory ordered on ctx.
  void AllReduce(dist::Communicator& comm, DeviceContext* ctx = nullptr);

  int64_t dropped() const;                          // assignments - kept
  double dropped_fraction() const;                  // dropped / assignments
  double router_entropy() const;                    // mean over tokens
  double aux_mean() const;                          // mean over groups
  double z_mean() const;
  // Rows received by each ep rank's experts: sum of kept counts of its experts. (ep)
  std::vector<int64_t> TokensPerEpRank(int64_t ep) const;
  // Least, most and mean kept load over the experts, as shares of all kept assignments.
  double min_load_share() const;
  double max_load_share() const;
  double mean_load_share() const;
};

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
  Tensor gates;                                    // (N, k) router gates, N = G * T
  std::unique_ptr<DispatchPlan> plan;
  ExpertsActivations experts;
  Tensor expert_out;                               // (A, d) expert outputs back in expert order
  std::optional<ExpertsActivations> shared;
};

struct MoEForward {
  Tensor y;                                        // (N, d)
  MoEGroupValues groups;
  MoEStats stats;                                  // this rank's sums
  MoEActivations acts;
};

// The layer's parameters: router weight (replicated), local experts, optional shared
// experts, and the non-learned expert bias of aux-loss-free balancing.
class MoELayer {
 public:
  // ep: the expert-parallel communicator (its size is ep; a size-1 group, e.g.
  // dist::MakeLocalCommunicator(), does no communication). The layer keeps the pointer. Experts get their slice from the ep rank.
  // All parameters on one device; the router gradient is allocated there (zeroed on
  // ctx's stream; ctx required on CUDA).
  MoELayer(const MoEConfig& config, int64_t layer_id, dist::Communicator* ep, Tensor router_weight,
           Experts experts, std::optional<DenseMlp> shared, Tensor expert_bias,
           DeviceContext* ctx = nullptr);

  // Fresh weights from the counter-based generator (normal, std), keyed by parameter name
  // and global index, so every ep layout starts from the same model. With ctx the
  // parameters live on ctx's device (the same values as on the CPU), else on the CPU.
  static MoELayer Init(const MoEConfig& config, int64_t layer_id, dist::Communicator* ep,
                       uint64_t seed, float std = 0.02f, DeviceContext* ctx = nullptr);

  // h: (G * T, d) f32 on the parameters' device. first_token: the global index of h's
  // first token (keys the jitter and random second-expert draws). training selects
  // capacity_factor vs eval_capacity_factor and turns jitter on.
  MoEForward Forward(const Tensor& h, int64_t group_tokens, bool training, int64_t step,
                     int64_t first_token, DeviceContext* ctx = nullptr);

  // dy: (N, d). daux, dz: (G) dLoss/daux and dLoss/dz of each group. Returns dh (N, d)
  // and adds into every parameter gradient.
  Tensor Backward(const MoEActivations& acts, const Tensor& dy, std::span<const float> daux,
                  std::span<const float> dz, DeviceContext* ctx = nullptr);

  void ZeroGrad(DeviceContext* ctx = nullptr);

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
  MoEConfig config_;
  int64_t layer_id_;
  dist::Communicator* ep_;
  Tensor router_weight_, grad_router_weight_, expert_bias_;
  Experts experts_;
  std::optional<DenseMlp> shared_;
};

}  // namespace switchyard::moe
