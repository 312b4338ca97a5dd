// StepReadback (engine/core/step_readback.h): chunked slot allocation and the one copy back.
#include "engine/core/step_readback.h"

#include <algorithm>
#include <cstring>

#include "engine/core/check.h"
#include "engine/core/device_context.h"

namespace switchyard {

StepReadback::Slots StepReadback::Reserve(int64_t n, Device device, DeviceContext* ctx) {
  SY_CHECK_GT(n, 0) << "StepReadback::Reserve";
  if (!chunks_.empty()) {
    SY_CHECK(chunks_.back().values.device() == device)
        << "StepReadback: slots on " << device << " after slots on "
        << chunks_.back().values.device();
  }
  if (chunks_.empty() || chunks_.back().used + n > chunks_.back().values.numel()) {
    // The first chunk sized for the slots expected (then the step's values are contiguous).
    const int64_t want = std::max({n, kChunk, expected_ - size_});
    chunks_.push_back(Chunk{Tensor::Zeros({want}, DType::kF64, device, ctx), 0});
  }
  Chunk& c = chunks_.back();
  Slots s{size_, c.values.View({n}, c.used)};
  c.used += n;
  size_ += n;
  return s;
}

std::vector<double> StepReadback::ReadBack(DeviceContext* ctx) {
  std::vector<double> out;
  if (size_ == 0) return out;
  Tensor all;
  if (chunks_.size() == 1) {
    all = chunks_[0].values.View({size_}, 0);
  } else {
    // The chunks side by side on the device (copies queued on the stream), then one copy.
    all = Tensor::Empty({size_}, DType::kF64, chunks_[0].values.device());
    int64_t at = 0;
    for (const Chunk& c : chunks_) {
      all.View({c.used}, at).CopyFrom(c.values.View({c.used}, 0), ctx);
      at += c.used;
    }
  }
  const Tensor host = all.ToHost("step_end", ctx);
  out.resize(size_);
  std::memcpy(out.data(), host.raw_data(), size_ * sizeof(double));
  chunks_.clear();
  last_read_ = size_;
  size_ = 0;
  return out;
}

}  // namespace switchyard
