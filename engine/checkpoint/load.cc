// Loading, reading and verifying a checkpoint (LoadCheckpoint, ReadWholeTensors,
// VerifyCheckpoint; checkpoint.h): the step directory resolved, its trainer state, index
// and checksums checked, then only the byte ranges each rank needs read.
#include "engine/checkpoint/checkpoint.h"

#include <filesystem>
#include <map>
#include <set>
#include <utility>

#include "engine/checkpoint/index.h"
#include "engine/checkpoint/save_plan.h"
#include "engine/checkpoint/step_dir.h"
#include "engine/checkpoint/trainer_state.h"
#include "engine/checkpoint/verify.h"
#include "engine/core/check.h"
#include "engine/core/file.h"
#include "engine/dist/agreement.h"

namespace switchyard::checkpoint {
namespace {

namespace fs = std::filesystem;

// The index of `dir` (format 1 completed from its files).
StatusOr<CheckpointIndex> ReadIndex(const std::string& dir, int version, bool with_optimizer) {
  const std::string path = (fs::path(dir) / kModelIndexFile).string();
  SY_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  SY_ASSIGN_OR_RETURN(CheckpointIndex index, ParseIndex(text, path, version));
  if (version < 2) return Format1Index(std::move(index), dir, with_optimizer);
  return index;
}

// Every entry of this rank has a tensor of its kind, global shape and dtype.
Status CheckOwn(const CheckpointIndex& index, const std::vector<parallel::Parameter>& params,
                int file, const std::string& path) {
  for (const parallel::Parameter& p : params) {
    auto it = index.tensors.find(p.name);
    if (it == index.tensors.end() || it->second.file != file) {
      return NotFound(path, ": no tensor '", p.name, "' for the registered ",
                      file == kModelTensors ? "parameter " : "optimizer state ",
                      DTypeName(p.value.dtype()), " ", ShapeString(p.global_shape));
    }
    if (it->second.dtype != p.value.dtype() || it->second.global != p.global_shape) {
      return InvalidArgument(path, ": tensor '", p.name, "': the model has ",
                             DTypeName(p.value.dtype()), " ", ShapeString(p.global_shape),
                             ", the checkpoint ", DTypeName(it->second.dtype), " ",
                             ShapeString(it->second.global));
    }
  }
  return OkStatus();
}

// Every tensor of the checkpoint (of the kinds being loaded) belongs to some rank's entry.
Status CheckKnown(const CheckpointIndex& index, const std::set<std::string> registered[2],
                  bool with_optimizer, const std::string& path) {
  for (const auto& [name, t] : index.tensors) {
    if (t.file == kOptimizerTensors && !with_optimizer) continue;
    if (!registered[t.file].count(name)) {
      return InvalidArgument(path, ": holds '", name, "' ", DTypeName(t.dtype), " ",
                             ShapeString(t.global), ", which no rank registered");
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& path, parallel::ParameterRegistry& params,
                                          std::vector<parallel::Parameter>* optimizer_state,
                                          dist::Communicator& world, bool require_finite) {
  SY_CHECK(world.device().is_cpu())
      << "LoadCheckpoint agrees over a host communicator, not " << world.ToString();
  const std::vector<parallel::Parameter> none;
  const std::vector<parallel::Parameter>& optimizer = optimizer_state ? *optimizer_state : none;
  const bool with_optimizer = optimizer_state != nullptr;
  StatusOr<std::vector<SliceEntry>> mine = LocalSlices(params.params(), optimizer, SliceUse::kLoad);
  // What every rank registers (with pp, each rank registers only its stage's tensors).
  const std::vector<std::string> gathered =
      dist::AllGatherStrings(mine.ok() ? SerializeSlices(*mine) : std::string(), world);

  // Everything is read into temporaries (staged[i] for entry i of `mine`) and checked first.
  std::vector<Tensor> staged;
  StatusOr<LoadedCheckpoint> loaded = [&]() -> StatusOr<LoadedCheckpoint> {
    SY_RETURN_IF_ERROR(mine.status());
    SY_ASSIGN_OR_RETURN(std::string dir, ResolveStepDir(path));
    int version = 0;
    SY_ASSIGN_OR_RETURN(LoadedCheckpoint info, ReadTrainerState(dir, &version));
    SY_RETURN_IF_ERROR(CheckStepOfDir(dir, info.step));
    SY_ASSIGN_OR_RETURN(CheckpointIndex index, ReadIndex(dir, version, with_optimizer));
    // Every file's checksum, each file read by one rank.
    SY_RETURN_IF_ERROR(VerifyFileSums(dir, index, world.rank(), world.size()));
    info.verified = !index.files.empty();
    const std::string index_path = (fs::path(dir) / kModelIndexFile).string();
    SY_RETURN_IF_ERROR(CheckOwn(index, params.params(), kModelTensors, index_path));
    SY_RETURN_IF_ERROR(CheckOwn(index, optimizer, kOptimizerTensors, index_path));
    std::set<std::string> registered[2];
    for (const std::string& text : gathered) {
      for (const SliceEntry& e : DeserializeSlices(text)) registered[e.file].insert(e.name);
    }
    SY_RETURN_IF_ERROR(CheckKnown(index, registered, with_optimizer, index_path));
    PieceReader reader(dir, index);
    for (const SliceEntry& e : *mine) {
      Tensor t = Tensor::Empty({e.piece.numel()}, e.dtype);
      SY_RETURN_IF_ERROR(reader.Read(e.name, e.piece, t.raw_data()));
      if (require_finite) SY_RETURN_IF_ERROR(CheckTensorValues(t, e.name, dir, info.step));
      staged.push_back(std::move(t));
    }
    return info;
  }();
  SY_RETURN_IF_ERROR(dist::AgreeOnStatus(loaded.status(), world));

  // Every rank read everything it needs: commit.
  size_t i = 0;
  for (std::vector<parallel::Parameter>* list : {&params.params(), optimizer_state}) {
    if (list == nullptr) continue;
    for (parallel::Parameter& p : *list) p.value.CopyFrom(staged[i++]);
  }
  return loaded;
}

StatusOr<std::map<std::string, Tensor>> ReadWholeTensors(const std::string& path, bool optimizer) {
  SY_ASSIGN_OR_RETURN(std::string dir, ResolveStepDir(path));
  int version = 0;
  SY_RETURN_IF_ERROR(ReadTrainerState(dir, &version).status());
  SY_ASSIGN_OR_RETURN(CheckpointIndex index, ReadIndex(dir, version, optimizer));
  SY_RETURN_IF_ERROR(VerifyFileSums(dir, index, 0, 1));
  PieceReader reader(dir, index);
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : index.tensors) {
    if (t.file != (optimizer ? kOptimizerTensors : kModelTensors)) continue;
    Tensor whole = Tensor::Empty(t.global, t.dtype);
    SY_RETURN_IF_ERROR(reader.Read(name, BoxPiece(std::vector<int64_t>(t.global.size(), 0), t.global),
                                   whole.raw_data()));
    out.emplace(name, std::move(whole));
  }
  return out;
}

StatusOr<CheckpointReport> VerifyCheckpoint(const std::string& path) {
  SY_ASSIGN_OR_RETURN(std::string dir, ResolveStepDir(path));
  int version = 0;
  SY_ASSIGN_OR_RETURN(LoadedCheckpoint info, ReadTrainerState(dir, &version));
  SY_RETURN_IF_ERROR(CheckStepOfDir(dir, info.step));
  SY_ASSIGN_OR_RETURN(CheckpointIndex index, ReadIndex(dir, version, /*with_optimizer=*/true));
  SY_RETURN_IF_ERROR(VerifyFileSums(dir, index, 0, 1));
  CheckpointReport report{.dir = dir, .step = info.step, .checksums = !index.files.empty()};
  for (const auto& [file, sum] : index.files) report.bytes += sum.bytes;
  report.files = static_cast<int64_t>(index.files.size());
  // Every tensor read whole (its pieces must tile it) and checked for NaN and Inf, one at a
  // time: the memory of the largest tensor.
  PieceReader reader(dir, index);
  for (const auto& [name, t] : index.tensors) {
    Tensor whole = Tensor::Empty(t.global, t.dtype);
    SY_RETURN_IF_ERROR(reader.Read(name, BoxPiece(std::vector<int64_t>(t.global.size(), 0), t.global),
                                   whole.raw_data()));
    SY_RETURN_IF_ERROR(CheckTensorValues(whole, name, dir, info.step));
    ++report.tensors;
  }
  return report;
}

}  // namespace switchyard::checkpoint
