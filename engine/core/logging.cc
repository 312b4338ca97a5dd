#include "engine/core/logging.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace switchyard {
namespace {

std::atomic<int> g_log_rank{-1};

LogSeverity SeverityFromEnv() {
  const char* env = std::getenv("SWITCHYARD_LOG");
  if (env == nullptr) return LogSeverity::kInfo;
  std::string v(env);
  if (v == "warning") return LogSeverity::kWarning;
  if (v == "error") return LogSeverity::kError;
  return LogSeverity::kInfo;
}

std::atomic<int> g_min_severity{static_cast<int>(SeverityFromEnv())};

const char* Basename(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

}  // namespace

void SetLogRank(int rank) { g_log_rank.store(rank); }
int LogRank() { return g_log_rank.load(); }
void SetMinLogSeverity(LogSeverity severity) {
  g_min_severity.store(static_cast<int>(severity));
}

namespace internal {

LogMessage::LogMessage(LogSeverity severity, const char* file, int line)
    : severity_(severity) {
  static const char kLetters[] = {'I', 'W', 'E', 'F'};
  stream_ << '[' << kLetters[static_cast<int>(severity)];
  if (int rank = LogRank(); rank >= 0) stream_ << " r" << rank;
  stream_ << ' ' << Basename(file) << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  if (static_cast<int>(severity_) >= g_min_severity.load() ||
      severity_ == LogSeverity::kFatal) {
    stream_ << '\n';
    std::string text = stream_.str();
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
  }
  if (severity_ == LogSeverity::kFatal) std::abort();
}

}  // namespace internal
}  // namespace switchyard
