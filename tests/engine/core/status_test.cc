#include "engine/core/status.h"

#include <gtest/gtest.h>

#include "engine/core/check.h"
#include "engine/core/logging.h"

namespace switchyard {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("x=", x, " is odd");
  return x / 2;
}

StatusOr<int> Quarter(int x) {
  SY_ASSIGN_OR_RETURN(int half, Half(x));
  SY_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

Status CheckQuarter(int x) {
  SY_RETURN_IF_ERROR(Quarter(x).status());
  return OkStatus();
}

TEST(StatusTest, MacrosPropagateTheFirstError) {
  EXPECT_EQ(*Quarter(12), 3);
  auto odd = Quarter(6);  // 6 -> 3 -> odd
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(odd.status().message(), "x=3 is odd");
  EXPECT_TRUE(CheckQuarter(8).ok());
  EXPECT_EQ(CheckQuarter(5).message(), "x=5 is odd");
}

TEST(StatusTest, StrCatTakesStringViews) {
  std::string_view name = "tp";
  EXPECT_EQ(StrCat(name, "=", 4, ", ", 2.5), "tp=4, 2.5");
}

// Bytes a file held, echoed in a message: control bytes and invalid UTF-8 escaped, valid
// UTF-8 kept, so no raw byte reaches the terminal.
TEST(StatusTest, PrintableTextEscapesWhatATerminalWouldActOn) {
  EXPECT_EQ(PrintableText("plain text, 1.5 [a] {b}"), "plain text, 1.5 [a] {b}");
  EXPECT_EQ(PrintableText(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(PrintableText("\x1b[31mred\x7f\n\t\r"), "\\x1b[31mred\\x7f\\n\\t\\r");
  EXPECT_EQ(PrintableText("caf\xc3\xa9 \xe2\x82\xac"), "caf\xc3\xa9 \xe2\x82\xac");  // é, €
  EXPECT_EQ(PrintableText("\xff\xc3(\xe2\x82"), "\\xff\\xc3(\\xe2\\x82");  // not UTF-8
  EXPECT_EQ(PrintableText(PrintableText("\x01")), "\\x01");  // escaping twice changes nothing
}

TEST(CheckDeathTest, FailedCheckNamesRankFileAndValues) {
  SetLogRank(3);
  int a = 1, b = 2;
  EXPECT_DEATH(SY_CHECK_EQ(a, b) << "context", R"(\[F r3 status_test.cc:[0-9]+\] Check failed: a == b \(1 vs 2\) context)");
  EXPECT_DEATH(SY_CHECK(a > b), "Check failed: a > b");
  EXPECT_DEATH(SY_CHECK_OK(InvalidArgument("bad ", 7)), "bad 7");
  SetLogRank(-1);
}

}  // namespace
}  // namespace switchyard
