// kernels/embedding.h: the gather copies rows by id, the scatter-add backward sums the
// gradients of repeated ids (and leaves unused rows alone), both match central finite
// differences, learned positions add by sequence index and their backward sums over the
// batch, and an id outside the table is fatal.
#include "kernels/embedding.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/kernels/grad_check.h"

namespace switchyard::kernels {
namespace {

using testing::Dot;
using testing::ExpectClose;
using testing::NumericGradient;
using testing::RandomTensor;

constexpr int64_t kV = 6, kD = 3;
// L is linear in the table: central differences are exact up to f32 rounding of L over 2h.
constexpr float kStep = 1e-2f;
constexpr double kFdAbsTol = 1e-4, kFdRelTol = 1e-4;

TEST(EmbeddingTest, ForwardGathersRows) {
  Tensor table = RandomTensor({kV, kD}, 1);
  Tensor ids = Tensor::FromVector<int32_t>({4, 0, 4, 5}, {2, 2});
  Tensor out = Tensor::Empty({2, 2, kD}, DType::kF32);
  EmbeddingForward(ids, table, out);
  const std::vector<float> t = table.ToVector<float>(), o = out.ToVector<float>();
  const int ids_flat[] = {4, 0, 4, 5};
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < kD; ++j) EXPECT_EQ(o[i * kD + j], t[ids_flat[i] * kD + j]);
}

TEST(EmbeddingTest, BackwardAccumulatesRepeatedIds) {
  // Token 2 appears three times, token 5 once; the other rows get nothing.
  Tensor ids = Tensor::FromVector<int32_t>({2, 5, 2, 2}, {4});
  Tensor dout =
      Tensor::FromVector<float>({1, 2, 3, 10, 20, 30, 0.5f, 0.25f, 0.125f, -1, -1, -1}, {4, kD});
  Tensor dtable = Tensor::Zeros({kV, kD}, DType::kF32);
  dtable.data<float>()[0] = 7.0f;  // an existing value: Backward accumulates
  EmbeddingBackward(ids, dout, dtable);
  std::vector<float> want(kV * kD, 0.0f);
  want[0] = 7.0f;
  want[2 * kD + 0] = 1 + 0.5f - 1;
  want[2 * kD + 1] = 2 + 0.25f - 1;
  want[2 * kD + 2] = 3 + 0.125f - 1;
  want[5 * kD + 0] = 10, want[5 * kD + 1] = 20, want[5 * kD + 2] = 30;
  EXPECT_EQ(dtable.ToVector<float>(), want);
}

TEST(EmbeddingTest, BackwardMatchesFiniteDifferences) {
  Tensor table = RandomTensor({kV, kD}, 2);
  Tensor ids = Tensor::FromVector<int32_t>({1, 3, 1, 0, 3, 3}, {6});
  const std::vector<float> dy = RandomTensor({6, kD}, 3).ToVector<float>();
  auto loss = [&] {
    Tensor out = Tensor::Empty({6, kD}, DType::kF32);
    EmbeddingForward(ids, table, out);
    return Dot(out, dy);
  };
  Tensor dtable = Tensor::Zeros({kV, kD}, DType::kF32);
  EmbeddingBackward(ids, Tensor::FromVector(dy, {6, kD}), dtable);
  ExpectClose(dtable.ToVector<float>(), NumericGradient(table, loss, kStep), kFdAbsTol, kFdRelTol,
              "embedding dtable");
}

TEST(EmbeddingTest, PositionsAddBySequenceIndexAndSumOverTheBatch) {
  constexpr int64_t kB = 2, kS = 3, kSmax = 5, kOffset = 1;
  Tensor wpe = RandomTensor({kSmax, kD}, 4);
  Tensor x = RandomTensor({kB, kS, kD}, 5);
  const std::vector<float> x0 = x.ToVector<float>(), w = wpe.ToVector<float>();
  AddPositionEmbedding(x, wpe, kOffset);
  const std::vector<float> x1 = x.ToVector<float>();
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t s = 0; s < kS; ++s)
      for (int64_t j = 0; j < kD; ++j) {
        const int64_t i = (b * kS + s) * kD + j;
        EXPECT_EQ(x1[i], x0[i] + w[(kOffset + s) * kD + j]);
      }

  const std::vector<float> dy = RandomTensor({kB, kS, kD}, 6).ToVector<float>();
  auto loss = [&] {
    Tensor y = x.Clone();
    AddPositionEmbedding(y, wpe, kOffset);
    return Dot(y, dy);
  };
  Tensor dwpe = Tensor::Zeros({kSmax, kD}, DType::kF32);
  PositionEmbeddingBackward(Tensor::FromVector(dy, {kB, kS, kD}), dwpe, kOffset);
  ExpectClose(dwpe.ToVector<float>(), NumericGradient(wpe, loss, kStep), kFdAbsTol, kFdRelTol,
              "position dwpe");
  // Rows outside [offset, offset + S) are untouched.
  const std::vector<float> g = dwpe.ToVector<float>();
  for (int64_t j = 0; j < kD; ++j) {
    EXPECT_EQ(g[j], 0.0f);
    EXPECT_EQ(g[4 * kD + j], 0.0f);
  }
}

TEST(EmbeddingDeathTest, IdOutsideTheTableIsFatal) {
  Tensor table = Tensor::Zeros({kV, kD}, DType::kF32), out = Tensor::Empty({1, kD}, DType::kF32);
  Tensor ids = Tensor::FromVector<int32_t>({kV}, {1});
  EXPECT_DEATH(EmbeddingForward(ids, table, out), "outside the table");
  Tensor x = Tensor::Zeros({1, 4, kD}, DType::kF32), wpe = Tensor::Zeros({3, kD}, DType::kF32);
  EXPECT_DEATH(AddPositionEmbedding(x, wpe), "exceed S_max");
}

}  // namespace
}  // namespace switchyard::kernels
