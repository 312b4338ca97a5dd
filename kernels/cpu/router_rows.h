// One token's row of the router's backward that kernels/cpu/moe_routing.cc (softmax) and
// kernels/cpu/moe_scoring.cc (sigmoid) share.
#pragma once

#include <cstdint>

namespace switchyard::kernels::cpu {

// The gates' share of the gradient on the scores s (the probs for softmax) of one token:
// ds[idx_j] += dg_j, or with normalize (g_j = s_idx_j / Sk, Sk = sum_l s_idx_l)
// ds[idx_j] += (dg_j - sum_l dg_l g_l) / Sk, in double. idx, g and dg hold the token's k.
void AddGateShare(const float* s, const int32_t* idx, const float* g, const float* dg, int64_t k,
                  bool normalize, double* ds);

}  // namespace switchyard::kernels::cpu
