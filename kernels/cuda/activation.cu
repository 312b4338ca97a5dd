// CUDA implementation of kernels/activation.h's elementwise activations (the bias ops, and
// bias + activation fused, are kernels/cuda/bias.cu).
//
// Grid-stride kernels (kernels/cuda/activation_kernels.cuh), 256 threads per block, GridFor(n)
// blocks. Each evaluates the CPU reference's expression (kernels/cuda/activation_math.cuh),
// so the only difference from the CPU is expf. Outputs may be the inputs' memory; a backward's
// gradient may be bf16 (rounded as stored), then not dy's memory.
#include <cstdint>
#include <type_traits>

#include "kernels/activation.h"
#include "kernels/cuda/activation_math.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/activation_kernels.cuh"

namespace switchyard::kernels::cuda {
namespace {
using activation::GeluBackwardKernel;
using activation::GeluForwardKernel;
using activation::kThreads;
using activation::ReluBackwardKernel;
using activation::ReluForwardKernel;
using activation::SwigluBackwardKernel;
using activation::SwigluForwardKernel;
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
  WithF32OrBf16(x, [&](auto* xp) {
    WithF32OrBf16(dx, [&](auto* dxp) {
      GeluBackwardKernel<<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(
          xp, dy.data<float>(), dxp, n);
    });
  });
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
  WithF32OrBf16(x, [&](auto* xp) {
    WithF32OrBf16(dx, [&](auto* dxp) {
      ReluBackwardKernel<<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(
          xp, dy.data<float>(), dxp, n);
    });
  });
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
  WithF32OrBf16(a, [&](auto* ap) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(ap)>>;
    WithF32OrBf16(da, [&](auto* dap) {
      using TO = std::remove_pointer_t<decltype(dap)>;
      SwigluBackwardKernel<<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(
          ap, static_cast<const T*>(b.raw_data()), dout.data<float>(), dap,
          static_cast<TO*>(db.raw_data()), n);
    });
  });
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
