// Logging with the rank in every line: "[I r0 tensor.cc:42] message".
//
//   SY_LOG(INFO) << "step " << step;
//   SY_LOG(WARNING) << ...;   SY_LOG(ERROR) << ...;
//
// The rank is process state set once by the launcher (dist::InitProcess) so that every
// message, CHECK failure and library error names the rank that printed it.
#pragma once

#include <sstream>

namespace switchyard {

enum class LogSeverity { kInfo, kWarning, kError, kFatal };

// The rank printed in log prefixes; -1 (the default) prints no rank.
void SetLogRank(int rank);
int LogRank();

// Messages below this severity are dropped (default kInfo). SWITCHYARD_LOG=warning|error
// in the environment sets it at start-up.
void SetMinLogSeverity(LogSeverity severity);

namespace internal {

// One log line; emitted (and, for kFatal, the process aborted) in the destructor.
class LogMessage {
 public:
  LogMessage(LogSeverity severity, const char* file, int line);
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogSeverity severity_;
  std::ostringstream stream_;
};

// Lets `cond ? (void)0 : Voidify() & stream` type-check in the CHECK macros.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace internal
}  // namespace switchyard

#define SY_LOG_SEVERITY_INFO ::switchyard::LogSeverity::kInfo
#define SY_LOG_SEVERITY_WARNING ::switchyard::LogSeverity::kWarning
#define SY_LOG_SEVERITY_ERROR ::switchyard::LogSeverity::kError
#define SY_LOG_SEVERITY_FATAL ::switchyard::LogSeverity::kFatal

#define SY_LOG(severity) \
  ::switchyard::internal::LogMessage(SY_LOG_SEVERITY_##severity, __FILE__, __LINE__).stream()
