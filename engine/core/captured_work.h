// CapturedWork: the device work a stretch of host code queues, recorded once and then
// replayed without the host code (runtime.cuda_graphs; docs/gpu.md, "CUDA graphs").
//
//   ctx->BeginCapture();
//   ... host code that queues kernels on ctx (they are recorded, not run) ...
//   std::unique_ptr<CapturedWork> work = ctx->EndCapture();
//   work->Replay(ctx);  // runs them, as often as wanted
//
// A replay runs the same operations on the same memory with the same arguments: whatever
// changes from one replay to the next must be written into device memory the operations read
// (inputs copied into the tensors the capture used, per-step scalars in
// engine/core/step_scalars.h) before Replay. During a capture nothing may wait for the device:
// a readback (counters::CountReadback, so Tensor::ToHost, DeviceContext::Synchronize and
// every op returning a host value) is a fatal error naming its site.
//
// On CUDA this is a CUDA graph: the stream is captured, and the memory the capture allocates
// or frees is the graph's (Allocator graph pools, engine/core/block_cache.h) until it is
// destroyed. On the CPU the recording is an emulation that keeps the same contract: every
// kernel dispatch (kernels/dispatch.h) and every copy or fill of a tensor with the context is
// recorded as a closure over its arguments, and a replay calls them in order. Tests run
// steps through it on the CPU to show that a step's device work does not depend on host
// values that change between replays.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace switchyard {

class DeviceContext;

class CapturedWork {
 public:
  virtual ~CapturedWork() = default;
  // Runs the recorded work on ctx's stream (the context it was captured on).
  virtual void Replay(DeviceContext* ctx) = 0;
  // Operations recorded: closures on the CPU, graph nodes on CUDA.
  virtual int64_t operations() const = 0;
  // Between replays, other work may borrow the memory the work owns while it is idle (CUDA:
  // the graph pool's free blocks; nothing on the CPU). Reclaim ends the loan before the next
  // replay: false when a borrowed block is still in use (the replay would overwrite it).
  virtual void LendMemory() {}
  virtual bool ReclaimMemory() { return true; }
};

namespace capture {

// The context capturing on this thread, or null.
DeviceContext* Current();
// A fatal error when this thread is capturing: `what` (a readback site) would make the host
// wait for the device.
void CheckNotCapturing(const char* what);

namespace internal {
void SetCurrent(DeviceContext* ctx);
// The CPU emulation's recording.
struct HostRecording {
  std::vector<std::function<void()>> ops;
  std::vector<std::shared_ptr<void>> keep;  // host memory the work reads
};
std::unique_ptr<CapturedWork> MakeHostWork(HostRecording recording);
// CUDA (captured_work_cuda.cc): starts and ends the stream's capture into a graph that owns
// the allocator's pool `pool`.
void BeginCudaCapture(DeviceContext* ctx, int pool);
std::unique_ptr<CapturedWork> EndCudaCapture(DeviceContext* ctx, int pool,
                                             std::vector<std::shared_ptr<void>> keep);
}  // namespace internal
}  // namespace capture
}  // namespace switchyard
