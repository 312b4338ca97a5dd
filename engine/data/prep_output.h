// The prep output folder (internal to prep): a staging folder beside it, and the rename
// that replaces the output whole. CheckOutputDir (prep.h) says whether it may be replaced.
#pragma once

#include <string>

#include "engine/core/status.h"

namespace switchyard::data {

// `out_dir` without a trailing "/" or "." parts.
std::string NormalizedOutDir(const std::string& out_dir);

// OK when the folder `out_dir` (as given to --out) can be created: its closest existing
// ancestor is a folder this process may write. Else FailedPrecondition naming --out and
// the reason ("--out afile/sub: cannot create it (afile: Not a directory)"), so that a
// run says so before reading the corpus, and never names its temporary folder.
Status CheckOutputCreatable(const std::string& out_dir);

// Creates the empty folder "<out_dir>.tmp-<pid>" (and out_dir's parent) and returns it;
// an error names --out.
StatusOr<std::string> CreateStaging(const std::string& out_dir);

// Moves the finished `staging` folder to `out`, replacing a previous prep output (checked
// again with CheckOutputDir) atomically and durably (PublishDirectory in engine/core/file.h).
Status Publish(const std::string& staging, const std::string& out, bool force);

}  // namespace switchyard::data
