// Reading whole files: the one reader every config, index and state file goes through.
#pragma once

#include <string>

#include "engine/core/status.h"

namespace switchyard {

// The bytes of `path`. NotFound (naming the path and the system's reason) when it cannot be
// opened, InvalidArgument when it is a directory, DataLoss when the read fails part way.
StatusOr<std::string> ReadFile(const std::string& path);

}  // namespace switchyard
