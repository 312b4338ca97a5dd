#include "engine/checkpoint/checkpoint.h"

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
#include "engine/core/crc32.h"
#include "engine/core/safetensors.h"
#include "engine/checkpoint/index.h"
#include "engine/checkpoint/save_plan.h"
#include "engine/dist/agreement.h"
#include "engine/checkpoint/verify.h"

#ifndef SWITCHYARD_VERSION
#define SWITCHYARD_VERSION "0.1.0"
#endif

namespace switchyard::checkpoint {
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

// The temporary directory every rank writes into: <out>/.step-XXXXXXXX.tmp-<pid of rank 0>.
std::string TempDirName(const std::string& out_dir, int64_t step, int64_t pid) {
  return (fs::path(out_dir) / ("." + StepDirName(step) + ".tmp-" + std::to_string(pid))).string();
}

// Creates out_dir if needed and an empty `tmp` in it (rank 0, before any rank writes).
Status MakeTempDir(const std::string& out_dir, const std::string& tmp) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (!fs::is_directory(out_dir)) {
    return FailedPrecondition(out_dir, ": cannot create the checkpoint directory (",
                              ec ? ec.message() : "not a directory", ")");
  }
  fs::remove_all(tmp, ec);  // a leftover of an earlier save with the same pid
  if (!fs::create_directory(tmp, ec)) {
    return FailedPrecondition(tmp, ": cannot create (", ec.message(), ")");
  }
  return OkStatus();
}

// This rank's pieces of the plan into its own files in `tmp`: model-RRRRR-of-WWWWW and
// optimizer-RRRRR-of-WWWWW (none for a kind it writes nothing of). Each piece's data is a
// view of the value (a device value is copied to the host first).
Status WriteOwnPieces(const std::string& tmp, const std::vector<SaveItem>& plan,
                      const std::vector<const parallel::Parameter*>& own, int me, int world,
                      FileSums* sums) {
  SafetensorsFile files[2];
  files[kModelTensors].metadata["format"] = "pt";
  for (const SaveItem& t : plan) {
    for (const SavePiece& piece : t.pieces) {
      if (piece.rank != me) continue;
      const parallel::Parameter& p = *own[piece.index];
      const Piece& range = piece.piece;
      // A flat value holds exactly the range; a box value holds the whole box.
      Tensor data = p.flat_value ? p.value.Reshape({range.numel()})
                                 : p.value.Reshape({NumElements(range.box)})
                                       .View({range.numel()}, range.begin);
      data = OnHost(data);
      files[t.file].tensors.emplace(t.name, data.Reshape(StoredShape(range)));
    }
  }
  for (int kind : {kModelTensors, kOptimizerTensors}) {
    if (files[kind].tensors.empty()) continue;
    const std::string name = PieceFileName(kind, me, world);
    const std::string path = (fs::path(tmp) / name).string();
    uint32_t crc = 0;
    SY_RETURN_IF_ERROR(WriteSafetensors(path, files[kind], &crc));
    std::error_code ec;
    const uint64_t bytes = fs::file_size(path, ec);
    if (ec) return FailedPrecondition(path, ": cannot stat (", ec.message(), ")");
    (*sums)[name] = {crc, bytes};
  }
  return OkStatus();
}

