// Embedding lookups (MODEL.md section 1: x0 = wte[tokens] + wpe[positions]): gather rows of
// a table by id, and the backward scatter-add, where a row used by several tokens receives
// the sum of their gradients; plus the learned position table added by sequence index.
//
// Shapes: ids (N) i32 — any shape, read flat; table, dtable (V, d); out, dout (N, d) — or
// any shape (..., d) with N rows. Tables and activations f32, contiguous. An id outside
// [0, V) is a fatal check naming it (the data loader validates tokens against the
// vocabulary first). The public ops check the arguments (kernels/embedding.cc) and run
// kernels/cpu/embedding.cc (the reference) or kernels/cuda/embedding.cu. On CUDA the id
// check costs one 8-byte device->host copy per lookup (a stream synchronisation): the
// kernels record the first bad position on the device and the op reads it back; a caller
// that checked the ids on the host (IdCheck::kOnHost: the trainer's micro-batches,
// engine/train/runtime.h) skips it, and on CUDA a bad id is then skipped, not reported. The CUDA
// backward sorts the ids (stable) and sums each id's rows in the CPU's order for an id with
// at most 64 rows (bit-identical dtable rows); a hot id's rows are summed in parallel pieces
// of 64, then the pieces in order: deterministic, equal to the CPU to rounding.
#pragma once

#include <cstdint>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"

namespace switchyard::kernels {

// Who checks the ids against the table: the op (on CUDA a readback per call), or the caller
// already did on the host (the CPU implementation checks anyway: it reads host memory).
enum class IdCheck { kOnDevice, kOnHost };

// out[i, :] = table[ids[i], :].
void EmbeddingForward(const Tensor& ids, const Tensor& table, Tensor& out,
                      DeviceContext* ctx = nullptr, IdCheck check = IdCheck::kOnDevice);
// dtable[ids[i], :] += dout[i, :] for every i (accumulates; repeated ids sum).
void EmbeddingBackward(const Tensor& ids, const Tensor& dout, Tensor& dtable,
                       DeviceContext* ctx = nullptr, IdCheck check = IdCheck::kOnDevice);

// Learned positions: x (B, S, d)[b, s, :] += wpe (S_max, d)[position_offset + s, :].
// Checks position_offset + S <= S_max.
void AddPositionEmbedding(Tensor& x, const Tensor& wpe, int64_t position_offset = 0,
                          DeviceContext* ctx = nullptr);
// dwpe[position_offset + s, :] += sum over b of dx (B, S, d)[b, s, :] (accumulates).
void PositionEmbeddingBackward(const Tensor& dx, Tensor& dwpe, int64_t position_offset = 0,
                               DeviceContext* ctx = nullptr);

// The implementations on checked shapes (the ids are checked against V here).
namespace cpu {
void EmbeddingForward(const Tensor& ids, const Tensor& table, Tensor& out);
void EmbeddingBackward(const Tensor& ids, const Tensor& dout, Tensor& dtable);
void AddPositionEmbedding(Tensor& x, const Tensor& wpe, int64_t position_offset);
void PositionEmbeddingBackward(const Tensor& dx, Tensor& dwpe, int64_t position_offset);
}  // namespace cpu

namespace cuda {
// check_ids: validate on the device and read the result back.
void EmbeddingForward(const Tensor& ids, const Tensor& table, Tensor& out, bool check_ids,
                      DeviceContext* ctx);
void EmbeddingBackward(const Tensor& ids, const Tensor& dout, Tensor& dtable, bool check_ids,
                       DeviceContext* ctx);
void AddPositionEmbedding(Tensor& x, const Tensor& wpe, int64_t position_offset,
                          DeviceContext* ctx);
void PositionEmbeddingBackward(const Tensor& dx, Tensor& dwpe, int64_t position_offset,
                               DeviceContext* ctx);
}  // namespace cuda

}  // namespace switchyard::kernels
