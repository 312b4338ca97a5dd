// Finding where a step's numbers stopped being finite (train.on_nonfinite,
// docs/failures.md): the first trainable parameter, in registry order, whose gradient holds
// a NaN or an Inf, named with its expert when it is a routed expert's weight.
#pragma once

#include <string>

#include "engine/dist/communicator.h"
#include "engine/parallel/parameter.h"
#include "engine/parallel/zero.h"

namespace switchyard::parallel {

// This rank's first trainable parameter whose gradient (its owned elements under ZeRO, the
// whole local box otherwise) is not finite: "layers.1.moe.experts.w1 (expert 5)" for a
// routed expert's weight (global dim 0 is the expert), the plain name otherwise; "" when
// every gradient is finite. Reads device gradients through a host copy.
std::string FirstNonFiniteGrad(const parallel::ParameterRegistry& registry,
                               const parallel::ZeroShards* zero);

// FirstNonFiniteGrad over the world: the answer of the lowest rank that has one ("" when
// none has), the same on every rank. Collective over world (a host communicator).
std::string AgreeFirstNonFiniteGrad(const parallel::ParameterRegistry& registry,
                                    const parallel::ZeroShards* zero, dist::Communicator& world);

}  // namespace switchyard::parallel
