// The MoE layer's settings (../shared/MODEL.md section 2), with one Validate() that names
// the key and the value it rejects.
#pragma once

#include "dense/mlp.h"

#include <cstdint>
#include <string>

#include "engine/core/enum_names.h"
#include "engine/core/status.h"

namespace switchyard::moe {

// The experts' activation: the dense layers' enum (dense/mlp.h), one for the whole model.
using dense::Activation;
using dense::ActivationName;
enum class SecondExpertPolicy { kAll, kRandom };  // GShard; top-2 only
enum class DropPolicy { kPosition, kProbability };
// How the router turns logits into scores: softmax over the experts (Switch, GShard,
// Mixtral) or an independent sigmoid per expert (DeepSeek-V3).
enum class ScoreFunction { kSoftmax, kSigmoid };
// Over which tokens the load-balancing loss's f and P are taken: each routing group (Switch),
// each sequence of a group (DeepSeek-V3's sequence-wise loss), or f over the whole global
// batch of the previous step (global-batch balancing, Qwen).
enum class AuxLossScope { kGroup, kSequence, kGlobal };
// How the token exchange over ep travels (docs/moe-layer.md): one flat all-to-all, or
// hierarchical over nodes (dist::HierarchicalCommunicator); the results are bit-identical.
enum class Dispatcher { kFlat, kHierarchical };
// How the expert bias follows the step's loads (docs/model.md, "Expert bias"): by
// expert_bias_rate times the sign of each expert's deviation from the mean load
// (DeepSeek-V3, Wang et al.'s Algorithm 1), or times the deviation relative to the mean load
// (Wang et al.'s proportional variant, their update for softmax scores).
enum class ExpertBiasUpdate { kSign, kProportional };

// Where the dispatch's per-expert row counts live on one expert-parallel rank
// (moe.dispatch_counts): on the device, read there by the experts' grouped products (no
// host wait per layer; kernels/gemm.h's device-sized products), or copied to the host for
// host-sized grouped products (cuBLAS on CUDA; one wait per layer and micro-batch). The
// results are bit-identical on the CPU. Only one ep rank, no etp, no overlap chunks and no
// replicas can use the device; every other layout copies the counts whatever this says.
enum class DispatchCounts { kDevice, kHost };
inline constexpr EnumName<DispatchCounts> kDispatchCountsNames[] = {
    {DispatchCounts::kDevice, "device"}, {DispatchCounts::kHost, "host"}};

// dense::ParseActivation naming the key moe.activation.
StatusOr<Activation> ParseActivation(const std::string& name);
StatusOr<SecondExpertPolicy> ParseSecondExpertPolicy(const std::string& name);
StatusOr<DropPolicy> ParseDropPolicy(const std::string& name);
StatusOr<ScoreFunction> ParseScoreFunction(const std::string& name);
StatusOr<AuxLossScope> ParseAuxLossScope(const std::string& name);
const char* SecondExpertPolicyName(SecondExpertPolicy p);
const char* DropPolicyName(DropPolicy p);
const char* ScoreFunctionName(ScoreFunction s);
const char* AuxLossScopeName(AuxLossScope s);
StatusOr<Dispatcher> ParseDispatcher(const std::string& name);
StatusOr<ExpertBiasUpdate> ParseExpertBiasUpdate(const std::string& name);
const char* ExpertBiasUpdateName(ExpertBiasUpdate u);
const char* DispatcherName(Dispatcher d);

struct MoEConfig {
  int64_t d_model = 0;            // d; required
  int64_t num_experts = 8;        // E
  int64_t layer_freq = 2;         // layer i is MoE iff i % layer_freq == layer_freq - 1
  int64_t top_k = 1;              // k, 1 <= k <= E
  int64_t d_expert = 0;           // f, each expert's hidden size; required
  Activation activation = Activation::kGelu;
  bool bias = false;              // experts (and shared experts) carry b1 (f) and b2 (d)
  bool normalize_gates = false;   // divide each token's k gates by their sum
  // s: the routed experts' combined output is s * sum_k g_k E_k(x) (DeepSeek-V3's
  // routed_scaling_factor, Megatron's --moe-router-topk-scaling-factor); > 0, 1 by default.
  float routed_scaling_factor = 1.0f;
  // The routers' learning rate is train.lr (and its schedule) times this; > 0, 1 by default.
  // For studies that make the router move faster than the rest (docs/experiments/zloss.md).
  float router_lr_scale = 1.0f;
  ScoreFunction score = ScoreFunction::kSoftmax;  // softmax | sigmoid (DeepSeek-V3)
  int64_t route_groups = 0;       // G > 0: node-limited routing over G groups of E/G experts
  int64_t route_group_topk = 0;   // M: the best groups a token may choose from (1 <= M <= G)
  SecondExpertPolicy second_expert_policy = SecondExpertPolicy::kAll;
  float jitter_eps = 0.0f;        // training-only multiplicative router-input noise
  float expert_bias_rate = 0.0f;  // aux-loss-free balancing (DeepSeek-V3) when > 0
  ExpertBiasUpdate expert_bias_update = ExpertBiasUpdate::kSign;  // sign | proportional
  float capacity_factor = 1.25f;  // training; <= 0 means dropless
  float eval_capacity_factor = 2.0f;
  DropPolicy drop_policy = DropPolicy::kPosition;
  float aux_loss_coef = 0.01f;
  AuxLossScope aux_loss_scope = AuxLossScope::kGroup;
  float z_loss_coef = 0.0f;
  int64_t num_shared_experts = 0;  // dense MLPs applied to every token (DeepSeek)
  int64_t d_shared = 0;            // hidden size of each shared expert; 0 means d_expert
  uint64_t seed = 1234;            // keys the jitter and random second-expert draws
  int64_t seq_len = 0;             // S, mirrors model.seq_len (aux_loss_scope: sequence);
                                   // 0: a routing group is one sequence
  Dispatcher dispatcher = Dispatcher::kFlat;  // the ep token exchange: flat | hierarchical
  // Hot-expert relief (moe/replication.h): the replicate_hot_experts most loaded experts
  // (by the world's counts of the last replicate_every steps) get replicas on the least
  // loaded ranks of their ep group; 0: none. 0 <= N < num_experts; replicate_every >= 1.
  int64_t replicate_hot_experts = 0;
  int64_t replicate_every = 1;
  // All-to-all / compute overlap (docs/moe-layer.md "Overlap"): each ep rank's local experts
  // are cut into this many chunks of whole experts after admission; chunk i+1's rows travel
  // while chunk i's experts compute. 1: no chunks. Must not exceed E / ep.
  int64_t overlap_chunks = 1;
  DispatchCounts dispatch_counts = DispatchCounts::kDevice;  // device | host

