// The token permutation of the MoE dispatcher (moe/dispatcher.h) as kernels: sorting the
// kept (token, slot) assignments by expert, gathering rows into that order, and the
// gate-weighted combine back into token order, each with its backward. Rows are f32.
//
// Notation: N tokens, k slots per token, flat slot s = t * k + j, E experts, A kept
// assignments. The permuted order is (expert, token, slot). `inverse` (N, k) maps every
// flat slot to its permuted row a, or -1 when the assignment was dropped.
//
// Numerics. The CPU versions are the reference. Per token, ScatterAddRows and Combine add
// the token's rows in increasing a (= increasing expert) order, which is the order the
// dispatcher's original loop over a used; the CUDA versions do the same for k <= 8 with
// separately rounded multiplies and adds (no fused multiply-add), so for k <= 8 they give
// the CPU's bits. For k > 8 they add in slot order (deterministic, but a reordering of the
// float sum). No op uses float atomics; every result is deterministic.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"
#include "kernels/write.h"

namespace switchyard::kernels {

// Sorts the assignments by expert, stably (ties stay in token, then slot order).
//   experts (N, k) i32: global expert of every slot; kept (N, k) u8: nonzero to dispatch.
// Outputs, all (N * k) i64 on the inputs' device, written whole:
//   slot[a]    the flat slot of permuted row a: the A kept assignments in (expert, token,
//              slot) order, then the dropped slots in increasing order
//   token[a]   slot[a] / k
//   inverse[s] a for a kept slot s, -1 for a dropped one
// Returns the (E) kept assignments per expert on the host (A = their sum); on CUDA that is
// one small device->host copy and a wait for the stream. A kept assignment whose expert is
// outside [0, E) is a fatal error. CUDA: one stable radix sort (CUB) on the expert keys.
std::vector<int64_t> SortAssignments(const Tensor& experts, const Tensor& kept,
                                     int64_t num_experts, Tensor& token, Tensor& slot,
                                     Tensor& inverse, DeviceContext* ctx = nullptr);

// SortAssignments without the host counts: the same slot, token and inverse, and
// offsets (E + 1) i64 on the same device, offsets[e] = the first permuted row of expert e,
// offsets[E] = A, the number of kept assignments (the grouped GEMMs' device-side sizes,
// kernels/gemm.h). Nothing is read back and nothing waits. A kept assignment whose expert is
// outside [0, E) is a fatal error on the CPU; CUDA cannot say so without a wait, so it sorts
// such an assignment after the dropped ones, outside every expert's rows, and its inverse is
// -1 (as if dropped). The router's top-k cannot produce one.
void SortAssignmentsToOffsets(const Tensor& experts, const Tensor& kept, int64_t num_experts,
                              Tensor& token, Tensor& slot, Tensor& inverse, Tensor& offsets,
                              DeviceContext* ctx = nullptr);

// dst[r] = src[index[r]]: src (N, d), index (R) i64 with values in [0, N), dst (R, d), src
// and dst f32, bf16, i32 or u8 (the same dtype; rows are copied bit for bit), or src f32 and
// dst bf16 (each value rounded to nearest even: the bits of the f32 gather then Cast). The
// permute (h -> rows, in bf16 the experts' operand under bf16 activation storage) and any
// other row permutation (regroup / ungroup, a routing group's rows put in token order). CUDA does not check the index range: the index must come from
// SortAssignments or be built valid.
void GatherRows(const Tensor& src, const Tensor& index, Tensor& dst,
                DeviceContext* ctx = nullptr);

// The backward of the permute: dh[t] += sum of drows[inverse[t, j]] over the kept slots j
// of token t, in increasing row order; with Write::kSet, dh[t] = that sum started at +0 (the
// bits a zeroed dh would hold after the add; a token with nothing kept gets +0; dh is not
// read, so it need not be initialised). drows (A, d) f32, inverse (N, k) i64, dh (N, d) f32.
void ScatterAddRows(const Tensor& drows, const Tensor& inverse, Tensor& dh, Write write,
                    DeviceContext* ctx = nullptr);

// y[t] = sum over the kept slots s = t * k + j of gates[s] * out[inverse[s]], in increasing
// row order, plus extra[t] when `extra` is defined (added last: the shared experts).
// out (A, d) f32, gates (N, k) f32, inverse (N, k) i64, extra (N, d) f32 or undefined,
// y (N, d) f32 (written whole; a token with nothing kept gets zero, or extra[t]).
// kept: null, or (A, d) bf16 that gets every row some slot points to rounded to nearest even
// (what CombineBackward reads under bf16 activation storage; rows no slot points to are not
// written), in the same pass.
void Combine(const Tensor& out, const Tensor& gates, const Tensor& inverse, const Tensor& extra,
             Tensor& y, DeviceContext* ctx = nullptr, Tensor* kept = nullptr);

// The backward of Combine for the A kept rows, t = slot[a] / k:
//   dout[a] = gates[slot[a]] * dy[t]          (A, d)
//   dgates[slot[a]] = dot(dy[t], out[a])      (N, k); zero for the dropped slots
// dy (N, d) f32, out (A, d) f32 or bf16 (Combine's kept rows, widened as read), gates (N, k)
// f32, slot (A) i64 (the first A entries of SortAssignments' slot). The dot is accumulated in
// double on both devices. dout f32, or bf16: each product rounded as stored (the experts'
// bf16 operand in bf16 mode: the bits of the f32 dout then Cast, with no f32 copy).
// inverse: undefined, or (N, k) i64 (SortAssignments' inverse) when the rows may include
// dropped assignments after the kept ones (a device-sized dispatch plan, whose host does not
// know A): row a is kept iff inverse[slot[a]] == a; a dropped row gets dout[a] = 0 and its
// out[a] (never written) is not read.
void CombineBackward(const Tensor& dy, const Tensor& out, const Tensor& gates, const Tensor& slot,
                     Tensor& dout, Tensor& dgates, DeviceContext* ctx = nullptr,
                     const Tensor& inverse = Tensor());

// The router-entropy statistic of the MoE layer: sum over the elements of probs (any
// shape, f32) with p > 0 of -p * log(p), accumulated in double; a host value (on CUDA one
// small device->host copy and a wait for the stream).
double EntropySum(const Tensor& probs, DeviceContext* ctx = nullptr);

// EntropySum left on the device, for the training step's single readback
// (engine/core/step_readback.h): sum (1) f64 on the probs' device gets the value
// EntropySum returns (the same additions in the same order); nothing is read back.
void EntropySumInto(const Tensor& probs, Tensor& sum, DeviceContext* ctx = nullptr);

namespace cpu {
std::vector<int64_t> SortAssignments(const Tensor& experts, const Tensor& kept,
                                     int64_t num_experts, Tensor& token, Tensor& slot,
                                     Tensor& inverse);
void SortAssignmentsToOffsets(const Tensor& experts, const Tensor& kept, int64_t num_experts,
                              Tensor& token, Tensor& slot, Tensor& inverse, Tensor& offsets);
void GatherRows(const Tensor& src, const Tensor& index, Tensor& dst);
void ScatterAddRows(const Tensor& drows, const Tensor& inverse, Tensor& dh, Write write);
void Combine(const Tensor& out, const Tensor& gates, const Tensor& inverse, const Tensor& extra,
             Tensor& y, Tensor* kept);
void CombineBackward(const Tensor& dy, const Tensor& out, const Tensor& gates, const Tensor& slot,
                     const Tensor& inverse, Tensor& dout, Tensor& dgates);
double EntropySum(const Tensor& probs);
}  // namespace cpu

namespace cuda {
std::vector<int64_t> SortAssignments(const Tensor& experts, const Tensor& kept,
                                     int64_t num_experts, Tensor& token, Tensor& slot,
                                     Tensor& inverse, DeviceContext* ctx);
void SortAssignmentsToOffsets(const Tensor& experts, const Tensor& kept, int64_t num_experts,
                              Tensor& token, Tensor& slot, Tensor& inverse, Tensor& offsets,
                              DeviceContext* ctx);
void GatherRows(const Tensor& src, const Tensor& index, Tensor& dst, DeviceContext* ctx);
void ScatterAddRows(const Tensor& drows, const Tensor& inverse, Tensor& dh, Write write,
                    DeviceContext* ctx);
void Combine(const Tensor& out, const Tensor& gates, const Tensor& inverse, const Tensor& extra,
             Tensor& y, Tensor* kept, DeviceContext* ctx);
void CombineBackward(const Tensor& dy, const Tensor& out, const Tensor& gates, const Tensor& slot,
                     const Tensor& inverse, Tensor& dout, Tensor& dgates, DeviceContext* ctx);
double EntropySum(const Tensor& probs, DeviceContext* ctx);
void EntropySumInto(const Tensor& probs, Tensor& sum, DeviceContext* ctx);
}  // namespace cuda

}  // namespace switchyard::kernels
