// The context-parallel ring's communication (picotron's cp_communications.py beside
// context_parallel.py): the cp ranks form a ring, and each hop sends a buffer to rank+1 and
// receives one from rank-1, posted as one batch so that it overlaps the compute between the
// post and the wait. Ring attention (dense/ring_attention.h) is the algorithm on top: it
// passes key/value blocks around the ring (RingBuffers) and its dk/dv partial sums behind
// them (CpRing::PostHop). The layout of the chunks is context_parallel.h's.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"

namespace switchyard::parallel {

// This rank's place in the cp ring of c ranks, and the hops to its neighbours. Every rank
// posts its hops in the same order (NCCL ignores tags and matches them in order).
class CpRing {
 public:
  // The ring over the cp group `cp` (size c, rank i); `cp` must outlive it.
  explicit CpRing(dist::Communicator& cp) : cp_(cp), c_(cp.size()), i_(cp.rank()) {}

  // c, the ranks in the ring.
  int size() const { return c_; }
  // i, this rank's place.
  int rank() const { return i_; }
  // The rank this rank sends to (i + 1 mod c).
  int next() const { return (i_ + 1) % c_; }
  // The rank this rank receives from (i - 1 mod c).
  int prev() const { return (i_ + c_ - 1) % c_; }
  // The rank whose block this rank holds after t hops: i - t mod c.
  int source(int t) const { return (i_ - t + c_) % c_; }

  // Posts {send `send` to next(), receive into `recv` from prev()} as one batch under `tag`;
  // the returned Work completes both. Neither tensor may be touched until then.
  std::unique_ptr<dist::Work> PostHop(const Tensor& send, Tensor& recv, int tag);

  // Payload bytes this ring has sent (posted) so far.
  int64_t bytes_sent() const { return bytes_sent_; }

 private:
  dist::Communicator& cp_;
  int c_, i_;
  int64_t bytes_sent_ = 0;
};

// A block passed all the way around the ring, double-buffered: held() is the block in hand
// (after t hops, source(t)'s), PostHop sends it on and receives the next one into the other
// buffer, Wait completes that hop and swaps the two.
class RingBuffers {
 public:
  // Starts with `first` in hand; `second` (same shape and dtype, unused while c = 1) receives
  // the first hop. `tag` is this stream of messages' tag.
  RingBuffers(CpRing& ring, Tensor first, Tensor second, int tag);

  // The block in hand.
  const Tensor& held() const { return buffers_[held_]; }
  // Sends held() to rank+1 and receives rank-1's block into the other buffer. At most one
  // hop is in flight; held() must not be written until Wait.
  void PostHop();
  // Completes the posted hop, if any, and makes the received block held().
  void Wait();

 private:
  CpRing& ring_;
  Tensor buffers_[2];
  int held_ = 0;
  int tag_;
  std::unique_ptr<dist::Work> hop_;
};

}  // namespace switchyard::parallel
