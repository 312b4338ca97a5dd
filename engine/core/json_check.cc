#include "engine/core/json_check.h"

#include <set>
#include <utility>

#include <nlohmann/json.hpp>

namespace switchyard {

using json = nlohmann::json;

std::vector<std::string> DuplicateJsonKey(const std::string& text) {
  std::vector<std::set<std::string>> keys;  // the keys seen in each open object or array
  std::vector<std::string> path;            // the key last read at each open level
  std::vector<std::string> twice;
  json::parser_callback_t note = [&](int, json::parse_event_t event, json& parsed) {
    using E = json::parse_event_t;
    if (event == E::object_start || event == E::array_start) {
      keys.emplace_back();
      path.emplace_back();
    } else if (event == E::object_end || event == E::array_end) {
      keys.pop_back();
      path.pop_back();
    } else if (event == E::key && twice.empty() && !keys.empty()) {
      path.back() = parsed.get<std::string>();
      if (!keys.back().insert(path.back()).second) {
        for (const std::string& k : path) {
          if (!k.empty()) twice.push_back(k);
        }
      }
    }
    return true;
  };
  if (json::parse(text, note, /*allow_exceptions=*/false).is_discarded()) return {};
  return twice;
}

namespace {

// The parser's own message names the line, the column and what it expected; the exception is
// the only place it gives them. The callback keeps nothing, so no tree is built.
template <typename Input>
std::string SyntaxError(Input&& input) {
  json::parser_callback_t discard = [](int, json::parse_event_t, json&) { return false; };
  try {
    [[maybe_unused]] const json nothing = json::parse(std::forward<Input>(input), discard);
  } catch (const json::parse_error& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 9: ...": from "line".
    const std::string what = e.what();
    const std::string::size_type at = what.find("parse error at ");
    return at == std::string::npos ? what : what.substr(at + 15);
  } catch (const json::exception& e) {
    // A number beyond a double's range (out_of_range.406, which the non-throwing parse also
    // refuses): "[json.exception.out_of_range.406] number overflow parsing '1e999'", from
    // "number". It has no line or column.
    const std::string what = e.what();
    const std::string::size_type at = what.find("] ");
    return at == std::string::npos ? what : what.substr(at + 2);
  }
  return "";
}

}  // namespace

std::string JsonSyntaxError(const std::string& text) { return SyntaxError(text); }

std::string JsonSyntaxError(std::istream& in) { return SyntaxError(in); }

}  // namespace switchyard
