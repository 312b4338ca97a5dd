// Closed sets of names bound to enum values, one table per enum: a config key's choices
// (runtime.precision, train.on_nonfinite, parallel.pipeline_schedule, ...). Parsing, the error
// that lists the allowed names, and printing all read the same table, so each name is
// spelled in exactly one place.
//
//   inline constexpr EnumName<Precision> kPrecisionNames[] = {
//       {Precision::kAuto, "auto"}, {Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"}};
//   FindByName(kPrecisionNames, "fp32")        -> Precision::kFp32
//   NameOf(kPrecisionNames, Precision::kBf16)  -> "bf16"
//   JoinNames(kPrecisionNames)                 -> "auto, fp32, bf16"
//   ParseByName(kPrecisionNames, "fp16", "runtime.precision")
//       -> InvalidArgument "runtime.precision='fp16' is not one of auto, fp32, bf16"
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "engine/core/check.h"
#include "engine/core/status.h"

namespace switchyard {

// One row of a name table: the value and the one name it is written as.
template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// The value named `name` (exact, case-sensitive), or nullopt.
template <typename E, size_t N>
std::optional<E> FindByName(const EnumName<E> (&table)[N], std::string_view name) {
  for (const EnumName<E>& row : table) {
    if (name == row.name) return row.value;
  }
  return std::nullopt;
}

// The name of `value`; a value missing from its table is a bug.
template <typename E, size_t N>
const char* NameOf(const EnumName<E> (&table)[N], E value) {
  for (const EnumName<E>& row : table) {
    if (row.value == value) return row.name;
  }
  SY_CHECK(false) << "enum value " << static_cast<long long>(value) << " has no name";
  return "?";
}

// The names in table order: "a, b, c"; `last` joins the last two ("a, b or c").
template <typename E, size_t N>
std::string JoinNames(const EnumName<E> (&table)[N], std::string_view last = ", ") {
  std::string out;
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) out += i + 1 == N ? last : std::string_view(", ");
    out += table[i].name;
  }
  return out;
}

// The value named `name`, or the config error naming the key, the value and every allowed
// name: "train.on_nonfinite='halt' is not one of stop, skip".
template <typename E, size_t N>
StatusOr<E> ParseByName(const EnumName<E> (&table)[N], std::string_view name,
                        std::string_view key) {
  if (std::optional<E> value = FindByName(table, name)) return *value;
  return InvalidArgument(key, "='", name, "' is not one of ", JoinNames(table));
}

}  // namespace switchyard
