// kernels/softmax.h on CUDA against the CPU reference on the same random inputs: rows of
// width 1, 7, 31, 33, 1000 and 50257 (a GPT-2 vocabulary: more than one pass of a 1024-thread
// block), one row to 500 rows, a 3-d tensor, no rows, large logits (the max subtraction),
// and in place (y = x, dx = dy).
//
// Tolerances. Both devices take the f32 max, sum the exponentials in double and use the
// same f32 expressions (the GPU without FMA contraction); they differ in CUDA's expf (<= 2
// ulp) against the host's exp and in the order of the double sums (which can move the f32
// rounding of 1/sum or of the dot product by one ulp):
//   y:  |gpu - cpu| <= 1e-7 + 1e-5 |cpu|   (a few ulps of each probability)
//   dx: |gpu - cpu| <= 1e-6 + 1e-5 |cpu|   (y (dy - dot): the dot's last ulp, times y)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "kernels/softmax.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard::kernels {
namespace {

using gpu_test::ExpectBitEqual;
using gpu_test::ExpectNear;
using gpu_test::HostUniform;

constexpr double kYAbs = 1e-7, kYRel = 1e-5;
constexpr double kDxAbs = 1e-6, kDxRel = 1e-5;

const Device kCuda = Device::Cuda(0);

void CheckSoftmax(const Shape& shape, float scale, uint64_t seed) {
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  const std::string name = "softmax x" + ShapeString(shape) + " scale " + std::to_string(scale);
  Tensor x = HostUniform(shape, seed, -scale, scale);
  Tensor y = Tensor::Empty(shape, DType::kF32);
  SoftmaxForward(x, y);
  Tensor x_d = x.To(kCuda, gpu), y_d = Tensor::Empty(shape, DType::kF32, kCuda);
  SoftmaxForward(x_d, y_d, gpu);
  ExpectNear(y_d, y, kYAbs, kYRel, gpu, name + " y");
  Tensor inplace_d = x.To(kCuda, gpu);
  SoftmaxForward(inplace_d, inplace_d, gpu);
  ExpectBitEqual(inplace_d, y_d, gpu, name + " y in place vs out of place");

  // Backward from the CPU's y on both sides.
  Tensor dy = HostUniform(shape, seed + 1);
  Tensor dx = Tensor::Empty(shape, DType::kF32);
  SoftmaxBackward(y, dy, dx);
  Tensor yc_d = y.To(kCuda, gpu), dy_d = dy.To(kCuda, gpu);
  Tensor dx_d = Tensor::Empty(shape, DType::kF32, kCuda);
  SoftmaxBackward(yc_d, dy_d, dx_d, gpu);
  ExpectNear(dx_d, dx, kDxAbs, kDxRel, gpu, name + " dx");
  SoftmaxBackward(yc_d, dy_d, dy_d, gpu);
  ExpectBitEqual(dy_d, dx_d, gpu, name + " dx in place vs out of place");
}

TEST(SoftmaxGpuTest, MatchesCpuOnChosenWidths) {
  SY_REQUIRE_GPU();
  const Shape shapes[] = {{1, 1},    {4, 1},     {1, 7},     {3, 31},    {5, 33},
                          {500, 64}, {17, 1000}, {3, 50257}, {2, 3, 33}, {0, 8}};
  uint64_t seed = 500;
  for (const Shape& shape : shapes) CheckSoftmax(shape, 4.0f, seed += 10);
}

TEST(SoftmaxGpuTest, LargeLogitsStayFinite) {
  SY_REQUIRE_GPU();
  // Logits up to +-80: exp without the max subtraction would overflow f32.
  CheckSoftmax({6, 1000}, 80.0f, 600);
  CheckSoftmax({2, 50257}, 80.0f, 610);
}

TEST(SoftmaxGpuTest, MoreRowsThanOneGridPass) {
  SY_REQUIRE_GPU();
  // The kernels launch at most 65535 * 16 = 1048560 row blocks and stride over the rest:
  // 1100000 rows make the blocks take a second row.
  CheckSoftmax({1100000, 2}, 4.0f, 620);
}

}  // namespace
}  // namespace switchyard::kernels
