// The index of a step directory (model.safetensors.index.json, docs/checkpoints.md "On
// disk") and reading pieces of tensors through it. Used by checkpoint.cc (and its tests);
// not a public API.
//
//   {"metadata": {"total_size": N, "format": "switchyard-checkpoint", "format_version": 2},
//    "weight_map": {"embed.weight": "model-00000-of-00004.safetensors", ...},
//    "tensors": {"layers.0.moe.experts.w1": {"kind": "model", "dtype": "F32",
//                                            "shape": [8, 4, 6],
//                                            "pieces": [{"file": "model-00001-of-00004.safetensors",
//                                                        "offset": [0, 0, 0], "box": [4, 4, 6],
//                                                        "elements": [0, 96]}, ...]}, ...}}
//
// weight_map is Hugging Face's, for the model tensors stored whole in one file; "tensors"
// lists every tensor (model and optimizer state) with its pieces. Inside a file a piece is
// stored under the tensor's name, with the box's shape when it is the whole box, else 1-D
// of its element count (StoredShape).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/safetensors.h"
#include "engine/core/status.h"
#include "engine/checkpoint/piece.h"
#include "engine/checkpoint/save_plan.h"

namespace switchyard::checkpoint {

// The file rank `rank` of `world` writes its pieces of kind `file` to:
// "model-00003-of-00008.safetensors" (the number is the world rank); with one rank
// "model.safetensors" / "optimizer.safetensors", a plain Hugging Face checkpoint.
std::string PieceFileName(int file, int rank, int world);

// The shape a piece is stored under: its box when it is the whole box, else (numel).
Shape StoredShape(const Piece& p);

struct IndexPiece {
  std::string file;
  Piece piece;
};

struct IndexTensor {
  int file = kModelTensors;  // the kind: model parameter or optimizer state
  DType dtype = DType::kF32;
  Shape global;
  std::vector<IndexPiece> pieces;
};

// The CRC-32 (engine/core/crc32.h) and size of one file of a step directory.
struct FileSum {
  uint32_t crc = 0;
  uint64_t bytes = 0;
  bool operator==(const FileSum&) const = default;
};
using FileSums = std::map<std::string, FileSum>;  // file name -> its sum

struct CheckpointIndex {
  std::map<std::string, IndexTensor> tensors;
  // "files": every other file of the step directory (tensor files, trainer_state.json,
  // config.yaml) with its checksum; empty for checkpoints saved before checksums.
  FileSums files;
  std::map<std::string, std::string> weight_map;  // name -> file (Hugging Face's)
  int64_t total_size = -1;                        // metadata.total_size (-1: absent)
  // file -> the tensors with a piece in it, each with the index of that piece.
  std::map<std::string, std::vector<std::pair<std::string, int>>> by_file;
};

// The index text for `plan` (PlanSave's) written by `world` ranks, with the checksums of
// the directory's other files ("files": {"model.safetensors": {"crc32": "0a1b2c3d",
// "bytes": 1234}, ...}).
std::string IndexText(const std::vector<SaveItem>& plan, int world, const FileSums& files = {});

// Parses and checks an index (`path` names it in errors). "metadata": format 2 needs
// "format": "switchyard-checkpoint" and `format_version` (trainer_state.json's); format 1
// may leave them out. "files" when present (file names, eight-hex-digit crc32 in either
// case, bytes). Format 2: the weight_map and
// every tensor's pieces (kinds, dtypes, shapes, pieces inside their tensor, file names),
// weight_map agreeing with the pieces and total_size with their bytes; a newer
// metadata.format_version is FailedPrecondition, anything malformed DataLoss naming the
// tensor. Format 1 (`format_version` 1, before pieces): only the weight_map is read;
// Format1Index completes it from the files.
StatusOr<CheckpointIndex> ParseIndex(const std::string& text, const std::string& path,
                                     int format_version);

// A format 1 index completed from the files' headers: every weight_map tensor whole in its
// file, and, when with_optimizer, every tensor of optimizer.safetensors whole.
StatusOr<CheckpointIndex> Format1Index(CheckpointIndex index, const std::string& dir,
                                       bool with_optimizer);

// Reads pieces of tensors out of a step directory's files, opening each file once and
// checking it against the index when it is first opened (every piece the index puts there
// stored under its name, dtype and StoredShape; nothing else there).
class PieceReader {
 public:
  PieceReader(std::string dir, const CheckpointIndex& index) : dir_(std::move(dir)), index_(index) {}

  // Fills target_data (the elements of `target`, a piece of tensor `name`, laid out as the
  // piece says; dtype as the index says) from every stored piece that shares elements with
  // it. Reads only the byte ranges needed: each run of shared elements, runs less than 64
  // KiB apart in one read, straight into target_data when a read is one run. Errors: the
  // tensor's pieces do not tile it (DataLoss naming the tensor), a missing file
  // (FailedPrecondition: incomplete checkpoint), a corrupt file (DataLoss naming it).
  Status Read(const std::string& name, const Piece& target, void* target_data);

 private:
  StatusOr<const SafetensorsReader*> Open(const std::string& file);

  std::string dir_;
  const CheckpointIndex& index_;
  std::map<std::string, SafetensorsReader> open_;
};

}  // namespace switchyard::checkpoint
