// The prep output folder: whether it may be replaced, the staging folder, and the final
// rename; see prep.h ("replaced whole or not at all").
#include "engine/data/prep_output.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <filesystem>
#include <regex>

#include "engine/core/file.h"
#include "engine/data/index.h"
#include "engine/data/prep.h"

namespace switchyard::data {
namespace {

namespace fs = std::filesystem;

// Names prep writes into its folder (and nothing else).
bool IsPrepOutputName(const std::string& name) {
  static const std::regex kShard("(train|val)-[0-9]{5}\\.bin");
  return name == kIndexFile || name == kTokenizerFile || std::regex_match(name, kShard);
}

// The staging folders OUT.tmp-PID of earlier runs killed before they could remove theirs,
// whose process is gone; a live one (another prep writing OUT now) is left alone.
void RemoveStaleStaging(const std::string& out_dir) {
  const fs::path out = fs::absolute(out_dir);
  const std::string prefix = out.filename().string() + ".tmp-";
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(out.parent_path(), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string pid = name.substr(prefix.size());
    if (pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (::kill(static_cast<pid_t>(std::stol(pid)), 0) == 0 || errno != ESRCH) continue;
    std::error_code rm;
    fs::remove_all(entry.path(), rm);
  }
}

}  // namespace

Status Publish(const std::string& staging, const std::string& out, bool force) {
  SY_RETURN_IF_ERROR(CheckOutputDir(out, force));
  return PublishDirectory(staging, out);
}

Status CheckOutputCreatable(const std::string& out_dir) {
  std::error_code ec;
  // The staging folder is a sibling of the output: out's parent (created when missing).
  fs::path dir = fs::absolute(NormalizedOutDir(out_dir), ec).parent_path();
  while (!fs::exists(dir, ec) && dir.has_relative_path()) dir = dir.parent_path();
  struct stat st;
  int err = ::stat(dir.c_str(), &st) != 0 ? errno : !S_ISDIR(st.st_mode) ? ENOTDIR : 0;
  if (err == 0 && ::access(dir.c_str(), W_OK | X_OK) != 0) err = errno;
  if (err == 0) return OkStatus();
  return FailedPrecondition("--out ", out_dir, ": cannot create it (", dir.string(), ": ",
                            std::strerror(err), ")");
}

StatusOr<std::string> CreateStaging(const std::string& out_dir) {
  const std::string staging = StrCat(out_dir, ".tmp-", ::getpid());
  std::error_code ec;
  fs::remove_all(staging, ec);
  RemoveStaleStaging(out_dir);
  if (fs::path parent = fs::absolute(out_dir).parent_path(); !fs::exists(parent, ec)) {
    fs::create_directories(parent, ec);
  }
  if (!fs::create_directory(staging, ec) || ec) {
    return FailedPrecondition("--out ", out_dir, ": cannot create its temporary folder ",
                              staging, " beside it (", ec.message(), ")");
  }
  return staging;
}

std::string NormalizedOutDir(const std::string& out_dir) {
  const fs::path out = fs::path(out_dir).lexically_normal();
  return out.has_filename() ? out.string() : out.parent_path().string();
}

Status CheckOutputDir(const std::string& dir, bool force) {
  std::error_code ec;
  // Publishing renames a folder onto --out: a link there would be replaced by the folder and
  // its target left as it was. Refused up front, before any work.
  if (fs::is_symlink(fs::symlink_status(dir, ec))) {
    return FailedPrecondition("--out ", dir, " is a symbolic link (to ",
                              fs::read_symlink(dir, ec).string(),
                              "); prep replaces its folder whole: give the folder itself");
  }
  if (!fs::exists(dir, ec)) return OkStatus();
  if (!fs::is_directory(dir, ec)) return FailedPrecondition(dir, " exists and is not a folder");
  if (fs::is_empty(dir, ec)) return OkStatus();
  if (!fs::exists(fs::path(dir) / kIndexFile, ec)) {
    return FailedPrecondition(dir, " is not empty and holds no prep output (no ", kIndexFile,
                              "); choose a new or empty folder");
  }
  if (!force) {
    return FailedPrecondition(dir, " already holds a prep output (", kIndexFile,
                              "); pass --force to replace it");
  }
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!IsPrepOutputName(name) || !entry.is_regular_file()) {
      return FailedPrecondition(dir, " holds ", name,
                                ", which prep did not write; not replacing the folder");
    }
  }
  return OkStatus();
}

}  // namespace switchyard::data
