// The prep output folder: whether it may be replaced, the staging folder, and the final
// rename; see prep.h ("replaced whole or not at all").
#include "engine/data/prep_output.h"

#include <unistd.h>

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

}  // namespace

Status Publish(const std::string& staging, const std::string& out, bool force) {
  SY_RETURN_IF_ERROR(CheckOutputDir(out, force));
  return PublishDirectory(staging, out);
}

StatusOr<std::string> CreateStaging(const std::string& out_dir) {
  const std::string staging = StrCat(out_dir, ".tmp-", ::getpid());
  std::error_code ec;
  fs::remove_all(staging, ec);
  if (fs::path parent = fs::absolute(out_dir).parent_path(); !fs::exists(parent, ec)) {
    fs::create_directories(parent, ec);
  }
  if (!fs::create_directory(staging, ec) || ec) {
    return FailedPrecondition(staging, ": cannot create (", ec.message(), ")");
  }
  return staging;
}

std::string NormalizedOutDir(const std::string& out_dir) {
  const fs::path out = fs::path(out_dir).lexically_normal();
  return out.has_filename() ? out.string() : out.parent_path().string();
}

Status CheckOutputDir(const std::string& dir, bool force) {
  std::error_code ec;
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
