// Agreement over a host communicator: every rank's string, and one Status for all ranks, so
// that every rank takes the same path after a step that may fail on some of them.
#pragma once

#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/dist/communicator.h"

namespace switchyard::dist {

// Every rank's `mine`, in rank order. Collective over world (a host communicator).
std::vector<std::string> AllGatherStrings(const std::string& mine, Communicator& world);

// The Status of the lowest failing rank, on every rank (OK when all are OK), so that every
// rank takes the same path afterwards. Collective.
Status AgreeOnStatus(const Status& local, Communicator& world);

}  // namespace switchyard::dist
