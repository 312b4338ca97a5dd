// What the training benchmarks share (tp_comm_perf, zero_perf): a synthetic corpus
// prepared by rank 0 into a temporary directory, and trainer runs with the trainer's
// progress lines kept out of the table.
#pragma once

#include <string>

#include "engine/core/status.h"
#include "engine/dist/communicator.h"
#include "engine/train/trainer.h"

namespace switchyard::bench {

// Prepares a synthetic corpus (random syllable words, vocabulary `vocab`) on rank 0 under a
// fresh temporary directory named by rank 0's pid; returns that directory on every rank
// (its "data" subdirectory holds the shards). Collective over world.
StatusOr<std::string> MakeSyntheticData(dist::Communicator& world, const std::string& tag, int vocab);

// trainer.Run(steps) with stdout sent to /dev/null meanwhile.
Status RunQuietly(train::Trainer& trainer, int64_t steps);

}  // namespace switchyard::bench
