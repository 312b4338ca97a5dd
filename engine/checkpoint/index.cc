#include "engine/checkpoint/index.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/str_join.h"

#include "engine/core/crc32.h"
#include "engine/core/json_check.h"
#include "engine/checkpoint/checkpoint.h"

namespace switchyard::checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Reads of runs closer than this are merged into one; a merged read stays under kMaxBlock.
constexpr int64_t kReadGap = 64 << 10;
constexpr int64_t kMaxBlock = 64 << 20;

bool IsFileName(const json& j) {
  if (!j.is_string()) return false;
  const std::string s = j.get<std::string>();
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos;
}

// A list of non-negative integers of at most 2^62 into out (for a size, `dims`: also their
// product); otherwise what is wrong with it ("is [-1,0], not a list of non-negative integers").
std::string DimsProblem(const json& j, bool dims, std::vector<int64_t>& out) {
  const std::string is = "is " + j.dump().substr(0, 80);
  if (!j.is_array()) return is + ", not a list of non-negative integers";
  out.clear();
  uint64_t product = 1;
  for (const json& d : j) {
    if (!d.is_number_unsigned()) return is + ", not a list of non-negative integers";
    if (d.get<uint64_t>() > (uint64_t{1} << 62)) return is + ", beyond 2^62";
    if (dims && (__builtin_mul_overflow(product, d.get<uint64_t>(), &product) ||
                 product > (uint64_t{1} << 62))) {
      return is + ", more than 2^62 elements";
    }
    out.push_back(d.get<int64_t>());
  }
  return "";
}

// Piece i's offset, box and elements [begin, end) into ip.piece, or what is wrong with them.
std::string ReadPieceRange(const json& p, size_t i, IndexPiece& ip) {
  std::vector<int64_t> range;
  for (auto [key, out] : {std::pair<const char*, std::vector<int64_t>*>{"offset", &ip.piece.offset},
                          {"box", &ip.piece.box}, {"elements", &range}}) {
    if (!p.contains(key)) return StrCat("piece ", i, " has no ", key);
    if (std::string bad = DimsProblem(p[key], out == &ip.piece.box, *out); !bad.empty()) {
      return StrCat("piece ", i, ": ", key, " ", bad);
    }
  }
  if (range.size() != 2 || range[0] > range[1]) {
    return StrCat("piece ", i, ": elements ", p["elements"].dump(), " is not a range [begin, end)");
  }
  ip.piece.begin = range[0];
  ip.piece.end = range[1];
  return "";
}

// One tensor entry of "tensors"; `bad` says what is wrong.
bool ReadTensor(const json& j, IndexTensor& t, std::string& bad) {
  auto fail = [&](std::string what) {
    bad = std::move(what);
    return false;
  };
  if (!j.is_object()) return fail("not an object");
  const std::string kind =
      j.contains("kind") && j["kind"].is_string() ? j["kind"].get<std::string>() : "";
  if (kind != "model" && kind != "optimizer") return fail("kind is not \"model\" or \"optimizer\"");
  t.file = kind == "model" ? kModelTensors : kOptimizerTensors;
  if (!j.contains("dtype") || !j["dtype"].is_string()) return fail("no dtype");
  StatusOr<DType> dtype = ParseSafetensorsDType(j["dtype"].get<std::string>());
  if (!dtype.ok()) return fail(std::string(dtype.status().message()));
  t.dtype = *dtype;
  if (!j.contains("shape")) return fail("a bad shape (no shape)");
  if (std::string bad = DimsProblem(j["shape"], true, t.global); !bad.empty()) {
    return fail("a bad shape (shape " + bad + ")");
  }
  if (!j.contains("pieces") || !j["pieces"].is_array()) return fail("no pieces");
  for (size_t i = 0; i < j["pieces"].size(); ++i) {
    const json& p = j["pieces"][i];
    IndexPiece ip;
    if (!p.is_object() || !p.contains("file") || !IsFileName(p["file"])) {
      return fail(p.is_object() && p.contains("file")
                      ? StrCat("piece ", i, ": file ", p["file"].dump().substr(0, 80),
                               " is not a file name (a file of the step directory, without '/')")
                      : StrCat("piece ", i, " has no file"));
    }
    ip.file = p["file"].get<std::string>();
    if (std::string bad = ReadPieceRange(p, i, ip); !bad.empty()) return fail(bad);
    if (!PieceInside(ip.piece, t.global)) {
      return fail("a piece outside the tensor (" + PieceString(ip.piece, t.global) + ")");
    }
    t.pieces.push_back(std::move(ip));
  }
  return true;
}

