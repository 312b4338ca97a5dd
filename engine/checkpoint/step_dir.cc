// The out directory of checkpoints: step directory names, latest, and the leftovers of
// killed saves; see step_dir.h and checkpoint.h.
#include "engine/checkpoint/step_dir.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <vector>

#include "engine/checkpoint/checkpoint.h"
#include "engine/core/file.h"

namespace switchyard::checkpoint {
namespace {

namespace fs = std::filesystem;

// The last component of a path, ignoring a trailing '/'.
std::string BaseName(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

// What a valid latest holds, for its errors.
constexpr char kLatestHolds[] =
    "expected one line naming the step directory saved last, like step-00000100";

// The step directory name in <out_dir>/latest. Its bytes are echoed escaped and cut to 80
// (a latest overwritten with a page of HTML is one short error line).
StatusOr<std::string> ReadLatestName(const std::string& out_dir) {
  const std::string path = (fs::path(out_dir) / kLatestFile).string();
  StatusOr<std::string> read = ReadFile(path, 4096);
  if (read.status().code() == absl::StatusCode::kOutOfRange) {
    return DataLoss(read.status().message(), "; ", kLatestHolds);
  }
  SY_ASSIGN_OR_RETURN(std::string text, std::move(read));
  const size_t end = text.find_last_not_of(" \t\r\n");
  text = end == std::string::npos ? "" : text.substr(0, end + 1);
  if (!IsStepDirName(text)) {
    const std::string shown = PrintableText(text.substr(0, 80));
    return DataLoss(path, ": ", kLatestHolds, ", got ",
                    text.empty() ? std::string("nothing") : "'" + shown + "'",
                    text.size() > 80 ? StrCat("... (", text.size(), " bytes)") : std::string());
  }
  return text;
}

}  // namespace

bool IsStepDirName(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0) return false;
  return std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool IsTempDirName(const std::string& name) {
  return name.compare(0, 6, ".step-") == 0 && name.find(".tmp-") != std::string::npos;
}

std::string TempDirName(const std::string& out_dir, int64_t step, int64_t pid) {
  return (fs::path(out_dir) / StrCat(".", StepDirName(step), ".tmp-", pid)).string();
}

std::string CheckpointArgument(const std::string& path) {
  std::error_code ec;
  if (BaseName(path) != kLatestFile || !fs::is_regular_file(path, ec)) return path;
  const std::string parent = fs::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

StatusOr<std::string> ResolveStepDir(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    return NotFound(path, ": no such checkpoint (the path does not exist)");
  if (CheckpointArgument(path) != path) return ResolveStepDir(CheckpointArgument(path));
  if (!fs::is_directory(path, ec)) return InvalidArgument(path, ": not a checkpoint directory");
  const std::string base = BaseName(path);
  if (IsTempDirName(base)) {
    return FailedPrecondition(path,
                              ": incomplete checkpoint (the temporary directory of a save "
                              "that did not finish)");
  }
  auto has = [&](const std::string& dir, const char* file) {
    return fs::exists(fs::path(dir) / file, ec);
  };
  std::string dir = path;
  if (!has(dir, kModelIndexFile) && has(dir, kLatestFile)) {
    SY_ASSIGN_OR_RETURN(std::string name, ReadLatestName(path));
    dir = (fs::path(path) / name).string();
    if (!fs::is_directory(dir, ec)) {
      return NotFound(path, "/", kLatestFile, " names ", name, fs::exists(dir, ec)
                          ? ", which is not a directory" : ", which does not exist");
    }
  }
  if (has(dir, kModelIndexFile)) return dir;
  bool has_tensors = false;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    has_tensors = has_tensors || e.path().extension() == ".safetensors";
  }
  if (IsStepDirName(BaseName(dir)) || has_tensors || has(dir, kTrainerStateFile)) {
    return FailedPrecondition(dir, ": incomplete checkpoint (no ", kModelIndexFile, ")");
  }
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    if (IsStepDirName(e.path().filename().string())) steps.push_back(e.path().filename().string());
  }
  std::sort(steps.begin(), steps.end());
  if (steps.empty()) return NotFound(path, ": no checkpoint here (no ", kLatestFile, " file)");
  return NotFound(path, ": no ", kLatestFile, " file (step directories: ", steps.front(),
                  steps.size() > 1 ? " ... " + steps.back() : std::string(), "); pass one of them");
}

std::string StepDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return buf;
}

Status RemoveLeftoverTempDirs(const std::string& out_dir, std::vector<std::string>* removed) {
  std::error_code ec;
  if (!fs::is_directory(out_dir, ec)) return OkStatus();
  std::vector<fs::path> leftovers;
  for (const auto& e : fs::directory_iterator(out_dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool old = name.compare(0, 6, ".step-") == 0 && name.find(".old-") != std::string::npos;
    if (e.is_directory(ec) && (IsTempDirName(name) || old)) leftovers.push_back(e.path());
    // WriteFileAtomically's temporary of `latest` (latest.tmp.<pid>), left by a kill mid-write.
    const std::string latest_tmp = std::string(kLatestFile) + ".tmp.";
    if (e.is_regular_file(ec) && name.compare(0, latest_tmp.size(), latest_tmp) == 0) {
      leftovers.push_back(e.path());
    }
  }
  std::sort(leftovers.begin(), leftovers.end());
  for (const fs::path& p : leftovers) {
    fs::remove_all(p, ec);
    if (ec) return FailedPrecondition(p.string(), ": cannot remove a leftover of a killed save (", ec.message(), ")");
    removed->push_back(p.string());
  }
  return OkStatus();
}

StatusOr<std::optional<std::string>> LatestCheckpoint(const std::string& out_dir) {
  std::error_code ec;
  if (!fs::exists(fs::path(out_dir) / kLatestFile, ec)) return std::optional<std::string>();
  SY_ASSIGN_OR_RETURN(std::string name, ReadLatestName(out_dir));
  return std::optional<std::string>((fs::path(out_dir) / name).string());
}

}  // namespace switchyard::checkpoint
