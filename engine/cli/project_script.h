// Running a Python script that ships with the project (scripts/*.py) from a subcommand:
// `switchyard report` hands its work to scripts/report.py. The scripts run with Debian's
// /usr/bin/python3 (its numpy and matplotlib; SWITCHYARD_PYTHON overrides the interpreter)
// and are found in the source tree the binary was built from (SWITCHYARD_SCRIPTS_DIR
// overrides it).
#pragma once

#include <string>
#include <vector>

#include "engine/core/status.h"

namespace switchyard::cli {

// The path of scripts/<name>; an error naming the path when it is missing.
StatusOr<std::string> ProjectScript(const std::string& name);

// Runs `python3 script args...` with this process's stdout and stderr, waits for it and
// returns its exit status (an error when it cannot start or dies by a signal).
StatusOr<int> RunPython(const std::string& script, const std::vector<std::string>& args);

}  // namespace switchyard::cli
