// The decoder's MoE rows (Decoder, engine/model/decoder.h): how a block's hidden states
// become the rows an MoE layer routes under tensor parallelism without sequence
// parallelism, and, under context parallelism, which group tokens this rank's rows are.
#include <algorithm>

#include "engine/model/decoder.h"
#include "engine/parallel/tensor_parallel.h"

namespace switchyard::model {

// Without sequence parallelism every tp rank holds all rows and routes its own block of
// them: the sequence-parallel scatter in, its backward (an all-gather) out.
Tensor Decoder::MoERowsIn(const Tensor& x) const {
  const int64_t d = model_.d_model;
  Tensor rows = x.Reshape({x.numel() / d, d});
  const dense::TensorParallel tp = this->tp();
  if (!tp.active() || tp.sequence_parallel) return rows;
  return parallel::ScatterToSequenceParallelRegion(rows, *tp.comm, ctx_);
}

Tensor Decoder::MoERowsOut(const Tensor& y, const Shape& shape) const {
  const dense::TensorParallel tp = this->tp();
  if (!tp.active() || tp.sequence_parallel) return y.Reshape(shape);
  return parallel::ScatterToSequenceParallelRegionBackward(y, *tp.comm, ctx_).Reshape(shape);
}

Tensor Decoder::MoERowsOutBackward(const Tensor& dy) const { return MoERowsIn(dy); }

Tensor Decoder::MoERowsInBackward(const Tensor& dh, const Shape& shape) const {
  return MoERowsOut(dh, shape);
}

moe::GroupLayout Decoder::MoEGroupLayout(int64_t batch) const {
  const parallel::ContextParallel cp = this->cp();
  if (!cp.active()) return {};
  // tp_cp member m = cp rank * tp + tp rank holds block tp_rank of cp rank's local rows
  // (2B, S/(2c)): row (h, b, s) is token b * S + (chunk start of h) + s.
  const int c = cp.size(), p = tp().size();
  const int64_t len = cp.chunk_len(), rows = 2 * batch * len, per = rows / p;
  moe::GroupLayout layout;
  layout.members.resize(c * p);
  for (int r = 0; r < c; ++r) {
    for (int t = 0; t < p; ++t) {
      std::vector<moe::TokenRun>& runs = layout.members[r * p + t];
      for (int64_t row = t * per; row < (t + 1) * per;) {
        const int64_t h = row / (batch * len), b = (row / len) % batch, s = row % len;
        const int64_t chunk = h == 0 ? r : 2 * c - 1 - r;
        const int64_t n = std::min(len - s, (t + 1) * per - row);
        runs.push_back({.token = b * model_.seq_len + chunk * len + s, .rows = n});
        row += n;
      }
    }
  }
  return layout;
}

}  // namespace switchyard::model