void IndexFiles(CheckpointIndex& index) {
  index.by_file.clear();
  for (const auto& [name, t] : index.tensors) {
    for (int i = 0; i < static_cast<int>(t.pieces.size()); ++i) {
      index.by_file[t.pieces[i].file].emplace_back(name, i);
    }
  }
}

// The one file holding a model tensor whole, or "".
std::string WholeIn(const IndexTensor& t) {
  if (t.file != kModelTensors || t.pieces.size() != 1) return "";
  const Piece& p = t.pieces[0].piece;
  return p.box == t.global && p.whole_box() ? t.pieces[0].file : "";
}

// Every piece the index puts in `file` is stored there under its name, dtype and
// StoredShape, and the file holds nothing else.
Status CheckFile(const SafetensorsReader& reader, const std::string& file,
                 const CheckpointIndex& index, const std::string& index_path) {
  const auto it = index.by_file.find(file);
  std::set<std::string> listed;
  if (it != index.by_file.end()) {
    for (const auto& [name, i] : it->second) {
      listed.insert(name);
      const IndexTensor& t = index.tensors.at(name);
      const auto e = reader.header().tensors.find(name);
      if (e == reader.header().tensors.end()) {
        return DataLoss(index_path, ": lists '", name, "' in ", file, ", which does not hold it");
      }
      const Shape want = StoredShape(t.pieces[i].piece);
      if (e->second.dtype != t.dtype || e->second.shape != want) {
        return DataLoss(reader.path(), ": '", name, "' is ", DTypeName(e->second.dtype), " ",
                        ShapeString(e->second.shape), " but ", kModelIndexFile, " says ",
                        DTypeName(t.dtype), " ", ShapeString(want), " (",
                        PieceString(t.pieces[i].piece, t.global), ")");
      }
    }
  }
  for (const auto& [name, e] : reader.header().tensors) {
    if (!listed.count(name)) {
      return DataLoss(reader.path(), ": holds '", name, "', which ", kModelIndexFile,
                      " does not list");
    }
  }
  return OkStatus();
}

}  // namespace

std::string PieceFileName(int file, int rank, int world) {
  if (world == 1) return file == kModelTensors ? kModelFile : kOptimizerFile;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s-%05d-of-%05d.safetensors", CheckpointFileKind(file), rank,
                world);
  return buf;
}

Shape StoredShape(const Piece& p) { return p.whole_box() ? p.box : Shape{p.numel()}; }

// One line per weight_map entry, per tensor and per piece: readable, and small enough that
// every rank parses it quickly when a tensor has a piece per rank.
std::string IndexText(const std::vector<SaveItem>& plan, int world, const FileSums& files) {
  std::vector<std::string> weight_map, tensors;
  uint64_t total = 0;
  for (const SaveItem& t : plan) {
    std::vector<std::string> pieces;
    for (const SavePiece& p : t.pieces) {
      const json piece = {{"file", PieceFileName(t.file, p.rank, world)},
                          {"offset", p.piece.offset},
                          {"box", p.piece.box},
                          {"elements", {p.piece.begin, p.piece.end}}};
      pieces.push_back("    " + piece.dump());
      if (t.file == kModelTensors) total += static_cast<uint64_t>(p.piece.numel()) * SizeOf(t.dtype);
    }
    const json head = {{"kind", CheckpointFileKind(t.file)},
                       {"dtype", SafetensorsDType(t.dtype)},
                       {"shape", t.global}};
    std::string entry = head.dump();
    entry.pop_back();  // the closing brace: the pieces follow
    tensors.push_back("  " + json(t.name).dump() + ": " + entry + ", \"pieces\": [\n" +
                      absl::StrJoin(pieces, ",\n") + "]}");
    if (t.file == kModelTensors && t.pieces.size() == 1 && t.pieces[0].piece.box == t.global &&
        t.pieces[0].piece.whole_box()) {
      weight_map.push_back("  " + json(t.name).dump() + ": " +
                           json(PieceFileName(t.file, t.pieces[0].rank, world)).dump());
    }
  }
  const json metadata = {{"total_size", total},
                         {"format", kCheckpointFormat},
                         {"format_version", kCheckpointFormatVersion}};
  std::vector<std::string> sums;
  for (const auto& [name, sum] : files) {
    sums.push_back("  " + json(name).dump() + ": " +
                   json{{"crc32", Crc32Hex(sum.crc)}, {"bytes", sum.bytes}}.dump());
  }
  return "{\"metadata\": " + metadata.dump() + ",\n\"files\": {\n" + absl::StrJoin(sums, ",\n") +
         "},\n\"weight_map\": {\n" +
         absl::StrJoin(weight_map, ",\n") + "},\n\"tensors\": {\n" +
         absl::StrJoin(tensors, ",\n") + "}}\n";
}

