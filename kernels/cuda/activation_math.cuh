// The activations' device math, shared by kernels/cuda/activation.cu (the elementwise ops) and
// kernels/cuda/bias.cu (bias + activation fused): the CPU reference's f32 expressions
// (kernels/cpu/activation.cc) in its order, with __fmul_rn / __fadd_rn / __fdiv_rn, so that
// nothing is contracted into a fused multiply-add; only expf differs from the CPU's (CUDA's is
// within 2 ulp, the CPU's VecExp, kernels/cpu/vec_math.h, within 2 ulp too).
#pragma once

namespace switchyard::kernels::cuda {

constexpr float kSqrt2OverPi = 0.79788456080286535588f;  // sqrt(2 / pi), as the CPU
constexpr float kGeluCubic = 0.044715f;

// u = sqrt(2/pi) (v + 0.044715 v^3), with the CPU's association ((c v) v) v.
__device__ __forceinline__ float GeluInner(float v) {
  const float cubic = __fmul_rn(__fmul_rn(__fmul_rn(kGeluCubic, v), v), v);
  return __fmul_rn(kSqrt2OverPi, __fadd_rn(v, cubic));
}

__device__ __forceinline__ float Sigmoid(float a) {
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-a)));
}

// gelu(v): 0.5 (1 + tanh u) = sigmoid(2 u), as the CPU computes it.
__device__ __forceinline__ float Gelu(float v) {
  const float e = expf(__fmul_rn(-2.0f, GeluInner(v)));
  return __fdiv_rn(v, __fadd_rn(1.0f, e));
}

// dy * gelu'(v).
__device__ __forceinline__ float GeluGrad(float v, float dy) {
  const float e = expf(__fmul_rn(-2.0f, GeluInner(v)));
  const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, e));
  // du/dx = sqrt(2/pi) (1 + 3 c v^2), associated as ((3 c) v) v.
  const float du = __fmul_rn(
      kSqrt2OverPi, __fadd_rn(1.0f, __fmul_rn(__fmul_rn(__fmul_rn(3.0f, kGeluCubic), v), v)));
  // s + 2 v s (1 - s) du, associated left to right as on the CPU.
  const float term =
      __fmul_rn(__fmul_rn(__fmul_rn(__fmul_rn(2.0f, v), s), __fsub_rn(1.0f, s)), du);
  return __fmul_rn(dy, __fadd_rn(s, term));
}

__device__ __forceinline__ float Swiglu(float va, float vb) {
  return __fmul_rn(__fmul_rn(va, Sigmoid(va)), vb);
}

// da = g vb s (1 + va (1 - s)), db = g va s, associated as on the CPU.
__device__ __forceinline__ void SwigluGrad(float va, float vb, float g, float* da, float* db) {
  const float s = Sigmoid(va);
  const float dsilu = __fadd_rn(1.0f, __fmul_rn(va, __fsub_rn(1.0f, s)));
  *da = __fmul_rn(__fmul_rn(__fmul_rn(g, vb), s), dsilu);
  *db = __fmul_rn(__fmul_rn(g, va), s);
}

}  // namespace switchyard::kernels::cuda
