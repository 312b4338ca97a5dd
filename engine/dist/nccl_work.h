// Internal to the NCCL backend (nccl_communicator.cc): CUDA events, the Work of an
// asynchronous NCCL collective and the batch of point-to-point ops launched as one group.
#pragma once

#include <cuda_runtime.h>

#include <utility>
#include <vector>

#include "engine/core/cuda_check.h"
#include "engine/core/device_context.h"
#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"

namespace switchyard::dist::nccl_internal {

inline cudaStream_t StreamOf(DeviceContext* ctx) { return static_cast<cudaStream_t>(ctx->stream()); }

inline cudaEvent_t NewEvent() {
  cudaEvent_t event;
  SY_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

// Whether the work before `event` has finished (cudaEventQuery; other errors fail).
inline bool EventFired(cudaEvent_t event) {
  const cudaError_t e = cudaEventQuery(event);
  if (e == cudaErrorNotReady) return false;
  SY_CUDA_CHECK(e);
  return true;
}

// An asynchronous NCCL op: the event recorded on the communication stream after it, and
// the tensors it uses (released once the caller's stream is ordered after the event).
class NcclWork final : public Work {
 public:
  NcclWork(int device, cudaStream_t compute, cudaEvent_t done, std::vector<Tensor> tensors)
      : device_(device), compute_(compute), done_(done), tensors_(std::move(tensors)) {}
  ~NcclWork() override {
    Wait();
    cudaEventDestroy(done_);
  }

  void Wait() override {
    if (waited_) return;
    SY_CUDA_CHECK(cudaSetDevice(device_));
    SY_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
    tensors_.clear();
    waited_ = true;
  }
  // The event after the op has fired (the tensors are then released).
  bool Test() override {
    if (waited_) return true;
    SY_CUDA_CHECK(cudaSetDevice(device_));
    if (!EventFired(done_)) return false;
    Wait();
    return true;
  }

 private:
  int device_;
  cudaStream_t compute_;
  cudaEvent_t done_;
  std::vector<Tensor> tensors_;
  bool waited_ = false;
};

// Point-to-point ops posted together and launched as one NCCL group (see SendAsync), with
// the event recorded after them once launched.
struct P2PBatch {
  ~P2PBatch() {
    if (done != nullptr) cudaEventDestroy(done);
  }
  std::vector<P2POp> ops;  // holds the tensors until the batch is destroyed
  bool launched = false;
  cudaEvent_t done = nullptr;
};

}  // namespace switchyard::dist::nccl_internal
