// Status and StatusOr for everything a user can cause (configs, files, data, checkpoints,
// launch layouts). Invariants use SY_CHECK (check.h) instead.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include <sstream>
#include <string>

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
