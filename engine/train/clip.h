// Gradient clipping by the global norm (Pascanu et al. 2013; torch.nn.utils.clip_grad_norm_
// and Megatron's clip_grad_norm_fp32 over the whole model): every element of every
// trainable parameter's gradient counts exactly once however it is sharded or replicated.
// Call after the data-parallel gradient sync (GradSync), when replicas agree:
//
//   sumsq  = sum over kDense grads held whole        (identical on every rank)
//          + sum over kDense grads sharded over tp   (all-reduced over tp)
//          + sum over kExpert grads sharded over ep  (all-reduced over ep)
//          + sum over kExpert grads held whole       (not sharded: counted locally)
//   sumsq is then all-reduced over pp (each stage holds other layers), and
//   norm   = sqrt(sumsq)
//   clip:  when norm > max_norm, every grad *= max_norm / (norm + 1e-6)
//
// Every rank gets the same norm, so every replica scales identically. Each group may be
// left out (null) when it has one rank. Squares are summed in double per tensor; the
// cross-rank sums are f32 (the communicators have no f64).
// Limitation: a kExpert parameter sharded over etp as well as ep is not representable in
// the registry (one shard_dim), so etp > 1 is not handled here yet.
#pragma once

#include "engine/core/device_context.h"
#include "engine/dist/communicator.h"
#include "engine/dist/parallel_context.h"
#include "engine/model/parameter_registry.h"

namespace switchyard::train {

// The groups over which the parts of the sum of squares are all-reduced; null: one rank.
struct GradNormGroups {
  dist::Communicator* tp = nullptr;  // kDense grads with shard_dim >= 0
  dist::Communicator* ep = nullptr;  // kExpert grads with shard_dim >= 0
  dist::Communicator* pp = nullptr;  // the total, over pipeline stages
};

// tp(), ep() and pp() of a ParallelContext.
GradNormGroups NormGroupsOf(const dist::ParallelContext& pc);

// The global L2 norm of the gradients of every trainable parameter. Collective over the
// non-null groups.
double GlobalGradNorm(const model::ParameterRegistry& registry, const GradNormGroups& groups,
                      DeviceContext* ctx = nullptr);

// Computes the global norm and, when max_norm > 0 and the norm exceeds it, scales every
// trainable gradient by max_norm / (norm + 1e-6). Returns the norm before clipping.
// max_norm <= 0: no clipping (the norm is still computed and returned).
double ClipGradNorm(model::ParameterRegistry& registry, double max_norm,
                    const GradNormGroups& groups, DeviceContext* ctx = nullptr);

}  // namespace switchyard::train
