// Checkpoints that any layout can load (docs/checkpoints.md). One directory per step,
//
//   <out>/step-00000100/
//     model.safetensors               whole logical tensors under their registry names
//     model.safetensors.index.json    {"metadata": {"total_size": N}, "weight_map": {...}}
//     optimizer.safetensors           optimizer state, also whole tensors (+ scalars)
//     trainer_state.json              step, layout, versions + what the trainer passes
//     config.yaml                     the resolved config
//   <out>/latest                      "step-00000100": the last step saved
//
// written atomically: into <out>/.step-00000100.tmp-<pid>/ (every file fsync'ed), renamed
// into place (the parent fsync'ed), then `latest` replaced. Saving gathers every tensor
// whole on world rank 0 from whichever ranks hold its slices, so any mesh (tp, ep, pp, ...)
// can save, and loading copies each rank's slice out of the whole tensor, so any other mesh
// can load.
//
//   SY_RETURN_IF_ERROR(SaveCheckpoint(out, step, {.params = &registry,
//                                                 .optimizer_state = adam.State(),
//                                                 .trainer_state_json = state,
//                                                 .config_yaml = config.ToYaml()},
//                                     *world, pc.mesh()));
//   SY_ASSIGN_OR_RETURN(LoadedCheckpoint ckpt,
//                       LoadCheckpoint(out, registry, &adam_state, *world));
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/dist/communicator.h"
#include "engine/dist/mesh.h"
#include "engine/parallel/parameter.h"

namespace switchyard::train {

// The on-disk format this code writes; a loader refuses a newer one.
inline constexpr int kCheckpointFormatVersion = 1;

// The files of a step directory.
inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kModelIndexFile = "model.safetensors.index.json";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kTrainerStateFile = "trainer_state.json";
inline constexpr const char* kConfigFile = "config.yaml";
inline constexpr const char* kLatestFile = "latest";

// What one rank contributes to a checkpoint. Every rank passes its own registry and its
// own optimizer state (its slices); trainer_state_json and config_yaml are taken from world
// rank 0.
struct CheckpointContents {
  const parallel::ParameterRegistry* params = nullptr;  // required
  // Optimizer state as parameters ("optimizer.exp_avg.<param>", sharded like <param>; 0-d
  // scalars such as "optimizer.step"); saved to optimizer.safetensors. May be empty.
  std::vector<parallel::Parameter> optimizer_state;
  // A JSON object (tokens seen, data position, RNG state, last loss, ...); "" means {}.
  // The saver adds "format", "format_version", "switchyard_version", "step" and "layout";
  // the object must not hold those keys (except "step" with this step's value).
  std::string trainer_state_json;
  std::string config_yaml;  // the resolved config (Config::ToYaml())
};

// The mesh a checkpoint was saved with (trainer_state.json "layout").
struct SavedLayout {
  int world = 1, tp = 1, cp = 1, ep = 1, etp = 1, pp = 1, dp = 1, edp = 1;
  std::string order;
};

struct LoadedCheckpoint {
  std::string dir;  // the step directory that was loaded
  int64_t step = 0;
  std::string trainer_state_json;  // the whole trainer_state.json
  std::string config_yaml;         // config.yaml as saved
  SavedLayout layout;
};

// "step-00000100".
std::string StepDirName(int64_t step);

// Saves step `step` under out_dir (created if needed). Collective over `world`, whose ranks
// are `mesh`'s ranks: every rank passes its contents; world rank 0 gathers whole tensors
// and writes. Returns the same Status on every rank. Errors (nothing on disk changes
// except, at worst, a leftover .step-*.tmp-<pid> directory): ranks that disagree on a
// tensor's global shape or dtype, slices that do not cover a tensor, trainer_state_json
// that is not a JSON object, and any filesystem failure. An existing step directory of the
// same step is replaced atomically (exchanged with the new one, then removed).
Status SaveCheckpoint(const std::string& out_dir, int64_t step, const CheckpointContents& contents,
                      dist::Communicator& world, const dist::Mesh& mesh);

// Loads a checkpoint into whatever layout the registries describe: `path` is a step
// directory, or an out directory (its `latest` is loaded). Every rank reads the files and
// copies its box (the description's offset and size) of each tensor into value; optimizer_state
// (null: the optimizer is not loaded) likewise from optimizer.safetensors. Collective over
// `world`; returns the same Status on every rank and changes no value unless it succeeds.
// Errors: a missing path; an out directory without `latest`; an incomplete checkpoint (a
// .tmp directory, no index, a missing file); a truncated or corrupt file; a tensor missing
// for a registered parameter, or one that no rank registered; a shape or dtype mismatch;
// a format newer than this build.
StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& path, parallel::ParameterRegistry& params,
                                          std::vector<parallel::Parameter>* optimizer_state,
                                          dist::Communicator& world);

// The step directory `<out_dir>/latest` names, or nullopt when out_dir has no `latest`
// (nothing saved yet). An error when `latest` cannot be read or names no step directory.
StatusOr<std::optional<std::string>> LatestCheckpoint(const std::string& out_dir);

}  // namespace switchyard::train
