// The out directory of checkpoints (internal to engine/checkpoint): the names in it
// (step-XXXXXXXX, the temporary .step-XXXXXXXX.tmp-<pid> of a save, latest) and which step
// directory a path means. StepDirName, RemoveLeftoverTempDirs and LatestCheckpoint
// (checkpoint.h) are implemented beside them, in step_dir.cc.
#pragma once

#include <cstdint>
#include <string>

#include "engine/core/status.h"

namespace switchyard::checkpoint {

// Whether `name` is "step-" followed by digits.
bool IsStepDirName(const std::string& name);

// Whether `name` is a save's temporary directory, ".step-...tmp-...".
bool IsTempDirName(const std::string& name);

// The temporary directory every rank writes into: <out>/.step-XXXXXXXX.tmp-<pid of rank 0>.
std::string TempDirName(const std::string& out_dir, int64_t step, int64_t pid);

// The path a user's checkpoint argument stands for: an out directory's `latest` file (what
// `ls` and shell completion offer) means the out directory; any other path is itself.
std::string CheckpointArgument(const std::string& path);

// The step directory `path` means (itself, or what its latest names), checked complete:
// NotFound, InvalidArgument or FailedPrecondition naming the path and what is missing.
StatusOr<std::string> ResolveStepDir(const std::string& path);

}  // namespace switchyard::checkpoint
