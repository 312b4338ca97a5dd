// What the emulation tests of the MoE routing kernels share (routing_emulation_test.cc: the
// router's choice, its backward and the expert-bias update; routing_sums_emulation_test.cc:
// the counts, column sums, z-loss and load-balancing loss; balance_scopes_emulation_test.cc:
// the load-balancing loss's sequence and global scopes): the includes of the device code
// in the host model of CUDA (tests/kernels/cuda_emulation.h), the launch helpers with the
// .cu files' block sizes, the error-bound constants and a bit-for-bit comparison.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/philox.h"
#include "engine/core/tensor.h"
#include "kernels/balance_loss.h"
#include "kernels/moe_routing.h"
#include "kernels/random.h"
// Last: the host model defines CUDA's qualifiers as macros. The kernels declare their shared
// arrays inside the kernel: static, they are one array for the CTA's threads.
#include "tests/kernels/cuda_emulation.h"
#undef __shared__
#define __shared__ static

#include "kernels/cuda/balance_loss_kernels.cuh"
#include "kernels/cuda/moe_routing_kernels.cuh"

namespace switchyard::kernels::routing_emulation {

namespace rt = cuda::routing;
namespace bl = cuda::balance_loss;

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr double kU = 0x1p-24;         // f32 unit roundoff
inline constexpr double kTiny = 0x1p-148;     // two f32 subnormal steps
inline constexpr int kThreads = 256;          // the .cu files' grid-stride blocks

inline double Gamma53(int64_t m) {
  const double u = 0x1p-53;
  return m * u / (1.0 - m * u);
}

inline std::vector<float> Uniform(int64_t n, uint64_t stream, float lo, float hi) {
  Tensor t = Tensor::Empty({n}, DType::kF32);
  FillUniform(t, RngKey{43, stream}, 0, lo, hi);
  return t.ToVector<float>();
}

// The .cu's grid for 256 threads (its cap is never reached here; the grid-stride loops are
// run with smaller grids instead).
inline unsigned GridFor(int64_t n) { return cuda::GridFor(n, kThreads); }

inline unsigned char no_smem[1];  // the kernels' shared arrays are static: no dynamic shared memory

template <typename Kernel>
void Launch(unsigned blocks, int threads, Kernel kernel) {
  emu::Launch(EmuDim3{blocks, 1, 1}, threads, no_smem, 0, 0, kernel);
}

// A <<<1, 1>>> launch, run on this thread (the host model's CTAs are whole warps; these
// kernels have no barrier and no shuffle).
template <typename Kernel>
void RunOneThread(Kernel kernel) {
  threadIdx = {0, 0, 0};
  blockIdx = {0, 0, 0};
  blockDim = {1, 1, 1};
  gridDim = {1, 1, 1};
  kernel();
}

template <typename T>
void ExpectBits(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(&got[i], &want[i], sizeof(T)))
        << what << " element " << i << ": " << +got[i] << " vs " << +want[i];
  }
}

}  // namespace switchyard::kernels::routing_emulation
