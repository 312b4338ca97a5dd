#include "engine/core/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace switchyard {
namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeader = 100u << 20;  // 100 MiB, as the reference implementation

}  // namespace

const char* SafetensorsDType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU8: return "U8";
    case DType::kF64: return "F64";
  }
  return "?";
}

StatusOr<DType> ParseSafetensorsDType(const std::string& name) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64, DType::kU8}) {
    if (name == SafetensorsDType(d)) return d;
  }
  return InvalidArgument("unsupported safetensors dtype '", name, "'");
}

StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path, ": cannot open (", std::strerror(errno), ")");
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  if (file_size < 8) return DataLoss(path, ": not a safetensors file (", file_size, " bytes)");
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeader || 8 + header_len > file_size) {
    return DataLoss(path, ": header length ", header_len, " does not fit a ", file_size,
                    "-byte file (truncated or not safetensors)");
  }
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  json j = json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return DataLoss(path, ": header is not a JSON object");

  const uint64_t data_size = file_size - 8 - header_len;
  std::string data(data_size, '\0');
  in.read(data.data(), static_cast<std::streamsize>(data_size));
  if (!in) return DataLoss(path, ": could not read ", data_size, " bytes of data");

  SafetensorsFile out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto& [name, entry] : j.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return DataLoss(path, ": __metadata__ is not an object");
      for (auto& [k, v] : entry.items()) {
        if (!v.is_string()) return DataLoss(path, ": __metadata__.", k, " is not a string");
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets") || !entry["dtype"].is_string() ||
        !entry["shape"].is_array() || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2) {
      return DataLoss(path, ": tensor '", name, "' has a malformed header entry");
    }
    auto dtype = ParseSafetensorsDType(entry["dtype"].get<std::string>());
    if (!dtype.ok()) return DataLoss(path, ": tensor '", name, "': ", dtype.status().message());
    Shape shape;
    for (auto& d : entry["shape"]) {
      if (!d.is_number_unsigned()) return DataLoss(path, ": tensor '", name, "' has a bad shape");
      shape.push_back(d.get<int64_t>());
    }
    auto& offs = entry["data_offsets"];
    if (!offs[0].is_number_unsigned() || !offs[1].is_number_unsigned()) {
      return DataLoss(path, ": tensor '", name, "' has bad data_offsets");
    }
    const uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
    const uint64_t bytes = static_cast<uint64_t>(NumElements(shape)) * SizeOf(*dtype);
    if (begin > end || end > data_size || end - begin != bytes) {
      return DataLoss(path, ": tensor '", name, "' data_offsets [", begin, ", ", end,
                      ") do not hold ", DTypeName(*dtype), " ", ShapeString(shape), " (",
                      bytes, " bytes) inside ", data_size, " bytes of data");
    }
    ranges.emplace_back(begin, end);
    Tensor t = Tensor::Empty(shape, *dtype);
    if (bytes) std::memcpy(t.raw_data(), data.data() + begin, bytes);
    out.tensors.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) return DataLoss(path, ": tensors overlap");
  }
  return out;
}

Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = StrCat(path, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return FailedPrecondition(tmp, ": cannot create (", std::strerror(errno), ")");
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s = FailedPrecondition(tmp, ": write failed (", std::strerror(errno), ")");
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return FailedPrecondition(tmp, ": fsync/close failed (", std::strerror(errno), ")");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return FailedPrecondition(path, ": rename failed (", std::strerror(errno), ")");
  }
  return OkStatus();
}

Status WriteSafetensors(const std::string& path, const SafetensorsFile& file) {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : file.tensors) {
    if (!t.device().is_cpu()) return FailedPrecondition("tensor '", name, "' is not on the host");
    header[name] = {{"dtype", SafetensorsDType(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // align the data to 8 bytes
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  bytes += text;
  bytes.reserve(bytes.size() + offset);
  for (const auto& [name, t] : file.tensors) {
    bytes.append(static_cast<const char*>(t.raw_data()), t.nbytes());
  }
  return WriteFileAtomically(path, bytes);
}

StatusOr<Tensor> GetTensor(const SafetensorsFile& file, const std::string& name, DType dtype,
                           const Shape& shape, const std::string& path) {
  auto it = file.tensors.find(name);
  if (it == file.tensors.end()) return NotFound(path, ": missing tensor '", name, "'");
  const Tensor& t = it->second;
  if (t.dtype() != dtype || (!shape.empty() && t.shape() != shape)) {
    return InvalidArgument(path, ": tensor '", name, "': expected ", DTypeName(dtype), " ",
                           shape.empty() ? std::string("(any shape)") : ShapeString(shape),
                           ", got ", DTypeName(t.dtype()), " ", ShapeString(t.shape()));
  }
  return t;
}

}  // namespace switchyard
