// Reading one YAML scalar into a config field (internal to engine/config: config.cc's key
// tables bind every number through these). One rule for every key of a type:
//   integers: plain decimal only ("010" and "0x2", which YAML 1.1 reads as octal and hex, are
//     refused), within the range of the field's type (an int field refuses 2^31, an unsigned
//     one -1);
//   numbers: finite (".inf" and ".nan" are refused: a checkpoint's config.yaml could not be
//     read back), and for f32 fields inside f32's range (1e300 overflows; 1e-50 would read
//     as 0: refused as an underflow, while subnormals such as a resolved train.min_lr of
//     1.2e-39 are kept, so that every value ToYaml writes reads back);
//   an empty value (`key:`, `key: null`, `--set key=`) is "the value is empty".
// Each error is one line naming the key (`where`, "moe.top_k") and the text as typed.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include <yaml-cpp/yaml.h>

#include "engine/core/status.h"

namespace switchyard::config {

// The node as messages quote it: its scalar text, "[...]" or "{...}", "" when empty.
std::string ScalarText(const YAML::Node& node);

// "moe.top_k: expected an integer, got 'two'", or "moe.top_k: the value is empty (expected an
// integer)" for a null node. `kind` is "an integer", "a number", ...
Status ExpectedError(const YAML::Node& node, const std::string& where, const char* kind);

// Reads a plain decimal integer (optional sign) in [lo, hi].
StatusOr<int64_t> ReadInt64(const YAML::Node& node, const std::string& where, int64_t lo,
                            int64_t hi);
StatusOr<uint64_t> ReadUint64(const YAML::Node& node, const std::string& where);
// Reads a finite number; with `f32`, one that f32 holds (not above its largest, and not
// rounding to 0 unless it is 0).
StatusOr<double> ReadFiniteNumber(const YAML::Node& node, const std::string& where, bool f32);

// Reads true or false (also True, TRUE, False, FALSE: YAML 1.2's core schema). YAML 1.1's
// y, n, yes, no, on and off are refused: readers disagree on them, as on 010.
StatusOr<bool> ReadBool(const YAML::Node& node, const std::string& where);

// A string as a YAML value that reads back as the same string: plain when that is safe
// (letters, digits and _ . / + = - , not starting with -), otherwise double-quoted with the
// quote, the backslash and control bytes escaped. `always_quote` quotes every string.
std::string YamlString(const std::string& text, bool always_quote = false);

// The integer and floating-point fields of the key tables.
template <typename T>
Status ReadScalar(const YAML::Node& node, const std::string& where, T* out) {
  if constexpr (std::is_same_v<T, uint64_t>) {
    SY_ASSIGN_OR_RETURN(*out, ReadUint64(node, where));
  } else if constexpr (std::is_integral_v<T>) {
    SY_ASSIGN_OR_RETURN(const int64_t v, ReadInt64(node, where, std::numeric_limits<T>::min(),
                                                   std::numeric_limits<T>::max()));
    *out = static_cast<T>(v);
  } else {
    SY_ASSIGN_OR_RETURN(const double v, ReadFiniteNumber(node, where, std::is_same_v<T, float>));
    *out = static_cast<T>(v);
  }
  return OkStatus();
}

}  // namespace switchyard::config