// Rank 0, once every rank's files are in `tmp`: the trainer state, the config and the index
// (last: a step directory without it is an incomplete checkpoint), then the directory into
// place and `latest` updated. Removes `tmp` when it fails before the directory is in place.
Status FinishStepDir(const std::string& out_dir, int64_t step, const std::string& tmp,
                     const std::string& index, const std::string& trainer_state,
                     const std::string& config_yaml) {
  const std::string name = StepDirName(step);
  const std::string final_dir = (fs::path(out_dir) / name).string();
  const std::string aside =
      (fs::path(out_dir) / ("." + name + ".old-" + std::to_string(::getpid()))).string();
  auto in_tmp = [&](const char* file) { return (fs::path(tmp) / file).string(); };
  Status s = WriteFileAtomically(in_tmp(kTrainerStateFile), trainer_state);
  if (s.ok()) s = WriteFileAtomically(in_tmp(kConfigFile), config_yaml);
  if (s.ok()) s = WriteFileAtomically(in_tmp(kModelIndexFile), index);
  if (s.ok()) s = FsyncDir(tmp);
  if (s.ok()) s = PlaceStepDir(tmp, final_dir, aside);
  if (!s.ok()) {
    std::error_code ec;
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
  bool has_tensors = false;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    has_tensors = has_tensors || e.path().extension() == ".safetensors";
  }
  if (IsStepDirName(BaseName(dir)) || has_tensors || has(dir, kTrainerStateFile)) {
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

// trainer_state.json and config.yaml of `dir`; the format version into *version.
StatusOr<LoadedCheckpoint> ReadTrainerState(const std::string& dir, int* version) {
  const std::string path = (fs::path(dir) / kTrainerStateFile).string();
  if (!fs::exists(path)) {
    return FailedPrecondition(dir, ": incomplete checkpoint (no ", kTrainerStateFile, ")");
  }
  LoadedCheckpoint out;
  out.dir = dir;
  SY_ASSIGN_OR_RETURN(out.trainer_state_json, ReadFile(path));
  json j = json::parse(out.trainer_state_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("format") || j["format"] != kFormat ||
      !j.contains("format_version") || !j["format_version"].is_number_integer() ||
      !j.contains("step") || !j["step"].is_number_integer()) {
    return DataLoss(path, ": not a Switchyard trainer state (needs \"format\": \"", kFormat,
                    "\", \"format_version\" and \"step\")");
  }
  *version = j["format_version"].get<int>();
  if (*version > kCheckpointFormatVersion) {
    const json saver = j.contains("switchyard_version") ? j["switchyard_version"] : json("?");
    return FailedPrecondition(path, ": format version ", *version, " (Switchyard ",
                              saver.is_string() ? saver.get<std::string>() : saver.dump(),
                              "); this build reads up to ", kCheckpointFormatVersion);
  }
  out.step = j["step"].get<int64_t>();
  const json layout = j.contains("layout") && j["layout"].is_object() ? j["layout"] : json::object();
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
  l.order = layout.contains("order") && layout["order"].is_string() ? layout["order"].get<std::string>()
                                                                      : "";
  const std::string config = (fs::path(dir) / kConfigFile).string();
  if (!fs::exists(config))
    return FailedPrecondition(dir, ": incomplete checkpoint (no ", kConfigFile, ")");
  SY_ASSIGN_OR_RETURN(out.config_yaml, ReadFile(config));
  return out;
}

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
      << "SaveCheckpoint agrees over a host communicator, not " << world.ToString();
  const int me = world.rank();

  // 1. Inputs, and who offers which piece.
  Status local = step < 0 ? InvalidArgument("checkpoint: step ", step, " < 0") : OkStatus();
  std::string trainer_state;
  if (local.ok() && me == 0) {
    StatusOr<std::string> text = TrainerStateText(contents.trainer_state_json, step, mesh);
    local = text.status();
    if (text.ok()) trainer_state = *std::move(text);
  }
  StatusOr<std::vector<SliceEntry>> mine =
      LocalSlices(contents.params->params(), contents.optimizer_state, SliceUse::kSave);
  if (local.ok() && !mine.ok()) local = mine.status();
  const std::vector<std::string> gathered =
      dist::AllGatherStrings(mine.ok() ? SerializeSlices(*mine) : std::string(), world);
  SY_RETURN_IF_ERROR(dist::AgreeOnStatus(local, world));
  std::vector<std::vector<SliceEntry>> per_rank;
  for (const std::string& text : gathered) per_rank.push_back(DeserializeSlices(text));
  // The same plan (or the same error) on every rank.
  SY_ASSIGN_OR_RETURN(std::vector<SaveItem> plan, PlanSave(per_rank));

  // 2. Rank 0 makes the temporary directory, named after its pid, in its out_dir; every
  // rank writes there (rank 0's path is broadcast: the other ranks' out_dir is not used).
  const std::string tmp = dist::AllGatherStrings(
      me == 0 ? TempDirName(out_dir, step, ::getpid()) : std::string(), world)[0];
  SY_RETURN_IF_ERROR(dist::AgreeOnStatus(me == 0 ? MakeTempDir(out_dir, tmp) : OkStatus(), world));

  // 3. Every rank writes its own pieces, in parallel; nothing travels between ranks.
  std::vector<const parallel::Parameter*> own;  // indexed like LocalSlices
  for (const parallel::Parameter& p : contents.params->params()) own.push_back(&p);
  for (const parallel::Parameter& p : contents.optimizer_state) own.push_back(&p);
  FileSums sums;  // this rank's files, then (rank 0) every file of the directory
  const Status written =
      dist::AgreeOnStatus(WriteOwnPieces(tmp, plan, own, me, world.size(), &sums), world);
  if (!written.ok()) {
    std::error_code ec;
    if (me == 0) fs::remove_all(tmp, ec);  // every rank is done with it
    return written;
  }
  const std::vector<std::string> all_sums = dist::AllGatherStrings(SerializeSums(sums), world);

  // 4. Rank 0 finishes the directory once every rank has written; all learn the outcome.
  Status finished = OkStatus();
  if (me == 0) {
    for (const std::string& text : all_sums) {
      for (const auto& [name, sum] : ParseSums(text)) sums[name] = sum;
    }
    for (const auto& [name, text] : {std::pair<const char*, const std::string*>{kTrainerStateFile, &trainer_state},
                                     {kConfigFile, &contents.config_yaml}}) {
      sums[name] = {Crc32(0, text->data(), text->size()), text->size()};
    }
    finished = FinishStepDir(out_dir, step, tmp, IndexText(plan, world.size(), sums),
                             trainer_state, contents.config_yaml);
  }
  return dist::AgreeOnStatus(finished, world);
}

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
      if (require_finite) SY_RETURN_IF_ERROR(CheckFiniteValues(t, e.name, dir));
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
    SY_RETURN_IF_ERROR(CheckFiniteValues(whole, name, dir));
    ++report.tensors;
  }
  return report;
}

