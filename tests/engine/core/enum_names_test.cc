// engine/core/enum_names.h: a name table parses, names and lists its values, and an unknown
// name is one error naming the key, the value and every allowed name.
#include "engine/core/enum_names.h"

#include <gtest/gtest.h>

#include "engine/core/device.h"

namespace switchyard {
namespace {

enum class Fruit { kApple, kPear, kFig };
constexpr EnumName<Fruit> kFruitNames[] = {
    {Fruit::kApple, "apple"}, {Fruit::kPear, "pear"}, {Fruit::kFig, "fig"}};

TEST(EnumNamesTest, NamesAndValuesRoundTrip) {
  for (const EnumName<Fruit>& row : kFruitNames) {
    EXPECT_STREQ(NameOf(kFruitNames, row.value), row.name);
    EXPECT_EQ(FindByName(kFruitNames, row.name), row.value);
  }
  EXPECT_EQ(FindByName(kFruitNames, "Apple"), std::nullopt);  // exact, case-sensitive
  EXPECT_EQ(FindByName(kFruitNames, ""), std::nullopt);
}

TEST(EnumNamesTest, JoinsNamesInTableOrder) {
  EXPECT_EQ(JoinNames(kFruitNames), "apple, pear, fig");
  EXPECT_EQ(JoinNames(kFruitNames, " or "), "apple, pear or fig");
  EXPECT_EQ(JoinNames(kDeviceTypeNames, " or "), "cpu or cuda");
}

TEST(EnumNamesTest, AnUnknownNameNamesTheKeyAndTheChoices) {
  auto pear = ParseByName(kFruitNames, "pear", "basket.fruit");
  ASSERT_TRUE(pear.ok());
  EXPECT_EQ(*pear, Fruit::kPear);
  auto plum = ParseByName(kFruitNames, "plum", "basket.fruit");
  ASSERT_FALSE(plum.ok());
  EXPECT_EQ(plum.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plum.status().message(), "basket.fruit='plum' is not one of apple, pear, fig");
}

TEST(EnumNamesTest, DevicesParseThroughTheTypeTable) {
  EXPECT_EQ(*ParseDevice("cpu"), Device::Cpu());
  EXPECT_EQ(*ParseDevice("cuda"), Device::Cuda(0));
  EXPECT_EQ(*ParseDevice("cuda:3"), Device::Cuda(3));
  EXPECT_EQ(Device::Cuda(3).ToString(), "cuda:3");
  EXPECT_EQ(Device::Cpu().ToString(), "cpu");
  for (const char* bad : {"gpu", "cpu:0", "cuda:", "cuda:x", "cuda:-1", "CUDA", ":1"}) {
    EXPECT_EQ(ParseDevice(bad).status().message(),
              std::string("unknown device '") + bad + "' (expected cpu, cuda or cuda:N)")
        << bad;
  }
}

}  // namespace
}  // namespace switchyard
