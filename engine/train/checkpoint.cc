#include "engine/train/checkpoint.h"

#include "engine/core/file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "engine/core/check.h"
#include "engine/core/safetensors.h"
#include "engine/train/checkpoint_plan.h"

#ifndef SWITCHYARD_VERSION
#define SWITCHYARD_VERSION "0.1.0"
#endif

namespace switchyard::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kFormat = "switchyard-checkpoint";
// Keys of trainer_state.json that the checkpoint owns.
constexpr const char* kReservedKeys[] = {"format", "format_version", "switchyard_version",
                                         "layout"};

Tensor OnHost(const Tensor& t) { return t.device().is_cpu() ? t : t.To(Device::Cpu()); }

// ---- Files --------------------------------------------------------------------------------

Status FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return FailedPrecondition(dir, ": cannot open (", std::strerror(errno), ")");
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return FailedPrecondition(dir, ": fsync failed (", std::strerror(err), ")");
  return OkStatus();
}

// Whether `name` is "step-" followed by digits.
bool IsStepDirName(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0) return false;
  return std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool IsTempDirName(const std::string& name) {
  return name.compare(0, 6, ".step-") == 0 && name.find(".tmp-") != std::string::npos;
}

// The last component of a path, ignoring a trailing '/'.
std::string BaseName(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

// The step directory name in <out_dir>/latest.
StatusOr<std::string> ReadLatestName(const std::string& out_dir) {
  const std::string path = (fs::path(out_dir) / kLatestFile).string();
  SY_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  const size_t end = text.find_last_not_of(" \t\r\n");
  text = end == std::string::npos ? "" : text.substr(0, end + 1);
  if (!IsStepDirName(text)) {
    return DataLoss(path, ": expected a step directory name like step-00000100, got '", text, "'");
  }
  return text;
}

// Moves the finished `tmp` to `final`, replacing an existing step directory atomically.
Status PlaceStepDir(const std::string& tmp, const std::string& final_dir,
                    const std::string& aside) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(final_dir, ec);
  if (!fs::exists(st)) {
    if (std::rename(tmp.c_str(), final_dir.c_str()) != 0) {
      return FailedPrecondition(final_dir, ": rename failed (", std::strerror(errno), ")");
    }
    return OkStatus();
  }
  if (!fs::is_directory(st)) {
    return FailedPrecondition(final_dir, ": exists and is not a directory; not replacing it");
  }
  // Swap the two directories in one step; the old one ends up under the temporary name.
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(tmp, ec);
    return OkStatus();
  }
  if (errno != EINVAL && errno != ENOSYS) {
    return FailedPrecondition(final_dir, ": exchange failed (", std::strerror(errno), ")");
  }
  // A filesystem without RENAME_EXCHANGE: move the old one aside first.
  if (std::rename(final_dir.c_str(), aside.c_str()) != 0) {
    return FailedPrecondition(final_dir, ": rename failed (", std::strerror(errno), ")");
  }
  if (std::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    const int err = errno;
    std::rename(aside.c_str(), final_dir.c_str());
    return FailedPrecondition(final_dir, ": rename failed (", std::strerror(err), ")");
  }
  fs::remove_all(aside, ec);
  return OkStatus();
}

json LayoutJson(const dist::Mesh& mesh) {
  return {{"world", mesh.world()}, {"tp", mesh.tp()},   {"cp", mesh.cp()},
          {"ep", mesh.ep()},       {"etp", mesh.etp()}, {"pp", mesh.pp()},
          {"dp", mesh.dp()},       {"edp", mesh.edp()}, {"order", mesh.OrderString()}};
}

// trainer_state.json: the trainer's object plus the keys the checkpoint owns.
StatusOr<std::string> TrainerStateText(const std::string& trainer_json, int64_t step,
                                       const dist::Mesh& mesh) {
  json j = trainer_json.empty() ? json::object()
                                : json::parse(trainer_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument("checkpoint: trainer_state_json is not a JSON object: '",
                           trainer_json.substr(0, 80), "'");
  }
  for (const char* key : kReservedKeys) {
    if (j.contains(key)) {
      return InvalidArgument("checkpoint: trainer_state_json sets '", key,
                             "', which the checkpoint writes itself");
    }
  }
  if (j.contains("step") && j["step"] != json(step)) {
    return InvalidArgument("checkpoint: trainer_state_json has step ", j["step"].dump(),
                           " but step ", step, " is being saved");
  }
  j["format"] = kFormat;
  j["format_version"] = kCheckpointFormatVersion;
  j["switchyard_version"] = SWITCHYARD_VERSION;
  j["step"] = step;
  j["layout"] = LayoutJson(mesh);
  return j.dump(2) + "\n";
}