  // Checks every field alone and together ("moe.top_k=3 exceeds moe.num_experts=2").
  Status Validate() const;
  bool operator==(const MoEConfig&) const = default;  // every field (the planner's caches)
  // The node-limited routing keys alone: G divides E, 1 <= M <= G, top_k <= M * E / G.
  Status ValidateRouteGroups() const;
  // Experts per rank for an ep-way split; an error when E % ep != 0.
  StatusOr<int64_t> ExpertsPerRank(int64_t ep) const;
  // Each expert's hidden units per rank under expert tensor parallelism (etp ranks split
  // d_expert); an error naming parallel.etp and moe.d_expert when etp does not divide it.
  StatusOr<int64_t> ExpertHiddenPerRank(int64_t etp) const;
  // overlap_chunks chunks of whole experts fit an ep-way split (at most E / ep); an error
  // naming moe.overlap_chunks, moe.num_experts and parallel.ep otherwise.
  Status CheckOverlapChunks(int64_t ep) const;
  // Whether a layer's dispatch keeps its per-expert counts on the device (dispatch_counts,
  // and a layout that allows it: one ep rank, no etp, no overlap chunks, no replicas). The
  // MoE layer and the dry-run's memory estimate both ask this.
  bool DeviceDispatchCounts(int64_t ep, int64_t etp) const {
    return dispatch_counts == DispatchCounts::kDevice && ep == 1 && etp == 1 &&
           overlap_chunks <= 1 && replicate_hot_experts == 0;
  }
  // Whether the combine's backward writes the experts' incoming gradient rows in bf16, their
  // products' operand (which also crosses ep back at 2 bytes): with bf16 products, when the
  // experts read the rows only in products (no b2 gradient: bias off) and the rows take the
  // plain path (no etp, no replicas, no overlap chunks). The MoE layer and the dry-run's
  // memory estimate both ask this.
  bool ExpertGradRowsInBf16(bool bf16_products, int64_t etp, bool replicas) const {
    return bf16_products && !bias && etp == 1 && !replicas && overlap_chunks <= 1;
  }
  // Whether a training forward keeps the layer's input h (what it was given) for the
  // backward: as the router's input when it is not jittered (a jittered router keeps h *
  // noise and draws the noise again, moe/router.h), and as the shared experts' input. The
  // dry-run's memory estimate asks this; the layer holds what it reads.
  bool KeepsLayerInput() const { return jitter_eps <= 0.0f || num_shared_experts > 0; }
  // Whether decoder layer i is an MoE layer (MODEL.md section 1).
  bool IsMoELayer(int64_t i) const { return i % layer_freq == layer_freq - 1; }
  int64_t shared_hidden() const { return d_shared > 0 ? d_shared : d_expert; }
  // Experts per routing group of node-limited routing (E / G; E when off).
  int64_t experts_per_route_group() const {
    return route_groups > 0 ? num_experts / route_groups : num_experts;
  }
};

}  // namespace switchyard::moe
