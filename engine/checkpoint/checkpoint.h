// Checkpoints that any layout can load (docs/checkpoints.md). One directory per step,
//
//   <out>/step-00000100/
//     model-00000-of-00004.safetensors     rank 0's pieces of model tensors (one file per
//     ...                                  rank that owns any; "model.safetensors" when
//     model-00003-of-00004.safetensors     the world is one rank)
//     optimizer-00000-of-00004.safetensors rank 0's pieces of optimizer state, likewise
//     ...
//     model.safetensors.index.json         every tensor (model and optimizer), its pieces
//                                          and their files; Hugging Face's weight_map and
//                                          total_size for the model
//     trainer_state.json                   step, layout, versions + what the trainer passes
//     config.yaml                          the resolved config
//   <out>/latest                           "step-00000100": the last step saved
//
// A piece is a box of a logical tensor (a parameter description's offset and size) and an
// element range of that box's row-major flattening (a ZeRO shard; the whole box
// otherwise). Saving: every rank writes its own pieces into <out>/.step-00000100.tmp-<pid
// of rank 0>/, in parallel (identical pieces of replicas once, by the lowest rank; no tensor
// travels between ranks); once every rank has succeeded, rank 0 writes the index, the
// trainer state and the config, renames the directory into place (the parent fsync'ed) and
// replaces `latest`. Loading: every rank reads, from whichever files hold them, just the
// byte ranges of the pieces that overlap what it holds, so any mesh (tp, ep, pp, ZeRO, ...)
// loads what any other saved.
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
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/dist/communicator.h"
#include "engine/dist/mesh.h"
#include "engine/parallel/parameter.h"

namespace switchyard::checkpoint {

// The on-disk format this code writes; a loader refuses a newer one and reads format 1 (one
// model.safetensors of whole tensors, optimizer.safetensors beside it).
inline constexpr int kCheckpointFormatVersion = 2;
// The "format" value of format 2's index metadata and of trainer_state.json.
inline constexpr const char* kCheckpointFormat = "switchyard-checkpoint";

// The files of a step directory. kModelFile and kOptimizerFile are the tensor files of a
// one-rank world (and of format 1); R ranks write "model-RRRRR-of-WWWWW.safetensors" and
// "optimizer-RRRRR-of-WWWWW.safetensors" (the index names them).
inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kModelIndexFile = "model.safetensors.index.json";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kTrainerStateFile = "trainer_state.json";
inline constexpr const char* kConfigFile = "config.yaml";
inline constexpr const char* kLatestFile = "latest";

// What one rank contributes to a checkpoint. Every rank passes its own registry and its
// own optimizer state (its boxes, or element ranges of them); trainer_state_json and
// config_yaml are taken from world rank 0. An entry offers [flat_begin, FlatEnd()) of its
// box: all of value when flat_value, else that range of the whole-box value (the whole
// box by default; ZeRO sets owned ranges so that replicas split the writing).
struct CheckpointContents {
  const parallel::ParameterRegistry* params = nullptr;  // required
  // Optimizer state as parameters ("optimizer.exp_avg.<param>", sharded like <param>; 0-d
  // scalars such as "optimizer.step"), names distinct from the parameters'; saved to the
  // optimizer-*.safetensors files. May be empty.
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
  // Whether the index held checksums and every file matched them (false: a checkpoint
  // saved before checksums, loaded unverified).
  bool verified = false;
};

// What VerifyCheckpoint checked.
struct CheckpointReport {
  std::string dir;  // the step directory
  int64_t step = 0;
  bool checksums = false;  // false: saved before checksums; structure and values only
  int64_t files = 0, tensors = 0;
  uint64_t bytes = 0;  // of the files with checksums
};

// "step-00000100".
std::string StepDirName(int64_t step);

// Saves step `step` under world rank 0's out_dir (created if needed; the other ranks'
// out_dir is not used, but every rank must see rank 0's: a shared filesystem). Collective
// over `world`, whose ranks are `mesh`'s ranks: every rank passes its contents and writes
// its own pieces. Returns the same Status on every rank. Errors
// (nothing on disk changes except, at worst, a leftover .step-*.tmp-<pid> directory of a
// killed save): ranks that disagree on a tensor's kind, global shape or dtype, pieces that
// overlap without being equal or leave a gap, trainer_state_json that is not a JSON
// object, and any filesystem failure on any rank. An existing step directory of the same
// step is replaced atomically (exchanged with the new one, then removed).
Status SaveCheckpoint(const std::string& out_dir, int64_t step, const CheckpointContents& contents,
                      dist::Communicator& world, const dist::Mesh& mesh);

// Loads a checkpoint into whatever layout the registries describe: `path` is a step
// directory, or an out directory (its `latest` is loaded). Every rank reads what each of
// its entries needs (its whole box, or [flat_begin, FlatEnd()) of it when flat_value) from
// the pieces that overlap it, and only those bytes; optimizer_state (null: the optimizer is
// not loaded) likewise. Collective over `world`; returns the same Status on every rank and
// changes no value unless it succeeds. Errors: a missing path; an out directory without
// `latest`; an incomplete checkpoint (a .tmp directory, no index, a missing file); a
// truncated or corrupt file or index (pieces that do not tile their tensor included); a
// tensor missing for a registered parameter, or one that no rank registered; a shape or
// dtype mismatch; a format newer than this build; a file whose size or CRC-32 differs from
// the index's (each file read by one rank; checkpoints saved before checksums load
// unverified, LoadedCheckpoint::verified false); a trainer state whose step is not its
// directory's; with require_finite (training and eval pass it), a NaN or Inf in any
// floating-point value read.
StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& path, parallel::ParameterRegistry& params,
                                          std::vector<parallel::Parameter>* optimizer_state,
                                          dist::Communicator& world, bool require_finite = false);

// Checks a checkpoint without a model (`switchyard checkpoint verify`): `path` as
// LoadCheckpoint takes it; the trainer state against its directory's step, the index, the
// CRC-32 of every file the index lists, every tensor's pieces tiling it, and every value
// finite. Errors are LoadCheckpoint's, each naming the file.
StatusOr<CheckpointReport> VerifyCheckpoint(const std::string& path);

// Removes the leftovers of killed saves in out_dir: .step-*.tmp-* and .step-*.old-*
// directories and latest.tmp.* files (the temporary of `latest`; a save in progress in the
// same out_dir at the same moment would lose them: one run per out_dir). Appends each
// removed path to *removed.
Status RemoveLeftoverTempDirs(const std::string& out_dir, std::vector<std::string>* removed);

// Every tensor of a checkpoint of one kind (the model's, or with `optimizer` the optimizer
// state's), assembled whole in this process's host memory, by name: for tools and tests
// that compare checkpoints; training loads with LoadCheckpoint. `path` as LoadCheckpoint
// takes it; the errors are LoadCheckpoint's.
StatusOr<std::map<std::string, Tensor>> ReadWholeTensors(const std::string& path, bool optimizer);

// The step directory `<out_dir>/latest` names, or nullopt when out_dir has no `latest`
// (nothing saved yet). An error when `latest` cannot be read or names no step directory.
StatusOr<std::optional<std::string>> LatestCheckpoint(const std::string& out_dir);

}  // namespace switchyard::checkpoint
