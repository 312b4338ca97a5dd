#include "engine/core/device_context.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include "engine/core/allocator.h"
#include "engine/core/counters.h"

#ifdef SY_HAVE_CUDA
#include "engine/core/cuda_check.h"
#endif

namespace switchyard {

std::unique_ptr<DeviceContext> DeviceContext::Create(Device device) {
  std::unique_ptr<DeviceContext> ctx(new DeviceContext(device));
  if (device.is_cuda()) {
#ifdef SY_HAVE_CUDA
    SY_CUDA_CHECK(cudaSetDevice(device.index));
    cudaStream_t stream;
    SY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cublasHandle_t handle;
    SY_CUBLAS_CHECK(Cublas().Create(&handle));
    SY_CUBLAS_CHECK(Cublas().SetStream(handle, stream));
    ctx->stream_ = stream;
    ctx->cublas_ = handle;
#else
    SY_LOG(FATAL) << "DeviceContext on " << device.ToString()
                  << " in a build without the CUDA backend";
#endif
  }
  return ctx;
}

DeviceContext::~DeviceContext() {
#ifdef SY_HAVE_CUDA
  // The stream's queued kernels may still use the shadows and the workspace: they go back to
  // the allocator (which may hand them to another context's stream) only once it is done.
  if (device_.is_cuda()) cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
#endif
  weight_shadows_.Clear();  // before the stream goes
#ifdef SY_HAVE_CUDA
  if (device_.is_cuda()) {
    for (PinnedBlock& b : staging_) {  // the stream is done with them
      cudaEventDestroy(static_cast<cudaEvent_t>(b.done));
      cudaFreeHost(b.host);
    }
    workspace_ = Tensor();
    Cublas().Destroy(static_cast<cublasHandle_t>(cublas_));
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
#endif
}

bool DeviceContext::StageToDevice(void* dst, const void* src, size_t bytes) {
#ifdef SY_HAVE_CUDA
  if (!device_.is_cuda() || capturing_ || bytes == 0 || bytes > kMaxStagedBytes) return false;
  // The smallest block whose last copy has run.
  PinnedBlock* pick = nullptr;
  for (PinnedBlock& b : staging_) {
    if (b.bytes < bytes || (pick != nullptr && b.bytes >= pick->bytes)) continue;
    if (b.in_flight) {
      const cudaError_t state = cudaEventQuery(static_cast<cudaEvent_t>(b.done));
      if (state == cudaErrorNotReady) continue;
      SY_CUDA_CHECK(state);
      b.in_flight = false;
    }
    pick = &b;
  }
  if (pick == nullptr) {
    const size_t block = std::max<size_t>(std::bit_ceil(bytes), size_t{64} << 10);
    if (staging_.size() >= kMaxStagingBlocks || staging_bytes_ + block > kMaxStagingPool) {
      return false;
    }
    PinnedBlock b;
    b.bytes = block;
    SY_CUDA_CHECK(cudaMallocHost(&b.host, b.bytes));
    cudaEvent_t done;
    SY_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    b.done = done;
    staging_.push_back(b);
    staging_bytes_ += block;
    pick = &staging_.back();
  }
  std::memcpy(pick->host, src, bytes);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  SY_CUDA_CHECK(cudaMemcpyAsync(dst, pick->host, bytes, cudaMemcpyHostToDevice, stream));
  SY_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(pick->done), stream));
  pick->in_flight = true;
  return true;
#else
  (void)dst;
  (void)src;
  (void)bytes;
  return false;
#endif
}

void* DeviceContext::Workspace(size_t bytes) {
  if (!workspace_.defined() || workspace_.nbytes() < bytes) {
    // The old block returns to the (stream-ordered) caching allocator; the CPU frees it.
    workspace_ = Tensor::Empty({static_cast<int64_t>(bytes)}, DType::kU8, device_);
  }
  return workspace_.raw_data();
}

void DeviceContext::set_matmul_dtype(DType dtype) {
  SY_CHECK(dtype == DType::kF32 || dtype == DType::kBF16)
      << "matrix products read f32 or bf16 inputs, not " << DTypeName(dtype);
  matmul_dtype_ = dtype;
}

void DeviceContext::set_activation_dtype(DType dtype) {
  SY_CHECK(dtype == DType::kF32 || dtype == DType::kBF16)
      << "activations are kept in f32 or bf16, not " << DTypeName(dtype);
  SY_CHECK(dtype == DType::kF32 || matmul_dtype_ == DType::kBF16)
      << "bf16 activation storage needs bf16 matrix products (set_matmul_dtype first)";
  activation_dtype_ = dtype;
}

void DeviceContext::BeginCapture() {
  SY_CHECK(!capturing_) << "BeginCapture: this context is capturing already";
  SY_CHECK(capture::Current() == nullptr) << "BeginCapture: this thread is capturing already";
  capturing_ = true;
  capture::internal::SetCurrent(this);
  if (device_.is_cuda()) {
#ifdef SY_HAVE_CUDA
    if (capture_pool_ == 0) capture_pool_ = GetAllocator(device_)->NewGraphPool();
    capture::internal::BeginCudaCapture(this, capture_pool_);
#endif
  }
}

std::unique_ptr<CapturedWork> DeviceContext::EndCapture() {
  SY_CHECK(capturing_) << "EndCapture without BeginCapture";
  capturing_ = false;
  capture::internal::SetCurrent(nullptr);
  if (device_.is_cuda()) {
#ifdef SY_HAVE_CUDA
    // Each graph owns its pool: the next capture gets a new one.
    const int pool = capture_pool_;
    capture_pool_ = 0;
    return capture::internal::EndCudaCapture(this, pool, std::exchange(recording_.keep, {}));
#endif
  }
  return capture::internal::MakeHostWork(std::exchange(recording_, {}));
}

void DeviceContext::Record(std::function<void()> op) {
  SY_CHECK(capturing_ && device_.is_cpu()) << "DeviceContext::Record outside a host capture";
  recording_.ops.push_back(std::move(op));
}

void DeviceContext::KeepWithCapture(std::shared_ptr<void> memory) {
  SY_CHECK(capturing_) << "DeviceContext::KeepWithCapture outside a capture";
  recording_.keep.push_back(std::move(memory));
}

void DeviceContext::Synchronize() {
  counters::CountReadback("synchronize");  // the host waits for the device, whatever the device
#ifdef SY_HAVE_CUDA
  if (device_.is_cuda()) SY_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
#endif
}

}  // namespace switchyard