// Writes everything into a temporary directory, then puts it in place and updates latest.
Status WriteStepDir(const std::string& out_dir, int64_t step, const SafetensorsFile& model,
                    const SafetensorsFile& optimizer, const std::string& trainer_state,
                    const std::string& config_yaml) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (!fs::is_directory(out_dir)) {
    return FailedPrecondition(out_dir, ": cannot create the checkpoint directory (",
                              ec ? ec.message() : "not a directory", ")");
  }
  const std::string name = StepDirName(step);
  const std::string pid = std::to_string(::getpid());
  const std::string final_dir = (fs::path(out_dir) / name).string();
  const std::string tmp = (fs::path(out_dir) / ("." + name + ".tmp-" + pid)).string();
  const std::string aside = (fs::path(out_dir) / ("." + name + ".old-" + pid)).string();
  fs::remove_all(tmp, ec);  // a leftover of an earlier save with the same pid
  if (!fs::create_directory(tmp, ec)) {
    return FailedPrecondition(tmp, ": cannot create (", ec.message(), ")");
  }
  auto in_tmp = [&](const char* file) { return (fs::path(tmp) / file).string(); };
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
  uint64_t total = 0;
  for (const auto& [tensor_name, t] : model.tensors) {
    index["weight_map"][tensor_name] = kModelFile;
    total += t.nbytes();
  }
  index["metadata"]["total_size"] = total;
  Status s = WriteSafetensors(in_tmp(kModelFile), model);
  if (s.ok()) s = WriteSafetensors(in_tmp(kOptimizerFile), optimizer);
  if (s.ok()) s = WriteFileAtomically(in_tmp(kTrainerStateFile), trainer_state);
  if (s.ok()) s = WriteFileAtomically(in_tmp(kConfigFile), config_yaml);
  // The index last: a step directory without it is an incomplete checkpoint.
  if (s.ok()) s = WriteFileAtomically(in_tmp(kModelIndexFile), index.dump(2) + "\n");
  if (s.ok()) s = FsyncDir(tmp);
  if (s.ok()) s = PlaceStepDir(tmp, final_dir, aside);
  if (!s.ok()) {
    fs::remove_all(tmp, ec);
    return s;
  }
  SY_RETURN_IF_ERROR(FsyncDir(out_dir));
  SY_RETURN_IF_ERROR(WriteFileAtomically((fs::path(out_dir) / kLatestFile).string(), name + "\n"));
  return FsyncDir(out_dir);
}

// ---- Loading ------------------------------------------------------------------------------

// The step directory `path` means (itself, or what its latest names), checked complete.
StatusOr<std::string> ResolveStepDir(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    return NotFound(path, ": no such checkpoint (the path does not exist)");
  if (!fs::is_directory(path, ec)) return InvalidArgument(path, ": not a checkpoint directory");
  const std::string base = BaseName(path);
  if (IsTempDirName(base)) {
    return FailedPrecondition(path,
                              ": incomplete checkpoint (the temporary directory of a save "
                              "that did not finish)");
  }
  auto has = [&](const std::string& dir, const char* file) {
    return fs::exists(fs::path(dir) / file, ec);
  };
  std::string dir = path;
  if (!has(dir, kModelIndexFile) && has(dir, kLatestFile)) {
    SY_ASSIGN_OR_RETURN(std::string name, ReadLatestName(path));
    dir = (fs::path(path) / name).string();
    if (!fs::is_directory(dir, ec)) {
      return NotFound(path, "/", kLatestFile, " names ", name, ", which does not exist");
    }
  }
  if (has(dir, kModelIndexFile)) return dir;
  if (IsStepDirName(BaseName(dir)) || has(dir, kModelFile) || has(dir, kTrainerStateFile)) {
    return FailedPrecondition(dir, ": incomplete checkpoint (no ", kModelIndexFile, ")");
  }
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    if (IsStepDirName(e.path().filename().string())) steps.push_back(e.path().filename().string());
  }
  std::sort(steps.begin(), steps.end());
  if (steps.empty()) return NotFound(path, ": no checkpoint here (no ", kLatestFile, " file)");
  return NotFound(path, ": no ", kLatestFile, " file (step directories: ", steps.front(),
                  steps.size() > 1 ? " ... " + steps.back() : std::string(), "); pass one of them");
}

