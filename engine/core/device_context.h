// DeviceContext: what a kernel needs to run on one device, passed explicitly (no globals):
// the stream that orders its work, the cuBLAS handle bound to that stream, and a growing
// scratch workspace. On the CPU the stream and handle are null.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "engine/core/captured_work.h"
#include "engine/core/device.h"
#include "engine/core/tensor.h"
#include "engine/core/weight_shadows.h"

namespace switchyard {

class StepReadback;

class DeviceContext {
 public:
  // A context on `device`. For CUDA: a new non-blocking stream and a cuBLAS handle on it.
  static std::unique_ptr<DeviceContext> Create(Device device);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  Device device() const { return device_; }
  // cudaStream_t and cublasHandle_t as opaque pointers (null on the CPU); the CUDA backend
  // casts them (kernels/cuda/common.cuh).
  void* stream() const { return stream_; }
  void* cublas() const { return cublas_; }

  // Scratch memory of at least `bytes`, valid until the next call. Work already queued on
  // the stream that uses the old workspace is ordered before any reuse.
  void* Workspace(size_t bytes);

  // Waits for all work queued on the stream (no-op on the CPU); counted as a readback
  // (engine/core/counters.h) on every device.
  void Synchronize();

  // The element type matrix products read their inputs in (mixed precision, MODEL.md
  // section 1): kF32 (the default) or kBF16, where kernels::Gemm and the grouped GEMMs round
  // both operands to bf16 and accumulate in f32 into an f32 output — on the CPU too, so the
  // CPU reference of a bf16 run rounds exactly as the GPU does. A null context means kF32.
  DType matmul_dtype() const { return matmul_dtype_; }
  void set_matmul_dtype(DType dtype);

  // The element type layers keep their activations for backward in (runtime.activation_dtype,
  // MODEL.md "Activation storage", kernels/activation_storage.h): kF32 (the default, and a
  // null context) or kBF16, which needs matmul_dtype kBF16 when it is set (set that first; a
  // product may still switch matmul_dtype to f32 for itself, as the router's do). The
  // forward's values are the same either way; only what is kept for backward is rounded.
  DType activation_dtype() const { return activation_dtype_; }
  void set_activation_dtype(DType dtype);

  // The bf16 shadows of the weights products read in bf16 mode (engine/core/weight_shadows.h);
  // empty unless the trainer registers its weights.
  WeightShadows& weight_shadows() { return weight_shadows_; }

  // The training step's readback buffer while the trainer holds the window open
  // (engine/core/step_readback.h), else null: values then come back at once.
  StepReadback* step_readback() const { return step_readback_; }
  void set_step_readback(StepReadback* readback) { step_readback_ = readback; }

  // Queues a copy of `bytes` host bytes at src to device memory dst on the stream, and returns
  // without waiting for the stream: the bytes go into pinned memory first (a pool of blocks,
  // each reused once the copy that last read it has run). A copy straight from pageable memory
  // may wait for the stream (CUDA's API synchronization behavior: the driver stages it and "may
  // synchronize with the stream"), which stalls the host at every micro-batch's inputs while
  // the device finishes the work queued before them. False, with nothing done, off CUDA, over
  // kMaxStagedBytes (bulk loads: pinning them costs more than the wait) or when every block is
  // in flight and another would take the pool past kMaxStagingBlocks blocks or
  // kMaxStagingPool bytes (a burst of copies, as a model's parameters going to the device):
  // the caller copies as before. Tensor::CopyFrom stages its host-to-device copies on a
  // context here (not while capturing).
  bool StageToDevice(void* dst, const void* src, size_t bytes);
  static constexpr size_t kMaxStagedBytes = size_t{16} << 20;
  static constexpr size_t kMaxStagingBlocks = 256;
  static constexpr size_t kMaxStagingPool = size_t{64} << 20;
  // Pinned staging blocks held, and their bytes (for tests).
  size_t staging_blocks() const { return staging_.size(); }
  size_t staging_bytes() const { return staging_bytes_; }

  // Capture (engine/core/captured_work.h): between BeginCapture and EndCapture the work
  // queued on this context is recorded, not run (a CUDA graph of the stream; on the CPU,
  // closures), and nothing may wait for the device. One capture at a time per thread.
  void BeginCapture();
  std::unique_ptr<CapturedWork> EndCapture();
  bool capturing() const { return capturing_; }
  // The CPU emulation: records `op` (kernels/dispatch.h and the tensor copies and fills
  // call it while capturing() on a host context).
  void Record(std::function<void()> op);
  // Host memory the captured work reads (a host source of a copy): it lives as long as the
  // captured work.
  void KeepWithCapture(std::shared_ptr<void> memory);

 private:
  explicit DeviceContext(Device device) : device_(device) {}

  Device device_;
  void* stream_ = nullptr;
  void* cublas_ = nullptr;
  Tensor workspace_;
  DType matmul_dtype_ = DType::kF32;
  DType activation_dtype_ = DType::kF32;
  WeightShadows weight_shadows_;
  StepReadback* step_readback_ = nullptr;
  bool capturing_ = false;
  int capture_pool_ = 0;
  capture::internal::HostRecording recording_;
  // StageToDevice's pinned blocks; `done` is a cudaEvent_t recorded after the block's copy.
  struct PinnedBlock {
    void* host = nullptr;
    size_t bytes = 0;
    void* done = nullptr;
    bool in_flight = false;
  };
  std::vector<PinnedBlock> staging_;
  size_t staging_bytes_ = 0;
};

}  // namespace switchyard
