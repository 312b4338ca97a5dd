// The training step's single readback (engine/core/step_readback.h) and the PendingSums that
// name its slots (engine/core/pending_sum.h):
//  - a PendingSum evaluates the additions recorded, in the order written, to the same bits
//    as adding the values at once, with values chosen so that another order rounds
//    differently (1e16 + 1 + 1 differs from 1e16 + (1 + 1)), nested sums included;
//  - reading a pending sum as a double is a fatal check; known sums read as doubles;
//  - StepReadback hands out consecutive zeroed slots over several chunks and reads them all
//    back in one counted readback ("step_end"), in slot order, then starts empty;
//  - told how many slots to expect (the last step's), its first chunk holds them all and
//    ReadBack copies nothing but the one readback.
#include <gtest/gtest.h>

#include <vector>

#include "engine/core/counters.h"
#include "engine/core/pending_sum.h"
#include "engine/core/step_readback.h"

namespace switchyard {
namespace {

TEST(PendingSumTest, SameBitsAsAddingAtOnce) {
  const std::vector<double> slots = {1.0, 1e16, 1.0, -1e16, 0.1, 0.2};
  // Direct: x = 0; x += 1e16; x += 1; x += 1 (the 1s are lost one at a time).
  double direct = 0.0;
  direct += slots[1];
  direct += slots[0];
  direct += slots[2];
  PendingSum pending;
  pending += PendingSum::Slot(1);
  pending += PendingSum::Slot(0);
  pending += PendingSum::Slot(2);
  EXPECT_FALSE(pending.known());
  EXPECT_EQ(pending.Value(slots), direct);
  // A nested sum is evaluated on its own first: 1e16 + (1 + 1) keeps the 2.
  PendingSum inner = PendingSum::Slot(0);
  inner += PendingSum::Slot(2);
  PendingSum outer = PendingSum::Slot(1);
  outer += inner;
  const double nested = slots[1] + (slots[0] + slots[2]);
  ASSERT_NE(nested, direct) << "the values must tell the two orders apart";
  EXPECT_EQ(outer.Value(slots), nested);
  // Known terms mixed in, in order: 0.1 + slot 5 + 0.3 + slot 3.
  PendingSum mixed(0.1);
  mixed += PendingSum::Slot(5);
  mixed += 0.3;
  mixed += PendingSum::Slot(3);
  EXPECT_EQ(mixed.Value(slots), ((0.1 + slots[5]) + 0.3) + slots[3]);
  mixed.Resolve(slots);
  EXPECT_TRUE(mixed.known());
  EXPECT_EQ(static_cast<double>(mixed), ((0.1 + slots[5]) + 0.3) + slots[3]);
}

TEST(PendingSumTest, KnownSumsAreDoubles) {
  PendingSum s;
  s += 0.25f;
  s += PendingSum(0.5);
  EXPECT_TRUE(s.known());
  EXPECT_EQ(static_cast<double>(s), 0.75);
}

TEST(PendingSumDeathTest, ReadingAPendingSumIsFatal) {
  const PendingSum s = PendingSum::Slot(0);
  EXPECT_DEATH((void)static_cast<double>(s), "before the step's readback");
}

TEST(StepReadbackTest, OneReadbackInSlotOrder) {
  StepReadback readback;
  std::vector<double> want;
  // 300 single slots and a block of 250: three chunks of 256.
  for (int i = 0; i < 300; ++i) {
    StepReadback::Slots s = readback.Reserve(1, Device::Cpu(), nullptr);
    EXPECT_EQ(s.first, i);
    EXPECT_EQ(s.values.ToVector<double>(), std::vector<double>{0.0});
    s.values.data<double>()[0] = 0.5 * i;
    want.push_back(0.5 * i);
  }
  StepReadback::Slots block = readback.Reserve(250, Device::Cpu(), nullptr);
  EXPECT_EQ(block.first, 300);
  for (int i = 0; i < 250; ++i) {
    block.values.data<double>()[i] = -1.0 * i;
    want.push_back(-1.0 * i);
  }
  EXPECT_EQ(readback.size(), 550);
  const DeviceCounts before = counters::Snapshot();
  EXPECT_EQ(readback.ReadBack(nullptr), want);
  const DeviceCounts read = counters::Snapshot().Minus(before);
  EXPECT_EQ(read.readbacks, 1);
  EXPECT_EQ(read.readback_sites.at("step_end"), 1);
  EXPECT_EQ(readback.size(), 0);
  const DeviceCounts again = counters::Snapshot();
  EXPECT_TRUE(readback.ReadBack(nullptr).empty());
  EXPECT_EQ(counters::Snapshot().Minus(again).readbacks, 0) << "nothing reserved: nothing read";
}

TEST(StepReadbackTest, ExpectedSlotsFitOneChunk) {
  // The same reservations as a step that took 300 single slots and a block of 250.
  const auto run = [](StepReadback& readback) {
    std::vector<double> want;
    for (int i = 0; i < 300; ++i) {
      StepReadback::Slots s = readback.Reserve(1, Device::Cpu(), nullptr);
      EXPECT_EQ(s.values.ToVector<double>(), std::vector<double>{0.0});
      s.values.data<double>()[0] = 0.5 * i;
      want.push_back(0.5 * i);
    }
    StepReadback::Slots block = readback.Reserve(250, Device::Cpu(), nullptr);
    for (int i = 0; i < 250; ++i) {
      block.values.data<double>()[i] = -1.0 * i;
      want.push_back(-1.0 * i);
    }
    const DeviceCounts before = counters::Snapshot();
    EXPECT_EQ(readback.ReadBack(nullptr), want);
    return counters::Snapshot().Minus(before);
  };
  StepReadback first;
  const DeviceCounts chunked = run(first);
  EXPECT_EQ(first.last_read(), 550);
  EXPECT_EQ(chunked.dispatch_ops.count("CopyFrom") ? chunked.dispatch_ops.at("CopyFrom") : 0, 3)
      << "three chunks laid side by side";
  StepReadback next(first.last_read());
  const DeviceCounts whole = run(next);
  EXPECT_EQ(whole.readbacks, 1);
  EXPECT_EQ(whole.dispatch_ops.count("CopyFrom"), 0u) << "one chunk: read back as it is";
  // More than expected still works: a second chunk after the first.
  StepReadback small(10);
  const DeviceCounts grown = run(small);
  EXPECT_EQ(grown.readbacks, 1);
}

}  // namespace
}  // namespace switchyard
