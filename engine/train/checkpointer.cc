#include "engine/train/checkpointer.h"

#include <cstdio>
#include <filesystem>
#include <vector>

#include "engine/checkpoint/checkpoint.h"

namespace switchyard::train {

Status Checkpointer::Prepare(bool is_root) {
  if (!is_root) return OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(out_dir_, ec);
  // Exit 1 as every output that cannot be created (docs/failures.md), as CheckOutputFile's.
  if (ec) return NotFound(out_dir_, ": cannot create the output directory (", ec.message(), ")");
  // Before the leftovers go: a temporary directory another live run is filling is not one.
  SY_ASSIGN_OR_RETURN(lock_, DirectoryLock::Acquire(out_dir_));
  std::vector<std::string> removed;
  SY_RETURN_IF_ERROR(checkpoint::RemoveLeftoverTempDirs(out_dir_, &removed));
  for (const std::string& path : removed) {
    std::printf("removed %s: the temporary directory of a save that did not finish\n", path.c_str());
  }
  return OkStatus();
}

bool Checkpointer::ShouldSave(int64_t steps_done, bool last_step, bool stopped) const {
  const bool periodic = every_ > 0 && steps_done % every_ == 0;
  return stopped || periodic || last_step;
}

std::string Checkpointer::Latest() const {
  auto latest = checkpoint::LatestCheckpoint(out_dir_);
  return latest.ok() && latest->has_value() ? StrCat("the latest checkpoint stays ", **latest)
                                            : std::string(kNoCheckpointYet);
}

}  // namespace switchyard::train
