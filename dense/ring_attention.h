// Ring attention: causal attention over a sequence split by context parallelism (Liu et al.
// 2023, "Ring Attention with Blockwise Transformers"; the load-balanced chunk assignment of
// Megatron-LM's context parallelism). Same math as kernels/attention.h on the whole
// sequence; only the keys' location differs. This file is the algorithm; the ring's
// communication (the hops to rank+1 and from rank-1) is engine/parallel/cp_ring.h's.
//
// Layout: context parallelism's local layout (engine/parallel/context_parallel.h), c cp
// ranks, chunks of Sc = S / (2c) positions, rows [0, B) this rank's first chunk of each of
// the B sequences and rows [B, 2B) its second. So
//   q, out, dq (2B, Sc, Hq, hd)   k, v, dk, dv (2B, Sc, Hkv, hd)   lse (2B, Hq, Sc)
// (kernels/attention.h's layout with "B" = 2B and "S" = Sc); slicing dim 0 gives each chunk.
//
// Forward. The key/value block — k and v of both local chunks, packed in one buffer, only
// the Hkv heads — travels around the ring (sent to rank+1, received from rank-1) in c-1
// hops; each hop is posted before the block in hand is computed on, so communication
// overlaps compute. For local query chunk a and held key chunk b (global chunk indices):
// b < a is a full block (AttentionMask::kFull), b == a the diagonal (kCausal), b > a is
// skipped (fully masked). Blocks merge into out and lse (AttentionMerge) in a fixed order —
// ring steps in order, then query chunk, then key chunk — so results are deterministic.
// Per step and rank this is 2 blocks of Sc x Sc pairs (or, at step 0, 1 full and 2 diagonal
// blocks), so every rank computes the same number of pairs: S (S + 1) / (2c) per sequence
// and query head.
//
// Backward. delta = rowsum(dout * out) is computed once; the ring runs again, and each held
// block gives dq its share (AttentionBackward with the final lse and delta). The dk, dv of a
// block that other ranks computed on travel behind the block: rank i-t's block reaches rank
// i at step t >= 1, which adds its share to the partial sum received from rank i-1 and
// sends it on; after the last step the sum arrives home (the block's owner), which adds its
// own step-0 share. That is c-1 hops for k, v and c-1 for dk, dv.
//
// Bytes sent per rank and pass: (c-1) x the local block = (c-1)/c x the whole sequence's
// k + v bytes (forward one pass; backward two: k, v and dk, dv). With c = 1 nothing is
// sent (chunks 0 and 1, one step).
//
// Devices. Tensors live on the communicator's device and every kernel runs with ctx, so the
// same code serves host tensors with the MPI communicator and CUDA tensors with NCCL; for
// device tensors ctx must be cp.context() (its stream orders the communicator's ops).
#pragma once

#include <cstdint>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"

namespace switchyard::dense {

// What one call did on this rank; each call adds (+=) to the fields.
struct RingAttentionStats {
  // (query position, key position) pairs computed, summed over the B sequences and the Hq
  // query heads: a full block counts Sc * Sc per sequence and head, a diagonal Sc (Sc + 1) / 2.
  int64_t pairs = 0;
  // Payload bytes this rank sent.
  int64_t bytes_sent = 0;
  // (query chunk, key chunk) blocks, each covering the B sequences and all heads: computed,
  // and skipped as fully masked.
  int64_t blocks_computed = 0, blocks_skipped = 0;
};

// q, out: (2B, Sc, Hq, hd); k, v: (2B, Sc, Hkv, hd); lse: (2B, Hq, Sc). cp: the
// context-parallel group (size c, rank i). Writes out and lse: the causal attention of this
// rank's queries over the whole sequence's keys.
void RingAttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                          Tensor& lse, dist::Communicator& cp, DeviceContext* ctx = nullptr,
                          RingAttentionStats* stats = nullptr);

// dq, dk, dv written (not accumulated), same shapes as q, k, v. out and lse are the
// forward's. dk and dv are the gradients of this rank's own k and v (every rank's queries
// that read them included).
void RingAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                           const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                           Tensor& dv, dist::Communicator& cp, DeviceContext* ctx = nullptr,
                           RingAttentionStats* stats = nullptr);

}  // namespace switchyard::dense
