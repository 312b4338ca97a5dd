// GPU timing of the profiler's phases (engine/core/profile.h): a CUDA event recorded on the
// step's stream at every phase switch; at the step's end the host waits for the last event
// and charges the time between consecutive events to the phase open between them. Events
// are created once and reused step after step. This wait is the profiler's own and is not
// counted as a readback (engine/core/counters.h).
#include <vector>

#include <cuda_profiler_api.h>

#include "engine/core/cuda_check.h"
#include "engine/core/device_context.h"
#include "engine/core/captured_work.h"
#include "engine/core/profile.h"

namespace switchyard::internal {
namespace {

class CudaPhaseEvents final : public PhaseEvents {
 public:
  explicit CudaPhaseEvents(cudaStream_t stream) : stream_(stream) {}
  ~CudaPhaseEvents() override {
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
  }

  void Record(int closing) override {
    // A captured stretch (engine/core/captured_work.h) is not timed by phase: its events
    // would be graph nodes, not timestamps. Its replay is.
    if (capture::Current() != nullptr) return;
    if (used_ == pool_.size()) {
      cudaEvent_t e;
      SY_CUDA_CHECK(cudaEventCreate(&e));
      pool_.push_back(e);
    }
    SY_CUDA_CHECK(cudaEventRecord(pool_[used_], stream_));
    closing_.resize(used_ + 1);
    closing_[used_] = closing;  // the span ending at this event
    ++used_;
  }

  void StartExternalProfiler() override { SY_CUDA_CHECK(cudaProfilerStart()); }

  void Collect(double* seconds, double* step) override {
    if (used_ == 0) return;
    SY_CUDA_CHECK(cudaEventSynchronize(pool_[used_ - 1]));
    for (size_t i = 1; i < used_; ++i) {
      float ms = 0.0f;
      SY_CUDA_CHECK(cudaEventElapsedTime(&ms, pool_[i - 1], pool_[i]));
      const int phase = closing_[i] < 0 ? static_cast<int>(Phase::kCount) : closing_[i];
      seconds[phase] += 1e-3 * ms;
    }
    float total = 0.0f;
    SY_CUDA_CHECK(cudaEventElapsedTime(&total, pool_[0], pool_[used_ - 1]));
    *step += 1e-3 * total;
    used_ = 0;
  }

 private:
  cudaStream_t stream_;
  std::vector<cudaEvent_t> pool_;
  std::vector<int> closing_;
  size_t used_ = 0;
};

}  // namespace

std::unique_ptr<PhaseEvents> MakePhaseEvents(DeviceContext* ctx) {
  if (ctx == nullptr || !ctx->device().is_cuda()) return nullptr;
  return std::make_unique<CudaPhaseEvents>(static_cast<cudaStream_t>(ctx->stream()));
}

}  // namespace switchyard::internal
