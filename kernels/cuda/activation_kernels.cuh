// The device code of kernels/cuda/activation.cu (which launches it): gelu, relu and swiglu,
// forward and backward, one grid-stride kernel each over n elements. Each evaluates the CPU
// reference's expression (kernels/cuda/activation_math.cuh). Pointers are not __restrict__:
// an output may be an input's memory (each element is read, then written, by one thread).
// Include after kernels/cuda/device_common.cuh and kernels/cuda/activation_math.cuh.
#pragma once

#include <cstdint>

namespace switchyard::kernels::cuda::activation {
// Internal linkage: the emulation test compiles these kernels too, and links with the .cu's.
namespace {

// Threads per block; the grid is device_common.cuh's GridFor(n, kThreads), and the loops cover any
// grid.
constexpr int kThreads = 256;

__global__ void GeluForwardKernel(const float* x, float* y, int64_t n) {
  SY_GRID_STRIDE(i, n) { y[i] = Gelu(x[i]); }
}

// The backward kernels read the forward's input x (a, b) as T: f32, or bf16 (the values kept
// under bf16 activation storage, widened as they are loaded). They write the gradient as TO:
// f32, or bf16 (rounded as stored: the bf16 operand of the products that read it next; then
// it is not dy's memory).
template <typename T, typename TO = float>
__global__ void GeluBackwardKernel(const T* x, const float* dy, TO* dx, int64_t n) {
  SY_GRID_STRIDE(i, n) { StoreAs(dx, i, GeluGrad(LoadF32(x, i), dy[i])); }
}

__global__ void ReluForwardKernel(const float* x, float* y, int64_t n) {
  SY_GRID_STRIDE(i, n) {
    const float v = x[i];
    y[i] = v > 0.0f ? v : 0.0f;
  }
}

template <typename T, typename TO = float>
__global__ void ReluBackwardKernel(const T* x, const float* dy, TO* dx, int64_t n) {
  SY_GRID_STRIDE(i, n) { StoreAs(dx, i, LoadF32(x, i) > 0.0f ? dy[i] : 0.0f); }
}

__global__ void SwigluForwardKernel(const float* a, const float* b, float* out, int64_t n) {
  SY_GRID_STRIDE(i, n) { out[i] = Swiglu(a[i], b[i]); }
}

template <typename T, typename TO = float>
__global__ void SwigluBackwardKernel(const T* a, const T* b, const float* dout, TO* da, TO* db,
                                     int64_t n) {
  SY_GRID_STRIDE(i, n) {
    float vda, vdb;
    SwigluGrad(LoadF32(a, i), LoadF32(b, i), dout[i], &vda, &vdb);
    StoreAs(da, i, vda);
    StoreAs(db, i, vdb);
  }
}

}  // namespace
}  // namespace switchyard::kernels::cuda::activation
