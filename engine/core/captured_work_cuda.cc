// CapturedWork on CUDA: a CUDA graph of the context's stream (engine/core/captured_work.h).
#include "engine/core/allocator.h"
#include "engine/core/captured_work.h"
#include "engine/core/cuda_check.h"
#include "engine/core/device_context.h"

namespace switchyard::capture::internal {
namespace {

class CudaGraphWork final : public CapturedWork {
 public:
  CudaGraphWork(Device device, cudaGraph_t graph, cudaGraphExec_t exec, int pool,
                std::vector<std::shared_ptr<void>> keep)
      : device_(device), graph_(graph), exec_(exec), pool_(pool), keep_(std::move(keep)) {}
  ~CudaGraphWork() override {
    // A replay may still be running: the pinned sources and the pool outlive it. A fault in
    // a replay is sticky: said here, where it shows, rather than at a later unrelated call.
    if (const cudaError_t err = cudaDeviceSynchronize(); err != cudaSuccess) {
      SY_LOG(ERROR) << "finishing the CUDA graph's last replay: " << cudaGetErrorString(err);
    }
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
    // Work queued after a replay on the same stream is ordered after it, so the pool's
    // blocks can serve it at once.
    GetAllocator(device_)->ReleaseGraphPool(pool_);
  }
  void Replay(DeviceContext* ctx) override {
    SY_CHECK(ctx != nullptr && ctx->device() == device_)
        << "a CUDA graph replays on the context of " << device_.ToString();
    SY_CHECK(!ctx->capturing()) << "replaying a CUDA graph inside a capture";
    SY_CUDA_CHECK(cudaGraphLaunch(exec_, static_cast<cudaStream_t>(ctx->stream())));
  }
  void LendMemory() override { GetAllocator(device_)->BeginGraphLoan(pool_); }
  bool ReclaimMemory() override {
    Allocator* allocator = GetAllocator(device_);
    allocator->EndGraphLoan();
    return allocator->GraphLoansLive(pool_) == 0;
  }
  int64_t operations() const override {
    size_t nodes = 0;
    SY_CUDA_CHECK(cudaGraphGetNodes(graph_, nullptr, &nodes));
    return static_cast<int64_t>(nodes);
  }

 private:
  Device device_;
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  int pool_;
  std::vector<std::shared_ptr<void>> keep_;  // pinned host sources of its copies
};

}  // namespace

void BeginCudaCapture(DeviceContext* ctx, int pool) {
  GetAllocator(ctx->device())->BeginGraphPool(pool);
  // Relaxed: the caching allocator may still call cudaMalloc (a cache miss); our own check
  // (CheckNotCapturing) refuses every wait for the device.
  SY_CUDA_CHECK(cudaStreamBeginCapture(static_cast<cudaStream_t>(ctx->stream()),
                                       cudaStreamCaptureModeRelaxed));
}

std::unique_ptr<CapturedWork> EndCudaCapture(DeviceContext* ctx, int pool,
                                             std::vector<std::shared_ptr<void>> keep) {
  cudaGraph_t graph = nullptr;
  const cudaError_t err = cudaStreamEndCapture(static_cast<cudaStream_t>(ctx->stream()), &graph);
  GetAllocator(ctx->device())->EndGraphPool();
  SY_CHECK(err == cudaSuccess) << "capturing the step into a CUDA graph failed: "
                               << cudaGetErrorString(err)
                               << " (something in the captured stretch is not capturable)";
  cudaGraphExec_t exec = nullptr;
  SY_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  return std::make_unique<CudaGraphWork>(ctx->device(), graph, exec, pool, std::move(keep));
}

}  // namespace switchyard::capture::internal
