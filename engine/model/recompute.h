// Activation recompute (`train.recompute`): what the decoder's Forward keeps for Backward,
// and what Backward computes again instead (Chen et al. 2016, "Training Deep Nets with
// Sublinear Memory Cost"; Korthikanti et al. 2022, "Reducing Activation Recomputation in
// Large Transformer Models", Megatron-LM's --recompute-granularity):
//
//   none       every activation Backward reads is kept.
//   selective  the core attention's output (softmax(q k^T / sqrt(hd)) v, the input of the
//              output projection) and its logsumexp are dropped; attention's Backward
//              recomputes them from the kept q, k and v (dense::CoreAttention). The (S, S)
//              probabilities are never kept in any mode (kernels/attention.h).
//   full       each block keeps only its input; Backward re-runs the block's forward from
//              it (the same kernels in the same order, with the same routing), then its
//              backward. An MoE block's forward repeats its all-to-all over ep.
//
// All three give bit-identical losses and gradients.
#pragma once

#include <string>

#include "engine/core/enum_names.h"
#include "engine/core/status.h"

namespace switchyard::model {

enum class Recompute { kNone, kSelective, kFull };
inline constexpr EnumName<Recompute> kRecomputeNames[] = {
    {Recompute::kNone, "none"}, {Recompute::kSelective, "selective"}, {Recompute::kFull, "full"}};

// "none", "selective", "full"; anything else names the config key train.recompute.
StatusOr<Recompute> ParseRecompute(const std::string& name);
const char* RecomputeName(Recompute mode);

// Whether the decoder's norms (norm1, a dense block's norm2, the final norm) write their
// outputs as the bf16 operands of the products that read them: under bf16 activation storage
// without tp (under tp the tp region's entry moves them in f32). The decoder and the dry-run's
// activation model both ask this.
inline bool NormsWriteBf16Operands(bool bf16_storage, bool tp) { return bf16_storage && !tp; }

}  // namespace switchyard::model
