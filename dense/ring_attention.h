// PROVISIONAL (replaced by the ring implementation): context-parallel causal attention in
// dense/context_parallel.h's local layout, by all-gathering k and v over cp.
#pragma once

#include <cstdint>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"

namespace switchyard::dense {

struct RingAttentionStats {
  int64_t pairs = 0;
  int64_t bytes_sent = 0;
  int64_t blocks_computed = 0, blocks_skipped = 0;
};

void RingAttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                          Tensor& lse, dist::Communicator& cp, DeviceContext* ctx = nullptr,
                          RingAttentionStats* stats = nullptr);
void RingAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                           const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                           Tensor& dv, dist::Communicator& cp, DeviceContext* ctx = nullptr,
                           RingAttentionStats* stats = nullptr);

}  // namespace switchyard::dense
