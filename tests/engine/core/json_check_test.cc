// The JSON text checks (engine/core/json_check.h) on hand-made texts.
#include "engine/core/json_check.h"

#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace switchyard {
namespace {

using Keys = std::vector<std::string>;

TEST(JsonCheckTest, DuplicateKeyNamesThePathToIt) {
  EXPECT_EQ(DuplicateJsonKey(R"({"a": 1, "b": 2})"), Keys{});
  EXPECT_EQ(DuplicateJsonKey(R"({"a": 1, "a": 2})"), Keys{"a"});
  EXPECT_EQ(DuplicateJsonKey(R"({"x": {"dtype": "F32", "dtype": "F16"}})"), (Keys{"x", "dtype"}));
  // The same key in two sibling objects is no repeat; the first repeat is the one named.
  EXPECT_EQ(DuplicateJsonKey(R"([{"a": 1}, {"a": 2}])"), Keys{});
  EXPECT_EQ(DuplicateJsonKey(R"({"m": {"k": 1, "k": 2}, "m": 3})"), (Keys{"m", "k"}));
  EXPECT_EQ(DuplicateJsonKey(R"({"a": 1, "a": )"), Keys{});  // not JSON: nothing to say
}

TEST(JsonCheckTest, SyntaxErrorGivesLineColumnAndReason) {
  EXPECT_EQ(JsonSyntaxError(R"({"a": [1, 2], "b": {"c": null}})"), "");
  EXPECT_EQ(JsonSyntaxError("{\"a\": 1,\n \"b\" 2}"),
            "line 2, column 6: syntax error while parsing object separator - unexpected number "
            "literal; expected ':'");
  EXPECT_EQ(JsonSyntaxError(""),
            "line 1, column 1: syntax error while parsing value - unexpected end of input; "
            "expected '[', '{', or a literal");
  // A truncated file (9 bytes): the column just past its last byte.
  EXPECT_EQ(JsonSyntaxError("{\"a\": [1,"),
            "line 1, column 10: syntax error while parsing value - unexpected end of input; "
            "expected '[', '{', or a literal");
  // From a stream, the same message.
  std::istringstream stream("{\"a\": 1,\n \"b\" 2}");
  EXPECT_EQ(JsonSyntaxError(stream),
            "line 2, column 6: syntax error while parsing object separator - unexpected number "
            "literal; expected ':'");
  std::istringstream good("[1, {\"x\": true}]");
  EXPECT_EQ(JsonSyntaxError(good), "");
  EXPECT_EQ(JsonSyntaxError("{} x"),
            "line 1, column 4: syntax error while parsing value - invalid literal; last read: "
            "'{} x'; expected end of input");
}

// A number no double holds is not JSON to the non-throwing parse the readers use; the
// parser throws out_of_range (not parse_error) for it, which escaped as a terminate in every
// reader of a user's JSON (found by tests/fuzz: checkpoint and corpus indexes holding -5e685).
TEST(JsonCheckTest, NumberOverflowIsAnErrorNotAThrow) {
  for (const std::string text : {"-5e685", "[1, 1e999]", "{\"a\": 4444444444447444e477777774444777}"}) {
    SCOPED_TRACE(text);
    EXPECT_TRUE(nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false).is_discarded());
    std::string why;
    EXPECT_NO_THROW(why = JsonSyntaxError(text));
    EXPECT_EQ(why.rfind("number overflow parsing '", 0), 0u) << why;
    std::istringstream in(text);
    EXPECT_EQ(JsonSyntaxError(in), why);
  }
  EXPECT_EQ(JsonSyntaxError("[1e308, -1e-400]"), "");  // the largest finite, an underflow to 0
}

}  // namespace
}  // namespace switchyard
