// kernels/rope.h on CUDA against the CPU reference on the same random inputs: head widths
// 2 to 128 (hd/2 = 1, 3, 16, 32, 48, 64), one token to 300, position offsets 0 and 5000
// (large angles), a non-default base, an empty batch, forward and backward, in place.
//
// Tolerance. Both devices evaluate pos * base^(-2i/hd) and its cosine and sine in double
// and round them to f32; CUDA's pow / sincos are within 2 double ulps of the host's, which
// at angles of ~5000 rad can flip the f32 rounding of cos or sin by one ulp (<= 6e-8) with
// a probability of ~1e-4 per value. The rotation itself is the same f32 expression on both
// (no FMA contraction on the GPU). With |x| <= 1, one flipped table value moves a product
// by <= 1.2e-7 after rounding and the sum by one more ulp: |gpu - cpu| <= 5e-7 leaves
// room for both cos and sin flipping; no relative part.
#include <gtest/gtest.h>

#include <string>

#include "engine/core/device_context.h"
#include "kernels/rope.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard::kernels {
namespace {

using gpu_test::ExpectBitEqual;
using gpu_test::ExpectNear;
using gpu_test::HostUniform;

constexpr double kAbs = 5e-7;

const Device kCuda = Device::Cuda(0);

void CheckRope(const Shape& shape, float base, int64_t offset, uint64_t seed) {
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  const std::string name = "rope x" + ShapeString(shape) + " base " + std::to_string(base) +
                           " offset " + std::to_string(offset);
  Tensor x = HostUniform(shape, seed);
  Tensor y = Tensor::Empty(shape, DType::kF32), dx = Tensor::Empty(shape, DType::kF32);
  RopeForward(x, y, base, offset);
  RopeBackward(x, dx, base, offset);

  Tensor x_d = x.To(kCuda, gpu);
  Tensor y_d = Tensor::Empty(shape, DType::kF32, kCuda);
  Tensor dx_d = Tensor::Empty(shape, DType::kF32, kCuda);
  RopeForward(x_d, y_d, base, offset, gpu);
  RopeBackward(x_d, dx_d, base, offset, gpu);
  ExpectNear(y_d, y, kAbs, 0.0, gpu, name + " forward");
  ExpectNear(dx_d, dx, kAbs, 0.0, gpu, name + " backward");

  Tensor inplace_d = x.To(kCuda, gpu);
  RopeForward(inplace_d, inplace_d, base, offset, gpu);
  ExpectBitEqual(inplace_d, y_d, gpu, name + " forward in place vs out of place");
  RopeBackward(inplace_d, inplace_d, base, offset, gpu);
  // The backward undoes the forward up to f32 rounding.
  ExpectNear(inplace_d, x, 1e-6, 0.0, gpu, name + " backward(forward(x)) = x");
}

TEST(RopeGpuTest, MatchesCpuOnChosenShapes) {
  SY_REQUIRE_GPU();
  const Shape shapes[] = {{1, 1, 1, 2},    {2, 5, 3, 2},   {1, 7, 2, 6},    {2, 33, 4, 32},
                          {1, 300, 2, 64}, {3, 17, 5, 96}, {2, 64, 4, 128}, {0, 4, 2, 8}};
  uint64_t seed = 700;
  for (const Shape& shape : shapes) {
    CheckRope(shape, kRopeBase, 0, seed += 10);
    CheckRope(shape, kRopeBase, 5000, seed += 10);
  }
}

TEST(RopeGpuTest, MatchesCpuWithAnotherBase) {
  SY_REQUIRE_GPU();
  CheckRope({2, 40, 3, 64}, 500000.0f, 17, 800);
}

}  // namespace
}  // namespace switchyard::kernels