namespace {

// "weight_map" (tensor name -> file) and metadata.total_size into *out (format 1 and 2).
Status ParseWeightMap(const json& index, const json& metadata, const std::string& path,
                      CheckpointIndex* out) {
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!IsFileName(file)) {
      return DataLoss(path, ": tensor '", name, "' maps to ", file.dump(), ", not a file name");
    }
    out->weight_map[name] = file.get<std::string>();
  }
  if (metadata.is_object() && metadata.contains("total_size")) {
    if (!metadata["total_size"].is_number_unsigned()) {
      return DataLoss(path, ": total_size is ", metadata["total_size"].dump());
    }
    out->total_size = metadata["total_size"].get<int64_t>();
  }
  return OkStatus();
}

// The optional "files" object (file name -> {"crc32", "bytes"}) into out->files.
Status ParseFileSums(const json& index, const std::string& path, CheckpointIndex* out) {
  if (!index.contains("files")) return OkStatus();
  const json& files = index["files"];
  if (!files.is_object()) return DataLoss(path, ": \"files\" is not an object");
  for (const auto& [name, sum] : files.items()) {
    const json crc = sum.is_object() && sum.contains("crc32") ? sum["crc32"] : json();
    const json bytes = sum.is_object() && sum.contains("bytes") ? sum["bytes"] : json();
    // Written in lower case (Crc32Hex); upper case is read too.
    std::string hex = crc.is_string() ? crc.get<std::string>() : "";
    const bool is_hex =
        hex.size() == 8 && hex.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos;
    if (!IsFileName(json(name))) {
      return DataLoss(path, ": files: '", name, "' is not a file name (the files of a step "
                      "directory are listed by name, without '/')");
    }
    if (!is_hex || !bytes.is_number_unsigned()) {
      return DataLoss(path, ": files: entry '", name, "' is ", sum.dump(),
                      ", not {\"crc32\": 8 hex digits, \"bytes\": N}");
    }
    out->files[name] = {static_cast<uint32_t>(std::stoul(hex, nullptr, 16)), bytes.get<uint64_t>()};
  }
  return OkStatus();
}

// The "tensors" object of format 2 into out->tensors, each checked against the weight map
// (a model tensor stored whole in one file is listed there, and only such a tensor), and
// the model tensors' bytes against total_size.
Status ParseTensors(const json& index, const std::string& path, int format_version,
                    CheckpointIndex* out) {
  if (!index.contains("tensors") || !index["tensors"].is_object()) {
    return DataLoss(path, ": no \"tensors\" object (format ", format_version,
                    " lists every tensor's pieces there)");
  }
  uint64_t total = 0;
  for (const auto& [name, entry] : index["tensors"].items()) {
    IndexTensor t;
    std::string bad;
    if (!ReadTensor(entry, t, bad)) return DataLoss(path, ": tensor '", name, "': ", bad);
    if (t.file == kModelTensors) {
      for (const IndexPiece& p : t.pieces) total += static_cast<uint64_t>(p.piece.numel()) * SizeOf(t.dtype);
    }
    const std::string whole = WholeIn(t);
    const auto listed = out->weight_map.find(name);
    if (!whole.empty() && listed == out->weight_map.end()) {
      return DataLoss(path, ": weight_map misses '", name, "', a model tensor stored whole in ",
                      whole);
    }
    if (listed != out->weight_map.end() && listed->second != whole) {
      return DataLoss(path, ": weight_map maps '", name, "' to ", listed->second,
                      whole.empty() ? std::string(", but it is not stored whole in one file")
                                    : ", but its piece is in " + whole);
    }
    out->tensors.emplace(name, std::move(t));
  }
  for (const auto& [name, file] : out->weight_map) {
    if (!out->tensors.count(name)) {
      return DataLoss(path, ": weight_map lists '", name, "', which \"tensors\" does not");
    }
  }
  if (out->total_size >= 0 && static_cast<uint64_t>(out->total_size) != total) {
    return DataLoss(path, ": total_size ", out->total_size, " but the tensors hold ", total,
                    " bytes");
  }
  return OkStatus();
}

