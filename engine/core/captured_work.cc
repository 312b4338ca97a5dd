#include "engine/core/captured_work.h"

#include "engine/core/check.h"
#include "engine/core/device_context.h"

namespace switchyard::capture {
namespace {

thread_local DeviceContext* g_current = nullptr;

class HostWork final : public CapturedWork {
 public:
  explicit HostWork(internal::HostRecording recording) : recording_(std::move(recording)) {}
  void Replay(DeviceContext* ctx) override {
    SY_CHECK(ctx == nullptr || !ctx->capturing()) << "replaying captured work inside a capture";
    for (const std::function<void()>& op : recording_.ops) op();
  }
  int64_t operations() const override { return static_cast<int64_t>(recording_.ops.size()); }

 private:
  internal::HostRecording recording_;
};

}  // namespace

DeviceContext* Current() { return g_current; }

void CheckNotCapturing(const char* what) {
  SY_CHECK(g_current == nullptr)
      << "a readback (" << what
      << ") while the step's device work is captured for a CUDA graph (runtime.cuda_graphs): "
         "a captured stretch may not wait for the device";
}

namespace internal {

void SetCurrent(DeviceContext* ctx) { g_current = ctx; }

std::unique_ptr<CapturedWork> MakeHostWork(HostRecording recording) {
  return std::make_unique<HostWork>(std::move(recording));
}

}  // namespace internal
}  // namespace switchyard::capture
