// Saving a checkpoint (SaveCheckpoint, checkpoint.h): the plan agreed, every rank's pieces
// written in parallel into a temporary directory, rank 0 finishing and publishing it.
// Loading is load.cc, the out directory's names step_dir.cc.
#include "engine/checkpoint/checkpoint.h"

#include <unistd.h>

#include <filesystem>
#include <utility>

#include "engine/checkpoint/index.h"
#include "engine/checkpoint/save_plan.h"
#include "engine/checkpoint/step_dir.h"
#include "engine/checkpoint/trainer_state.h"
#include "engine/checkpoint/verify.h"
#include "engine/core/check.h"
#include "engine/core/crc32.h"
#include "engine/core/file.h"
#include "engine/core/safetensors.h"
#include "engine/dist/agreement.h"

namespace switchyard::checkpoint {
namespace {

namespace fs = std::filesystem;

Tensor OnHost(const Tensor& t) { return t.device().is_cpu() ? t : t.To(Device::Cpu()); }

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
  auto in_tmp = [&](const char* file) { return (fs::path(tmp) / file).string(); };
  Status s = WriteFileAtomically(in_tmp(kTrainerStateFile), trainer_state);
  if (s.ok()) s = WriteFileAtomically(in_tmp(kConfigFile), config_yaml);
  if (s.ok()) s = WriteFileAtomically(in_tmp(kModelIndexFile), index);
  // The directory into place (an existing one replaced in one step; a replaced one's files
  // leave under .step-XXXXXXXX.old-<pid> when the filesystem cannot swap), durably.
  if (s.ok()) s = PublishDirectory(tmp, final_dir);
  if (!s.ok()) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    return s;
  }
  SY_RETURN_IF_ERROR(WriteFileAtomically((fs::path(out_dir) / kLatestFile).string(), name + "\n"));
  return FsyncDir(out_dir);
}

}  // namespace

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

}  // namespace switchyard::checkpoint
