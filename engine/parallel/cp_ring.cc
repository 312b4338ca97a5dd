// The context-parallel ring's hops (cp_ring.h).
#include "engine/parallel/cp_ring.h"

#include <utility>

#include "engine/core/check.h"

namespace switchyard::parallel {

std::unique_ptr<dist::Work> CpRing::PostHop(const Tensor& send, Tensor& recv, int tag) {
  const dist::P2POp ops[] = {{dist::P2POp::kSend, send, next(), tag},
                             {dist::P2POp::kRecv, recv, prev(), tag}};
  bytes_sent_ += static_cast<int64_t>(send.nbytes());
  return cp_.BatchSendRecv(ops);
}

RingBuffers::RingBuffers(CpRing& ring, Tensor first, Tensor second, int tag)
    : ring_(ring), buffers_{std::move(first), std::move(second)}, tag_(tag) {}

void RingBuffers::PostHop() {
  SY_CHECK(hop_ == nullptr) << "RingBuffers::PostHop: a hop is already in flight";
  hop_ = ring_.PostHop(buffers_[held_], buffers_[1 - held_], tag_);
}

void RingBuffers::Wait() {
  if (hop_ == nullptr) return;
  hop_->Wait();
  hop_.reset();
  held_ = 1 - held_;
}

}  // namespace switchyard::parallel