// "metadata": format 2 writes {"format": "switchyard-checkpoint", "format_version": 2,
// "total_size": N}, the version trainer_state.json gives (`format_version`); format 1 wrote
// only total_size. A newer version is FailedPrecondition, anything else wrong DataLoss.
Status CheckMetadata(const json& index, const std::string& path, int format_version) {
  if (!index.contains("metadata")) {
    if (format_version < 2) return OkStatus();
    return DataLoss(path, ": no \"metadata\" object (format ", format_version,
                    " writes format, format_version and total_size there)");
  }
  const json& metadata = index["metadata"];
  if (!metadata.is_object()) return DataLoss(path, ": \"metadata\" is not an object");
  if (metadata.contains("format_version")) {
    const json& v = metadata["format_version"];
    if (!v.is_number_integer() || v.get<int64_t>() < 1) {
      return DataLoss(path, ": metadata.format_version is ", v.dump().substr(0, 80),
                      ", not a format version (1 to ", kCheckpointFormatVersion, ")");
    }
    if (v.get<int64_t>() > kCheckpointFormatVersion) {
      return FailedPrecondition(path, ": format version ", v.get<int64_t>(),
                                "; this build reads up to ", kCheckpointFormatVersion);
    }
    if (v.get<int64_t>() != format_version) {
      return DataLoss(path, ": metadata.format_version is ", v.get<int64_t>(), " but ",
                      kTrainerStateFile, "'s is ", format_version, " (they are written together)");
    }
  } else if (format_version >= 2) {
    return DataLoss(path, ": metadata has no format_version (format ", format_version,
                    " writes it)");
  }
  if (metadata.contains("format") || format_version >= 2) {
    const json format = metadata.value("format", json());
    if (format != kCheckpointFormat) {
      return DataLoss(path, ": metadata.format is ", format.dump().substr(0, 80), ", not \"",
                      kCheckpointFormat, "\"");
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<CheckpointIndex> ParseIndex(const std::string& text, const std::string& path,
                                     int format_version) {
  json index = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded()) return DataLoss(path, ": not JSON (", JsonSyntaxError(text), ")");
  if (!index.is_object() || !index.contains("weight_map") ||
      !index["weight_map"].is_object()) {
    return DataLoss(path, ": not a safetensors index (no \"weight_map\" object)");
  }
  if (const std::vector<std::string> twice = DuplicateJsonKey(text); !twice.empty()) {
    if (twice.size() == 1) return DataLoss(path, ": \"", twice[0], "\" is set twice");
    if (twice.size() == 2) return DataLoss(path, ": \"", twice[0], "\" lists '", twice[1], "' twice");
    return DataLoss(path, ": \"", twice[0], "\": '", twice[1], "' sets '", twice.back(), "' twice");
  }
  const json metadata = index.value("metadata", json::object());
  SY_RETURN_IF_ERROR(CheckMetadata(index, path, format_version));
  CheckpointIndex out;
  SY_RETURN_IF_ERROR(ParseWeightMap(index, metadata, path, &out));
  SY_RETURN_IF_ERROR(ParseFileSums(index, path, &out));
  if (format_version < 2) return out;
  SY_RETURN_IF_ERROR(ParseTensors(index, path, format_version, &out));
  IndexFiles(out);
  return out;
}

StatusOr<CheckpointIndex> Format1Index(CheckpointIndex index, const std::string& dir,
                                       bool with_optimizer) {
  const std::string index_path = (fs::path(dir) / kModelIndexFile).string();
  std::map<std::string, std::set<std::string>> by_file;
  for (const auto& [name, file] : index.weight_map) by_file[file].insert(name);
  if (with_optimizer) by_file[kOptimizerFile];
  uint64_t total = 0;
  for (const auto& [file, names] : by_file) {
    const std::string path = (fs::path(dir) / file).string();
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      return FailedPrecondition(dir, ": incomplete checkpoint (",
                                names.empty() ? std::string("no ") + file
                                              : std::string(kModelIndexFile) + " names " + file +
                                                    ", which is missing",
                                ")");
    }
    SY_ASSIGN_OR_RETURN(SafetensorsReader reader, SafetensorsReader::Open(path));
    const bool optimizer = file == kOptimizerFile && names.empty();
    for (const std::string& name : names) {
      if (!reader.header().tensors.count(name)) {
        return DataLoss(index_path, ": lists '", name, "' in ", file, ", which does not hold it");
      }
    }
    for (const auto& [name, e] : reader.header().tensors) {
      if (!optimizer && !names.count(name)) {
        return DataLoss(path, ": holds '", name, "', which ", kModelIndexFile, " does not list");
      }
      IndexTensor t{optimizer ? kOptimizerTensors : kModelTensors, e.dtype, e.shape, {}};
      t.pieces.push_back({file, BoxPiece(std::vector<int64_t>(e.shape.size(), 0), e.shape)});
      if (!optimizer) total += e.end - e.begin;
      index.tensors[name] = std::move(t);
    }
  }
  if (index.total_size >= 0 && static_cast<uint64_t>(index.total_size) != total) {
    return DataLoss(index_path, ": total_size ", index.total_size, " but the tensors hold ", total,
                    " bytes");
  }
  IndexFiles(index);
  return index;
}

StatusOr<const SafetensorsReader*> PieceReader::Open(const std::string& file) {
  auto it = open_.find(file);
  if (it != open_.end()) return &it->second;
  const std::string path = (fs::path(dir_) / file).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return FailedPrecondition(dir_, ": incomplete checkpoint (", kModelIndexFile, " names ", file,
                              ", which is missing)");
  }
  SY_ASSIGN_OR_RETURN(SafetensorsReader reader, SafetensorsReader::Open(path));
  SY_RETURN_IF_ERROR(CheckFile(reader, file, index_, (fs::path(dir_) / kModelIndexFile).string()));
  return &open_.emplace(file, std::move(reader)).first->second;
}

