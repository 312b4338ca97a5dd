// Shared by the GPU tests: skip with the reason when no CUDA device can run them.
#pragma once

#include <gtest/gtest.h>

#include "engine/core/device.h"

#ifdef SY_HAVE_CUDA
#define SY_REQUIRE_GPU()                                                          \
  do {                                                                            \
    if (!::switchyard::CudaAvailable())                                           \
      GTEST_SKIP() << "no CUDA device visible on this machine; the CUDA code is " \
                      "compiled but this test needs a GPU to run";                \
  } while (0)
#else
#define SY_REQUIRE_GPU() \
  GTEST_SKIP() << "this build has no CUDA backend (SWITCHYARD_CUDA=OFF or no nvcc)"
#endif

// ---- Helpers of the row-kernel GPU tests (norm, softmax, rope, embedding, cross_entropy).
// In their own namespace so that argument-dependent lookup never pairs them with a test
// file's local helpers of the same name.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/philox.h"
#include "engine/core/tensor.h"
#include "kernels/random.h"

namespace switchyard::gpu_test {

// A host f32 tensor, uniform in [lo, hi), from Philox key {seed, 0}.
inline Tensor HostUniform(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  kernels::FillUniform(t, RngKey{seed, 0}, 0, lo, hi);
  return t;
}

// The values of a tensor on any device, read back in ctx's stream order.
template <typename T>
std::vector<T> ValuesOf(const Tensor& t, DeviceContext* ctx) {
  return t.device().is_cpu() ? t.ToVector<T>() : t.To(Device::Cpu(), ctx).ToVector<T>();
}

// Expects |got - want| <= atol + rtol |want| for every element (NaN fails) and prints the
// largest fraction of the tolerance used.
inline void ExpectNear(const Tensor& got, const Tensor& want, double atol, double rtol,
                       DeviceContext* ctx, const std::string& what) {
  const std::vector<float> g = ValuesOf<float>(got, ctx), w = ValuesOf<float>(want, ctx);
  ASSERT_EQ(g.size(), w.size()) << what;
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double err = std::fabs(static_cast<double>(g[i]) - w[i]);
    const double tol = atol + rtol * std::fabs(static_cast<double>(w[i]));
    const double used = err <= tol ? (tol > 0 ? err / tol : 0.0) : INFINITY;
    if (used > worst) worst = used, worst_i = i;
  }
  EXPECT_LE(worst, 1.0) << what << ": element " << worst_i << " is " << g[worst_i]
                        << ", expected " << w[worst_i];
  std::printf("  %-56s tolerance used %.3f\n", what.c_str(), worst);
}

// Expects the same bits in every element (2- or 4-byte dtypes: bf16, f32, i32).
inline void ExpectBitEqual(const Tensor& got, const Tensor& want, DeviceContext* ctx,
                           const std::string& what) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.numel(), want.numel()) << what;
  const size_t size = SizeOf(got.dtype());
  ASSERT_TRUE(size == 2 || size == 4) << what;
  const Tensor g = got.device().is_cpu() ? got : got.To(Device::Cpu(), ctx);
  const Tensor w = want.device().is_cpu() ? want : want.To(Device::Cpu(), ctx);
  const char* gp = static_cast<const char*>(g.raw_data());
  const char* wp = static_cast<const char*>(w.raw_data());
  int64_t mismatches = 0, first = -1;
  for (int64_t i = 0; i < g.numel(); ++i) {
    if (std::memcmp(gp + i * size, wp + i * size, size) != 0 && mismatches++ == 0) first = i;
  }
  EXPECT_EQ(mismatches, 0) << what << ": " << mismatches << " elements differ, the first at "
                           << first;
  std::printf("  %-56s bit-identical: %s\n", what.c_str(), mismatches == 0 ? "yes" : "NO");
}

}  // namespace switchyard::gpu_test
