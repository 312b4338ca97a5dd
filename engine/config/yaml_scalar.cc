#include "engine/config/yaml_scalar.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string_view>

namespace switchyard::config {
namespace {

bool AllDigits(const std::string& s) {
  if (s.empty()) return false;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return false;
  }
  return true;
}

// The text of a plain decimal integer, or the error: a leading zero or a 0x / 0o / 0b prefix
// (YAML 1.1 readers, PyYAML among them, read 010 as 8 and 0x10 as 16; YAML 1.2 reads 010 as
// 10: refused rather than guessed, so every reader of the file agrees).
Status CheckDecimal(const YAML::Node& node, const std::string& where, std::string* digits,
                    bool* negative) {
  if (!node.IsScalar()) return ExpectedError(node, where, "an integer");
  const std::string& text = node.Scalar();
  const size_t sign = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
  *negative = sign == 1 && text[0] == '-';
  *digits = text.substr(sign);
  const bool prefixed = digits->size() > 1 && (*digits)[0] == '0' &&
                        std::string("xXoObB").find((*digits)[1]) != std::string::npos;
  if (prefixed) {
    return InvalidArgument(where, "='", text, "' is not a decimal integer (YAML reads 0x, 0o "
                           "and 0b as hexadecimal, octal and binary); write it in decimal");
  }
  if (!AllDigits(*digits)) return ExpectedError(node, where, "an integer");
  if (digits->size() > 1 && (*digits)[0] == '0') {
    return InvalidArgument(where, "='", text, "' has a leading zero (YAML 1.1 reads it as "
                           "octal); write the decimal number without it");
  }
  return OkStatus();
}

}  // namespace

std::string ScalarText(const YAML::Node& node) {
  if (!node || node.IsNull()) return "";
  return node.IsScalar() ? node.Scalar() : std::string(node.IsSequence() ? "[...]" : "{...}");
}

Status ExpectedError(const YAML::Node& node, const std::string& where, const char* kind) {
  if (!node || node.IsNull()) {
    return InvalidArgument(where, ": the value is empty (expected ", kind, ")");
  }
  return InvalidArgument(where, ": expected ", kind, ", got '", ScalarText(node), "'");
}

StatusOr<int64_t> ReadInt64(const YAML::Node& node, const std::string& where, int64_t lo,
                            int64_t hi) {
  std::string digits;
  bool negative = false;
  SY_RETURN_IF_ERROR(CheckDecimal(node, where, &digits, &negative));
  uint64_t magnitude = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), magnitude);
  // |v| up to 2^63 (so that -2^63 reads); anything larger is out of every field's range.
  const uint64_t limit = uint64_t{1} << 63;
  const bool fits = ec == std::errc() && (negative ? magnitude <= limit : magnitude < limit);
  const int64_t v = !fits ? 0
                    : negative ? static_cast<int64_t>(0 - magnitude)
                               : static_cast<int64_t>(magnitude);
  if (!fits || v < lo || v > hi) {
    return InvalidArgument(where, ": expected an integer in [", lo, ", ", hi, "], got '",
                           node.Scalar(), "'");
  }
  return v;
}

StatusOr<uint64_t> ReadUint64(const YAML::Node& node, const std::string& where) {
  std::string digits;
  bool negative = false;
  SY_RETURN_IF_ERROR(CheckDecimal(node, where, &digits, &negative));
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || (negative && v != 0)) {
    return InvalidArgument(where, ": expected an integer in [0, ",
                           std::numeric_limits<uint64_t>::max(), "], got '", node.Scalar(), "'");
  }
  return v;
}

StatusOr<double> ReadFiniteNumber(const YAML::Node& node, const std::string& where, bool f32) {
  if (!node.IsScalar()) return ExpectedError(node, where, "a number");
  const std::string& text = node.Scalar();
  const char* type = f32 ? "f32" : "f64";
  double v = 0;
  try {
    v = node.as<double>();
  } catch (const YAML::Exception&) {
    // yaml-cpp refuses what strtod reads but cannot hold (1e400, 1e-400): say which.
    errno = 0;
    char* end = nullptr;
    const double read = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || errno != ERANGE) {
      return ExpectedError(node, where, "a number");
    }
    return InvalidArgument(where, "=", text, std::fabs(read) > 1 ? " overflows " : " underflows ",
                           type);
  }
  if (!std::isfinite(v)) return InvalidArgument(where, "=", text, " must be a finite number");
  if (f32 && std::fabs(v) > std::numeric_limits<float>::max()) {
    return InvalidArgument(where, "=", text, " overflows f32 (the largest is ",
                           std::numeric_limits<float>::max(), ")");
  }
  if (f32 && v != 0 && static_cast<float>(v) == 0.0f) {
    return InvalidArgument(where, "=", text, " underflows f32 (it would be 0; the smallest is ",
                           std::numeric_limits<float>::denorm_min(), ")");
  }
  return v;
}

StatusOr<bool> ReadBool(const YAML::Node& node, const std::string& where) {
  if (!node.IsScalar()) return ExpectedError(node, where, "true or false");
  const std::string& text = node.Scalar();
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  return ExpectedError(node, where, "true or false");
}

std::string YamlString(const std::string& text, bool always_quote) {
  bool plain = !always_quote && !text.empty() && text[0] != '-' && text != "null" &&
               text != "Null" && text != "NULL";
  for (char ch : text) {
    const bool safe = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                      (ch >= '0' && ch <= '9') || std::string_view("_./+=-").find(ch) !=
                                                      std::string_view::npos;
    plain = plain && safe;
  }
  if (plain) return text;
  std::string out = "\"";
  for (char ch : text) {
    const auto byte = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (byte < 0x20 || byte == 0x7f) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 15];
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

}  // namespace switchyard::config
