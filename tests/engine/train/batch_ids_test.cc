// The host check of a micro-batch's ids (engine/train/runtime.h, CheckBatchIds), which lets
// the decoder skip the embedding's per-lookup device check and the loss's bad-target
// readback in a training step: valid ids and targets (-1 masked) pass; an id or a target
// outside the vocabulary is fatal, naming it and its position with the embedding's and the
// loss's messages.
#include <gtest/gtest.h>

#include <vector>

#include "engine/train/runtime.h"

namespace switchyard::train {
namespace {

data::Batch BatchOf(std::vector<int32_t> inputs, std::vector<int32_t> targets) {
  data::Batch b;
  const int64_t n = static_cast<int64_t>(inputs.size());
  b.inputs = Tensor::FromVector(inputs, {1, n});
  b.targets = Tensor::FromVector(targets, {1, n});
  return b;
}

TEST(BatchIdsTest, ValidIdsAndMaskedTargetsPass) {
  CheckBatchIds(BatchOf({0, 5, 7, 3}, {5, 7, 3, -1}), 8);
}

TEST(BatchIdsDeathTest, AnIdOutsideTheVocabularyIsFatal) {
  EXPECT_DEATH(CheckBatchIds(BatchOf({0, 5, 8, 3}, {5, 7, 3, 1}), 8),
               "EmbeddingForward: id 8 at 2 is outside the table of 8 rows");
  EXPECT_DEATH(CheckBatchIds(BatchOf({-2, 5}, {5, 1}), 8),
               "EmbeddingForward: id -2 at 0 is outside the table of 8 rows");
}

TEST(BatchIdsDeathTest, ATargetOutsideTheVocabularyIsFatal) {
  EXPECT_DEATH(CheckBatchIds(BatchOf({0, 5, 7}, {5, 9, 1}), 8),
               "target 9 at row 1 is outside the vocabulary of 8");
  EXPECT_DEATH(CheckBatchIds(BatchOf({0, 5}, {5, -3}), 8),
               "target -3 at row 1 is outside the vocabulary of 8");
}

}  // namespace
}  // namespace switchyard::train