struct StepFiles {
  std::map<std::string, Tensor> model;  // every tensor of every file the index names
  SafetensorsFile optimizer;
  LoadedCheckpoint info;
};

StatusOr<LoadedCheckpoint> ReadTrainerState(const std::string& dir) {
  const std::string path = (fs::path(dir) / kTrainerStateFile).string();
  if (!fs::exists(path)) {
    return FailedPrecondition(dir, ": incomplete checkpoint (no ", kTrainerStateFile, ")");
  }
  LoadedCheckpoint out;
  out.dir = dir;
  SY_ASSIGN_OR_RETURN(out.trainer_state_json, ReadFile(path));
  json j = json::parse(out.trainer_state_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != kFormat ||
      !j.contains("format_version") || !j["format_version"].is_number_integer() ||
      !j.contains("step") || !j["step"].is_number_integer()) {
    return DataLoss(path, ": not a Switchyard trainer state (needs \"format\": \"", kFormat,
                    "\", \"format_version\" and \"step\")");
  }
  const int version = j["format_version"].get<int>();
  if (version > kCheckpointFormatVersion) {
    return FailedPrecondition(path, ": format version ", version, " (Switchyard ",
                              j.value("switchyard_version", "?"), "); this build reads up to ",
                              kCheckpointFormatVersion);
  }
  out.step = j["step"].get<int64_t>();
  const json layout = j.value("layout", json::object());
  SavedLayout& l = out.layout;
  for (auto [key, field] : {std::pair{"world", &l.world},
                            {"tp", &l.tp},
                            {"cp", &l.cp},
                            {"ep", &l.ep},
                            {"etp", &l.etp},
                            {"pp", &l.pp},
                            {"dp", &l.dp},
                            {"edp", &l.edp}}) {
    if (layout.contains(key) && layout[key].is_number_integer()) *field = layout[key].get<int>();
  }
  l.order = layout.value("order", "");
  const std::string config = (fs::path(dir) / kConfigFile).string();
  if (!fs::exists(config))
    return FailedPrecondition(dir, ": incomplete checkpoint (no ", kConfigFile, ")");
  SY_ASSIGN_OR_RETURN(out.config_yaml, ReadFile(config));
  return out;
}

// Reads and cross-checks the index, the files it names and the other files.
StatusOr<StepFiles> ReadStepDir(const std::string& dir, bool want_optimizer) {
  const std::string index_path = (fs::path(dir) / kModelIndexFile).string();
  SY_ASSIGN_OR_RETURN(std::string index_text, ReadFile(index_path));
  json index = json::parse(index_text, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
      !index["weight_map"].is_object()) {
    return DataLoss(index_path, ": not a safetensors index (no \"weight_map\" object)");
  }
  std::map<std::string, std::set<std::string>> by_file;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos) {
      return DataLoss(index_path, ": tensor '", name, "' maps to ", file.dump(),
                      ", not a file name");
    }
    by_file[file.get<std::string>()].insert(name);
  }
  StepFiles out;
  uint64_t total = 0;
  for (const auto& [file, names] : by_file) {
    const std::string path = (fs::path(dir) / file).string();
    if (!fs::exists(path)) {
      return FailedPrecondition(dir, ": incomplete checkpoint (", kModelIndexFile, " names ", file,
                                ", which is missing)");
    }
    SY_ASSIGN_OR_RETURN(SafetensorsFile st, ReadSafetensors(path));
    for (const std::string& name : names) {
      if (!st.tensors.count(name)) {
        return DataLoss(index_path, ": lists '", name, "' in ", file, ", which does not hold it");
      }
    }
    for (auto& [name, t] : st.tensors) {
      if (!names.count(name)) {
        return DataLoss(path, ": holds '", name, "', which ", kModelIndexFile, " does not list");
      }
      total += t.nbytes();
      out.model.emplace(name, std::move(t));
    }
  }
  if (index.contains("metadata") && index["metadata"].contains("total_size") &&
      index["metadata"]["total_size"] != json(total)) {
    return DataLoss(index_path, ": total_size ", index["metadata"]["total_size"].dump(),
                    " but the tensors hold ", total, " bytes");
  }
  SY_ASSIGN_OR_RETURN(out.info, ReadTrainerState(dir));
  if (want_optimizer) {
    const std::string path = (fs::path(dir) / kOptimizerFile).string();
    if (!fs::exists(path)) {
      return FailedPrecondition(dir, ": incomplete checkpoint (no ", kOptimizerFile, ")");
    }
    SY_ASSIGN_OR_RETURN(out.optimizer, ReadSafetensors(path));
  }
  return out;
}

