// trainer_state.json of a checkpoint (internal to engine/checkpoint): the trainer's JSON
// object plus the keys the checkpoint owns (format, format_version, switchyard_version,
// step, layout), written by SaveCheckpoint and read back with config.yaml by every reader.
#pragma once

#include <cstdint>
#include <string>

#include "engine/checkpoint/checkpoint.h"
#include "engine/core/status.h"
#include "engine/dist/mesh.h"

namespace switchyard::checkpoint {

// trainer_state.json: the trainer's object plus the keys the checkpoint owns.
// InvalidArgument when trainer_json is not a JSON object, sets a reserved key, or has
// another step than `step`.
StatusOr<std::string> TrainerStateText(const std::string& trainer_json, int64_t step,
                                       const dist::Mesh& mesh);

// trainer_state.json and config.yaml of `dir`; the format version into *version.
// FailedPrecondition when either file is missing or the format is newer than this build,
// DataLoss naming the file and the field when the trainer state is not one, or its layout
// (sizes in [1, 2^17] whose two views make the world) or data position (next_step the step,
// micro_batches_per_step >= 1) is out of range.
StatusOr<LoadedCheckpoint> ReadTrainerState(const std::string& dir, int* version);

}  // namespace switchyard::checkpoint