Status RemoveLeftoverTempDirs(const std::string& out_dir, std::vector<std::string>* removed) {
  std::error_code ec;
  if (!fs::is_directory(out_dir, ec)) return OkStatus();
  std::vector<fs::path> leftovers;
  for (const auto& e : fs::directory_iterator(out_dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool old = name.compare(0, 6, ".step-") == 0 && name.find(".old-") != std::string::npos;
    if (e.is_directory(ec) && (IsTempDirName(name) || old)) leftovers.push_back(e.path());
    // WriteFileAtomically's temporary of `latest` (latest.tmp.<pid>), left by a kill mid-write.
    const std::string latest_tmp = std::string(kLatestFile) + ".tmp.";
    if (e.is_regular_file(ec) && name.compare(0, latest_tmp.size(), latest_tmp) == 0) {
      leftovers.push_back(e.path());
    }
  }
  std::sort(leftovers.begin(), leftovers.end());
  for (const fs::path& p : leftovers) {
    fs::remove_all(p, ec);
    if (ec) return FailedPrecondition(p.string(), ": cannot remove a leftover of a killed save (", ec.message(), ")");
    removed->push_back(p.string());
  }
  return OkStatus();
}

StatusOr<std::optional<std::string>> LatestCheckpoint(const std::string& out_dir) {
  std::error_code ec;
  if (!fs::exists(fs::path(out_dir) / kLatestFile, ec)) return std::optional<std::string>();
  SY_ASSIGN_OR_RETURN(std::string name, ReadLatestName(out_dir));
  return std::optional<std::string>((fs::path(out_dir) / name).string());
}

}  // namespace switchyard::checkpoint
