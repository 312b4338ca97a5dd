// Status and StatusOr for everything a user can cause (configs, files, data, checkpoints,
// launch layouts). Invariants use SY_CHECK (check.h) instead.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include <cstdio>
#include <sstream>
#include <string>
#include <string_view>

namespace switchyard {

using Status = absl::Status;
template <typename T>
using StatusOr = absl::StatusOr<T>;

inline Status OkStatus() { return absl::OkStatus(); }

// Concatenates anything with an operator<< ("tp=", 4, name). Debian's abseil is built
// with its own string_view, so absl::StrCat rejects std::string_view; use this instead.
template <typename... Args>
std::string StrCat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

// Builders that read like the message they produce: InvalidArgument("tp=", tp, " ...").
template <typename... Args>
Status InvalidArgument(const Args&... args) {
  return absl::InvalidArgumentError(StrCat(args...));
}
template <typename... Args>
Status NotFound(const Args&... args) {
  return absl::NotFoundError(StrCat(args...));
}
template <typename... Args>
Status FailedPrecondition(const Args&... args) {
  return absl::FailedPreconditionError(StrCat(args...));
}
template <typename... Args>
Status DataLoss(const Args&... args) {
  return absl::DataLossError(StrCat(args...));
}
template <typename... Args>
Status Internal(const Args&... args) {
  return absl::InternalError(StrCat(args...));
}
template <typename... Args>
Status Unimplemented(const Args&... args) {
  return absl::UnimplementedError(StrCat(args...));
}

// `text` with every byte a terminal would act on or cannot show written as an escape: control
// characters as \n, \r, \t or \xNN (NUL is \x00), DEL and bytes that are not part of
// valid UTF-8 as \xNN. Valid UTF-8 (a path or value with accents) stays as it is. For
// messages that echo a file's bytes ("YAML syntax error: unknown escape character: \x00").
inline std::string PrintableText(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  auto escape = [&out](unsigned char c) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "\\x%02x", c);
    out += buf;
  };
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    if (c == '\n' || c == '\r' || c == '\t') {
      out += c == '\n' ? "\\n" : c == '\r' ? "\\r" : "\\t";
      ++i;
      continue;
    }
    // A UTF-8 sequence: a lead byte C2..F4 and its 1-3 continuation bytes 80..BF.
    const size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
                     : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    bool valid = n > 0 && i + n <= text.size();
    for (size_t k = 1; valid && k < n; ++k) {
      valid = (static_cast<unsigned char>(text[i + k]) & 0xc0) == 0x80;
    }
    if (valid) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      escape(c);
      ++i;
    }
  }
  return out;
}

}  // namespace switchyard

#define SY_STATUS_CONCAT_INNER(a, b) a##b
#define SY_STATUS_CONCAT(a, b) SY_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` yields a non-OK Status.
#define SY_RETURN_IF_ERROR(expr)                     \
  do {                                               \
    ::absl::Status sy_status_ = (expr);              \
    if (!sy_status_.ok()) return sy_status_;         \
  } while (0)

// SY_ASSIGN_OR_RETURN(auto x, MakeX()); declares x from a StatusOr or returns its error.
#define SY_ASSIGN_OR_RETURN(lhs, expr) \
  SY_ASSIGN_OR_RETURN_IMPL(SY_STATUS_CONCAT(sy_statusor_, __LINE__), lhs, expr)
#define SY_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
