// CUDA implementation of kernels/activation.h's elementwise activations (the bias ops, and
// bias + activation fused, are kernels/cuda/bias.cu).
//
// Grid-stride kernels, 256 threads per block, GridFor(n) blocks. Each evaluates the CPU
// reference's expression (kernels/cuda/activation_math.cuh), so the only difference from the
// CPU is expf. Pointers are not __restrict__: outputs may be the inputs' memory.
#include <cstdint>

#include "kernels/activation.h"
#include "kernels/cuda/activation_math.cuh"
#include "kernels/cuda/common.cuh"

namespace switchyard::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void GeluForwardKernel(const float* x, float* y, int64_t n) {
  SY_GRID_STRIDE(i, n) { y[i] = Gelu(x[i]); }
}

__global__ void GeluBackwardKernel(const float* x, const float* dy, float* dx, int64_t n) {
  SY_GRID_STRIDE(i, n) { dx[i] = GeluGrad(x[i], dy[i]); }
}

__global__ void ReluForwardKernel(const float* x, float* y, int64_t n) {
  SY_GRID_STRIDE(i, n) {
    const float v = x[i];
    y[i] = v > 0.0f ? v : 0.0f;
  }
}

__global__ void ReluBackwardKernel(const float* x, const float* dy, float* dx, int64_t n) {
  SY_GRID_STRIDE(i, n) { dx[i] = x[i] > 0.0f ? dy[i] : 0.0f; }
}
__global__ void SwigluForwardKernel(const float* a, const float* b, float* out, int64_t n) {
  SY_GRID_STRIDE(i, n) { out[i] = Swiglu(a[i], b[i]); }
}

__global__ void SwigluBackwardKernel(const float* a, const float* b, const float* dout, float* da,
                                     float* db, int64_t n) {
  SY_GRID_STRIDE(i, n) {
    float vda, vdb;
    SwigluGrad(a[i], b[i], dout[i], &vda, &vdb);
    da[i] = vda;
    db[i] = vdb;
  }
}

}  // namespace

void GeluForward(const Tensor& x, Tensor& y, DeviceContext* ctx) {
  const int64_t n = y.numel();
  if (n == 0) return;
  GeluForwardKernel<<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(x.data<float>(),
                                                                          y.data<float>(), n);
  SY_CUDA_CHECK_LAUNCH();
}

void GeluBackward(const Tensor& x, const Tensor& dy, Tensor& dx, DeviceContext* ctx) {
  const int64_t n = dx.numel();
  if (n == 0) return;
  GeluBackwardKernel<<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(
      x.data<float>(), dy.data<float>(), dx.data<float>(), n);
  SY_CUDA_CHECK_LAUNCH();
}

void ReluForward(const Tensor& x, Tensor& y, DeviceContext* ctx) {
  const int64_t n = y.numel();
  if (n == 0) return;
  ReluForwardKernel<<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(x.data<float>(),
                                                                          y.data<float>(), n);
  SY_CUDA_CHECK_LAUNCH();
}

void ReluBackward(const Tensor& x, const Tensor& dy, Tensor& dx, DeviceContext* ctx) {
  const int64_t n = dx.numel();
  if (n == 0) return;
  ReluBackwardKernel<<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(
      x.data<float>(), dy.data<float>(), dx.data<float>(), n);
  SY_CUDA_CHECK_LAUNCH();
}

void SwigluForward(const Tensor& a, const Tensor& b, Tensor& out, DeviceContext* ctx) {
  const int64_t n = out.numel();
  if (n == 0) return;
  SwigluForwardKernel<<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(
      a.data<float>(), b.data<float>(), out.data<float>(), n);
  SY_CUDA_CHECK_LAUNCH();
}

void SwigluBackward(const Tensor& a, const Tensor& b, const Tensor& dout, Tensor& da, Tensor& db,
                    DeviceContext* ctx) {
  const int64_t n = da.numel();
  if (n == 0) return;
  SwigluBackwardKernel<<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(
      a.data<float>(), b.data<float>(), dout.data<float>(), da.data<float>(), db.data<float>(), n);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
