// Context parallelism (cp = c ranks; Megatron-LM's context parallel, with the load-balanced
// causal split): every sequence of S tokens is cut into 2c chunks of S/(2c) positions and
// cp rank i holds chunks i and 2c-1-i, so that under the causal mask every rank computes
// the same number of query-key pairs (rank i's queries see 2i+1 and 4c-2i-1 chunks).
//
// The local layout. A micro-batch of B sequences is, on a cp rank, (2B, S/(2c)): rows [0, B)
// are chunk i of each sequence, rows [B, 2B) chunk 2c-1-i. Every per-token layer (norms,
// MLPs, the head and the loss) works on these rows as on any batch; the positions of a
// chunk (RoPE, learned positions) are the global ones, chunk_start(h) + s; attention runs
// its keys and values around the cp ring (dense/ring_attention.h); the MoE layer routes the
// whole micro-batch (MODEL.md section 4; moe/group_routing.h's GroupLayout). Dense
// gradients are summed over dp x cp.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"

namespace switchyard::parallel {

struct ContextParallel {
  dist::Communicator* comm = nullptr;  // the cp group; null (or size 1): none
  int64_t seq_len = 0;                 // S, the whole sequence (required when active)

  int rank() const { return comm ? comm->rank() : 0; }
  int size() const { return comm ? comm->size() : 1; }
  bool active() const { return size() > 1; }
  // S / (2c), the positions of one chunk.
  int64_t chunk_len() const { return seq_len / (2 * size()); }
  // The first position of this rank's chunk h: h = 0 chunk i, h = 1 chunk 2c-1-i.
  int64_t chunk_start(int h) const {
    return (h == 0 ? rank() : 2 * size() - 1 - rank()) * chunk_len();
  }
  // The local sequence length: S / (2c) under cp (each of the 2B rows), else S.
  int64_t local_seq_len() const { return active() ? chunk_len() : seq_len; }
  // Names model.seq_len and parallel.cp when S is not a multiple of 2c.
  Status Validate() const;
};

// Whole sequences (B, S) of any dtype on the CPU -> this rank's (2B, S/(2c)) in the local
// layout above (a copy). cp size 1: `whole` itself.
Tensor ShardSequences(const Tensor& whole, int cp_size, int cp_rank);

// The inverse for tests and tools: every rank's (2B, S/(2c)) pieces, in cp rank order ->
// (B, S).
Tensor UnshardSequences(const std::vector<Tensor>& pieces);

}  // namespace switchyard::parallel