// Every parameter of this rank has a tensor of its global shape and dtype.
Status CheckOwn(const std::map<std::string, Tensor>& tensors,
                const std::vector<parallel::Parameter>& params, const std::string& path) {
  for (const parallel::Parameter& p : params) {
    auto it = tensors.find(p.name);
    if (it == tensors.end()) {
      return NotFound(path, ": no tensor '", p.name, "' for the registered parameter ",
                      DTypeName(p.value.dtype()), " ", ShapeString(p.global_shape));
    }
    if (it->second.dtype() != p.value.dtype() || it->second.shape() != p.global_shape) {
      return InvalidArgument(path, ": tensor '", p.name, "': the model has ",
                             DTypeName(p.value.dtype()), " ", ShapeString(p.global_shape),
                             ", the checkpoint ", DTypeName(it->second.dtype()), " ",
                             ShapeString(it->second.shape()));
    }
  }
  return OkStatus();
}

// Every tensor in the file belongs to some rank's parameter.
Status CheckKnown(const std::map<std::string, Tensor>& tensors,
                  const std::set<std::string>& registered, const std::string& path) {
  for (const auto& [name, t] : tensors) {
    if (!registered.count(name)) {
      return InvalidArgument(path, ": holds '", name, "' ", DTypeName(t.dtype()), " ",
                             ShapeString(t.shape()), ", which no rank registered");
    }
  }
  return OkStatus();
}

void CopyIn(const std::map<std::string, Tensor>& tensors, std::vector<parallel::Parameter>& params) {
  for (parallel::Parameter& p : params) {
    const Tensor& whole = tensors.at(p.name);
    if (p.is_whole()) {
      p.value.CopyFrom(whole);
      continue;
    }
    Tensor part = Tensor::Empty(p.value.shape(), p.value.dtype());
    CopyBox(whole, part, p.offset, /*paste=*/false);
    p.value.CopyFrom(part);
  }
}

}  // namespace

std::string StepDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return buf;
}

Status SaveCheckpoint(const std::string& out_dir, int64_t step, const CheckpointContents& contents,
                      dist::Communicator& world, const dist::Mesh& mesh) {
  SY_CHECK(contents.params != nullptr) << "SaveCheckpoint: contents.params is required";
  SY_CHECK_EQ(world.size(), mesh.world()) << "SaveCheckpoint: the mesh is for another world";
  SY_CHECK(world.device().is_cpu())
      << "SaveCheckpoint gathers over a host communicator, not " << world.ToString();
  const int me = world.rank();

  // 1. Inputs, and who holds which slice.
  Status local = step < 0 ? InvalidArgument("checkpoint: step ", step, " < 0") : OkStatus();
  std::string trainer_state;
  if (local.ok() && me == 0) {
    StatusOr<std::string> text = TrainerStateText(contents.trainer_state_json, step, mesh);
    local = text.status();
    if (text.ok()) trainer_state = *std::move(text);
  }
  StatusOr<std::vector<SliceEntry>> mine =
      LocalSlices(contents.params->params(), contents.optimizer_state);
  if (local.ok() && !mine.ok()) local = mine.status();
  const std::vector<std::string> gathered =
      AllGatherStrings(mine.ok() ? SerializeSlices(*mine) : std::string(), world);
  SY_RETURN_IF_ERROR(AgreeOnStatus(local, world));
  std::vector<std::vector<SliceEntry>> per_rank;
  for (const std::string& text : gathered) per_rank.push_back(DeserializeSlices(text));
  // The same plan on every rank.
  SY_ASSIGN_OR_RETURN(std::vector<GatherItem> plan, PlanGather(per_rank));

  // 2. Whole tensors on rank 0: its own slices copied, the others received in plan order.
  std::vector<const Tensor*> own;  // indexed like LocalSlices
  for (const parallel::Parameter& p : contents.params->params()) own.push_back(&p.value);
  for (const parallel::Parameter& p : contents.optimizer_state) own.push_back(&p.value);
  SafetensorsFile files[2];
  files[kModelTensors].metadata["format"] = "pt";
  for (const GatherItem& t : plan) {
    Tensor whole = me == 0 ? Tensor::Empty(t.global, t.dtype) : Tensor();
    for (const GatherPiece& piece : t.pieces) {
      const Shape& shape = piece.size;
      if ((NumElements(shape) == 0 && !shape.empty()) || (me != 0 && piece.rank != me)) continue;
      Tensor part;
      if (piece.rank == me) {
        part = OnHost(*own[piece.index]);
        if (me != 0) {
          world.Send(part, 0);
          continue;
        }
      } else {
        part = Tensor::Empty(shape, t.dtype);
        world.Recv(part, piece.rank);
      }
      if (shape == t.global) {
        whole.CopyFrom(part);
      } else {
        CopyBox(whole, part, piece.offset, /*paste=*/true);
      }
    }
    if (me == 0) files[t.file].tensors.emplace(t.name, std::move(whole));
  }

  // 3. Rank 0 writes; every rank learns the outcome.
  Status written = OkStatus();
  if (me == 0) {
    written = WriteStepDir(out_dir, step, files[kModelTensors], files[kOptimizerTensors],
                           trainer_state, contents.config_yaml);
  }
  return AgreeOnStatus(written, world);
}

StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& path, parallel::ParameterRegistry& params,
                                          std::vector<parallel::Parameter>* optimizer_state,
                                          dist::Communicator& world) {
  SY_CHECK(world.device().is_cpu())
      << "LoadCheckpoint agrees over a host communicator, not " << world.ToString();
  const std::vector<parallel::Parameter> none;
  const std::vector<parallel::Parameter>& optimizer = optimizer_state ? *optimizer_state : none;
  StatusOr<StepFiles> files = [&]() -> StatusOr<StepFiles> {
    SY_ASSIGN_OR_RETURN(std::string dir, ResolveStepDir(path));
    SY_ASSIGN_OR_RETURN(StepFiles f, ReadStepDir(dir, optimizer_state != nullptr));
    SY_RETURN_IF_ERROR(CheckOwn(f.model, params.params(), (fs::path(dir) / kModelFile).string()));
    SY_RETURN_IF_ERROR(
        CheckOwn(f.optimizer.tensors, optimizer, (fs::path(dir) / kOptimizerFile).string()));
    return f;
  }();
  Status local = files.status();
  StatusOr<std::vector<SliceEntry>> mine = LocalSlices(params.params(), optimizer);
  if (local.ok() && !mine.ok()) local = mine.status();

  // Tensors no rank registered (with pp, each rank registers only its stage's).
  const std::vector<std::string> gathered =
      AllGatherStrings(mine.ok() ? SerializeSlices(*mine) : std::string(), world);
  if (local.ok()) {
    std::set<std::string> registered[2];
    for (const std::string& text : gathered) {
      for (const SliceEntry& e : DeserializeSlices(text)) registered[e.file].insert(e.name);
    }
    const std::string& dir = files->info.dir;
    local =
        CheckKnown(files->model, registered[kModelTensors], (fs::path(dir) / kModelFile).string());
    if (local.ok() && optimizer_state) {
      local = CheckKnown(files->optimizer.tensors, registered[kOptimizerTensors],
                         (fs::path(dir) / kOptimizerFile).string());
    }
  }
  SY_RETURN_IF_ERROR(AgreeOnStatus(local, world));

  CopyIn(files->model, params.params());
  if (optimizer_state) CopyIn(files->optimizer.tensors, *optimizer_state);
  return std::move(files->info);
}

StatusOr<std::optional<std::string>> LatestCheckpoint(const std::string& out_dir) {
  std::error_code ec;
  if (!fs::exists(fs::path(out_dir) / kLatestFile, ec)) return std::optional<std::string>();
  SY_ASSIGN_OR_RETURN(std::string name, ReadLatestName(out_dir));
  return std::optional<std::string>((fs::path(out_dir) / name).string());
}

}  // namespace switchyard::train
