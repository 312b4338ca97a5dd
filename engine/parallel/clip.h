// Gradient clipping by the global norm (Pascanu et al. 2013; torch.nn.utils.clip_grad_norm_
// and Megatron's clip_grad_norm_fp32 over the whole model): every element of every
// trainable parameter's gradient counts exactly once however it is sharded or replicated.
// Call after the data-parallel gradient sync (GradSync), when replicas agree. The rule
// reads only the parameter descriptions (engine/parallel/parameter.h):
//
//   a rank adds a parameter's sum of squares iff its coordinate on every axis the
//   parameter is replicated over is 0 (it is the one owner of that box);
//   sumsq = the ordered f64 sum of the owners' squares over the world
//   norm  = sqrt(sumsq)
//   clip:  when norm > max_norm, every grad *= max_norm / (norm + 1e-6)
//
// Boxes split over tp, ep, etp or pp are each owned once, so any layout gives the norm of
// the one-rank model up to the order of the sum. Every rank gets the same norm, so every
// replica scales identically.
//
// Under ZeRO (engine/parallel/zero.h, stage >= 1) each rank reads only the gradient of the
// elements it owns (ZeroShards::OwnedGrad), partitioned over the parameter's shard axes:
// the rule's axes are then replicated minus those, and only the owned gradients are scaled
// (the optimizer reads no other).
#pragma once

#include <vector>

#include "engine/core/device_context.h"
#include "engine/dist/communicator.h"
#include "engine/dist/parallel_context.h"
#include "engine/parallel/parameter.h"
#include "engine/parallel/zero.h"

namespace switchyard::parallel {

// The global L2 norm of the gradients of every trainable parameter. Collective over
// pc.world() (a host communicator).
double GlobalGradNorm(const parallel::ParameterRegistry& registry,
                      const dist::ParallelContext& pc, DeviceContext* ctx = nullptr,
                      const parallel::ZeroShards* zero = nullptr);

// GlobalGradNorm at a training step's end: with the step's readback window open on ctx
// (DeviceContext::step_readback, engine/core/step_readback.h) the sums of squares are
// written into its buffer and the buffer is read back in its one copy, the values landing
// in `slots` (for the step's PendingSums); the same norm, bit for bit. Without a window:
// GlobalGradNorm, `slots` empty.
double GlobalGradNormAtStepEnd(const parallel::ParameterRegistry& registry,
                               const dist::ParallelContext& pc, DeviceContext* ctx,
                               const parallel::ZeroShards* zero, std::vector<double>* slots);

// The factor the clip multiplies every gradient by: max_norm / (norm + 1e-6) when max_norm > 0
// and norm > max_norm, else 1. The trainer hands it to Optimizer::Step, which applies it
// inside the update (no separate pass over the gradients).
float ClipScale(double norm, double max_norm);

// Computes the global norm and, when max_norm > 0 and the norm exceeds it, scales every
// trainable gradient by max_norm / (norm + 1e-6). Returns the norm before clipping.
// max_norm <= 0: no clipping (the norm is still computed and returned).
double ClipGradNorm(parallel::ParameterRegistry& registry, double max_norm,
                    const dist::ParallelContext& pc, DeviceContext* ctx = nullptr,
                    const parallel::ZeroShards* zero = nullptr);

}  // namespace switchyard::parallel
