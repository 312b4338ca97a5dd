#include "engine/checkpoint/verify.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/core/crc32.h"
#include "engine/checkpoint/checkpoint.h"

namespace switchyard::checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The value of element i of a floating-point tensor, as a double.
double ValueAt(const Tensor& t, int64_t i) {
  const char* p = static_cast<const char*>(t.raw_data());
  switch (t.dtype()) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case DType::kF64: {
      double v;
      std::memcpy(&v, p + 8 * i, 8);
      return v;
    }
    case DType::kBF16: {  // the high half of an f32
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      float v;
      std::memcpy(&v, &bits, 4);
      return v;
    }
    case DType::kF16: {  // all-ones exponent: Inf or NaN
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      if ((h & 0x7c00) != 0x7c00) return 0.0;
      return (h & 0x3ff) != 0 ? std::nan("") : HUGE_VAL;
    }
    default:
      return 0.0;
  }
}

}  // namespace

std::string SerializeSums(const FileSums& sums) {
  json j = json::object();
  for (const auto& [name, s] : sums) j[name] = json::array({json(s.crc), json(s.bytes)});
  return j.dump();
}

FileSums ParseSums(const std::string& text) {
  FileSums out;
  if (text.empty()) return out;
  const json j = json::parse(text);
  for (const auto& [name, s] : j.items()) {
    out[name] = {s[0].get<uint32_t>(), s[1].get<uint64_t>()};
  }
  return out;
}

Status VerifyFileSums(const std::string& dir, const CheckpointIndex& index, int rank, int world) {
  if (index.files.empty()) return OkStatus();
  const std::string index_path = (fs::path(dir) / kModelIndexFile).string();
  // Every file the checkpoint is read from has its checksum: a table that leaves one out
  // would let any change to it pass as verified.
  for (const auto& [file, pieces] : index.by_file) {
    if (!index.files.count(file)) {
      return DataLoss(index_path, ": lists pieces in ", file, " but no checksum for it");
    }
  }
  for (const char* file : {kTrainerStateFile, kConfigFile}) {
    if (!index.files.count(file)) {
      return DataLoss(index_path, ": \"files\" has no checksum for ", file,
                      " (the table covers every file of the step directory)");
    }
  }
  int i = 0;
  for (const auto& [file, want] : index.files) {
    if (i++ % world != rank) continue;
    const std::string path = (fs::path(dir) / file).string();
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      return FailedPrecondition(dir, ": incomplete checkpoint (", kModelIndexFile, " lists ", file,
                                ", which is missing)");
    }
    SY_ASSIGN_OR_RETURN(FileCrc got, Crc32OfFile(path));
    if (got.bytes != want.bytes) {
      return DataLoss(path, ": ", got.bytes, " bytes but ", kModelIndexFile, " says ", want.bytes,
                      " (truncated or damaged; load an earlier step directory)");
    }
    if (got.crc != want.crc) {
      return DataLoss(path, ": checksum mismatch (crc32 ", Crc32Hex(got.crc), ", ", kModelIndexFile,
                      " says ", Crc32Hex(want.crc), "): the file is damaged; load an earlier step "
                      "directory");
    }
  }
  return OkStatus();
}

Status CheckStepOfDir(const std::string& dir, int64_t step) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  const std::string name = p.filename().string();
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0 ||
      name.find_first_not_of("0123456789", 5) != std::string::npos || name.size() > 5 + 18) {
    return OkStatus();
  }
  const int64_t named = std::stoll(name.substr(5));
  if (named != step) {
    return DataLoss((p / kTrainerStateFile).string(), ": step ", step, " but its directory is ",
                    name, " (step ", named, "); the directory was renamed or its files mixed up");
  }
  return OkStatus();
}

Status CheckTensorValues(const Tensor& t, const std::string& name, const std::string& dir,
                         int64_t step) {
  const DType d = t.dtype();
  if (name == "optimizer.step" && d == DType::kI64 && t.numel() == 1) {
    int64_t count;
    std::memcpy(&count, t.raw_data(), 8);
    if (count < 0 || count > step) {
      return DataLoss(dir, ": tensor 'optimizer.step' is ", count, ", outside [0, ", step,
                      "] (the checkpoint's step); the file is damaged");
    }
    return OkStatus();
  }
  if (d != DType::kF32 && d != DType::kF64 && d != DType::kBF16 && d != DType::kF16) return OkStatus();
  const bool second_moment = name.rfind("optimizer.exp_avg_sq.", 0) == 0;
  for (int64_t i = 0, n = t.numel(); i < n; ++i) {
    const double v = ValueAt(t, i);
    if (!std::isfinite(v)) {
      return DataLoss(dir, ": tensor '", name, "' holds a non-finite value (", v, " at element ",
                      i, " of the piece read); the run had diverged or the file is damaged");
    }
    if (second_moment && v < 0) {
      return DataLoss(dir, ": tensor '", name, "' holds ", v, " at element ", i,
                      " of the piece read, where a mean of squares is >= 0; the file is damaged");
    }
  }
  return OkStatus();
}

}  // namespace switchyard::checkpoint