Status PieceReader::Read(const std::string& name, const Piece& target, void* target_data) {
  const std::string index_path = (fs::path(dir_) / kModelIndexFile).string();
  const IndexTensor& t = index_.tensors.at(name);
  std::vector<Piece> pieces;
  for (const IndexPiece& p : t.pieces) pieces.push_back(p.piece);
  const TilingProblem problem = CheckTiling(pieces, t.global);
  if (problem.first >= 0) {
    return DataLoss(index_path, ": the pieces of '", name, "' overlap (",
                    PieceString(pieces[problem.first], t.global), " in ",
                    t.pieces[problem.first].file, "; ", PieceString(pieces[problem.second], t.global),
                    " in ", t.pieces[problem.second].file, ")");
  }
  if (problem.covered != NumElements(t.global)) {
    return DataLoss(index_path, ": the pieces of '", name, "' ", ShapeString(t.global), " cover ",
                    problem.covered, " of its ", NumElements(t.global), " elements");
  }
  const int64_t elem = static_cast<int64_t>(SizeOf(t.dtype));
  char* out = static_cast<char*>(target_data);
  for (const IndexPiece& ip : t.pieces) {
    if (CommonElements(ip.piece, target) == 0) continue;
    SY_ASSIGN_OR_RETURN(const SafetensorsReader* file, Open(ip.file));
    const SafetensorsEntry& entry = file->header().tensors.at(name);
    // Runs of shared elements, merged into reads: [first, last) of the stored piece.
    struct Block {
      int64_t first, last, target_at, runs;
    };
    std::vector<Block> blocks;
    ForEachCommonRun(ip.piece, target, [&](int64_t s, int64_t d, int64_t n) {
      if (!blocks.empty() && (s - blocks.back().last) * elem <= kReadGap &&
          (s + n - blocks.back().first) * elem <= kMaxBlock) {
        blocks.back().last = s + n;
        ++blocks.back().runs;
      } else {
        blocks.push_back({s, s + n, d, 1});
      }
    });
    std::vector<char> buffer;
    for (const Block& b : blocks) {
      const uint64_t at = static_cast<uint64_t>(b.first * elem);
      const uint64_t bytes = static_cast<uint64_t>((b.last - b.first) * elem);
      if (b.runs == 1) {  // contiguous in both: straight into the target
        SY_RETURN_IF_ERROR(file->Read(entry, at, bytes, out + b.target_at * elem));
        continue;
      }
      buffer.resize(bytes);
      SY_RETURN_IF_ERROR(file->Read(entry, at, bytes, buffer.data()));
      const Piece part{ip.piece.offset, ip.piece.box, ip.piece.begin + b.first,
                       ip.piece.begin + b.last};
      CopyCommon(part, buffer.data(), target, target_data, static_cast<size_t>(elem));
    }
  }
  return OkStatus();
}

}  // namespace switchyard::checkpoint
