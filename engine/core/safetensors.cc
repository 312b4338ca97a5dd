#include "engine/core/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "engine/core/crc32.h"
#include "engine/core/file.h"
#include "engine/core/json_check.h"

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
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64, DType::kU8,
                  DType::kF64}) {
    if (name == SafetensorsDType(d)) return d;
  }
  return InvalidArgument("unsupported safetensors dtype '", name, "'");
}

namespace {

// Reads exactly n bytes at `offset`; false on a short read or an error.
bool PreadAll(int fd, uint64_t offset, uint64_t n, void* out) {
  char* p = static_cast<char*>(out);
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1u << 30));
    const ssize_t got = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
  return true;
}

// Checks a header's JSON against a data section of data_size bytes.
StatusOr<SafetensorsHeader> ParseHeader(const std::string& path, const std::string& text,
                                        uint64_t file_size, uint64_t data_start) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return DataLoss(path, ": header is not JSON (", JsonSyntaxError(text), ")");
  if (!j.is_object()) return DataLoss(path, ": header is not a JSON object");
  if (const std::vector<std::string> twice = DuplicateJsonKey(text); !twice.empty()) {
    const std::string what = twice[0] == "__metadata__" ? twice[0] : "tensor '" + twice[0] + "'";
    if (twice.size() == 1) return DataLoss(path, ": the header lists ", what, " twice");
    return DataLoss(path, ": the header sets '", twice.back(), "' twice in ", what);
  }
  SafetensorsHeader out;
  out.file_size = file_size;
  out.data_start = data_start;
  const uint64_t data_size = file_size - data_start;
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
    // The byte count, overflow-checked: a shape whose product does not fit is corrupt.
    uint64_t bytes = SizeOf(*dtype);
    bool fits = true;
    for (auto& d : entry["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 62)) {
        return DataLoss(path, ": tensor '", name, "' has a bad shape");
      }
      shape.push_back(d.get<int64_t>());
      fits = fits && !__builtin_mul_overflow(bytes, d.get<uint64_t>(), &bytes);
    }
    auto& offs = entry["data_offsets"];
    if (!offs[0].is_number_unsigned() || !offs[1].is_number_unsigned()) {
      return DataLoss(path, ": tensor '", name, "' has bad data_offsets");
    }
    const uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
    if (!fits || begin > end || end > data_size || end - begin != bytes) {
      return DataLoss(path, ": tensor '", name, "' data_offsets [", begin, ", ", end,
                      ") do not hold ", DTypeName(*dtype), " ", ShapeString(shape), " (",
                      fits ? StrCat(bytes, " bytes") : std::string("more bytes than fit"),
                      ") inside ", data_size, " bytes of data");
    }
    ranges.emplace_back(begin, end);
    out.tensors.emplace(name, SafetensorsEntry{*dtype, std::move(shape), begin, end});
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) return DataLoss(path, ": tensors overlap");
  }
  return out;
}

}  // namespace

StatusOr<SafetensorsReader> SafetensorsReader::Open(const std::string& path) {
  // A regular file only: a FIFO would block, a directory reads as "no header length".
  SY_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path));
  auto fail = [fd](Status s) {
    ::close(fd);
    return s;
  };
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return fail(DataLoss(path, ": cannot stat (", std::strerror(errno), ")"));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) return fail(DataLoss(path, ": not a safetensors file (", file_size, " bytes)"));
  unsigned char len_bytes[8];
  if (!PreadAll(fd, 0, 8, len_bytes)) return fail(DataLoss(path, ": cannot read the header length"));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeader || 8 + header_len > file_size) {
    return fail(DataLoss(path, ": header length ", header_len, " does not fit a ", file_size,
                         "-byte file (truncated or not safetensors)"));
  }
  std::string text(header_len, '\0');
  if (!PreadAll(fd, 8, header_len, text.data())) {
    return fail(DataLoss(path, ": could not read its ", header_len, "-byte header"));
  }
  StatusOr<SafetensorsHeader> header = ParseHeader(path, text, file_size, 8 + header_len);
  if (!header.ok()) return fail(header.status());
  return SafetensorsReader(path, fd, *std::move(header));
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& other) noexcept
    : path_(std::move(other.path_)), fd_(other.fd_), header_(std::move(other.header_)) {
  other.fd_ = -1;
}

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = other.fd_;
    header_ = std::move(other.header_);
    other.fd_ = -1;
  }
  return *this;
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

Status SafetensorsReader::Read(const SafetensorsEntry& entry, uint64_t offset, uint64_t n,
                               void* out) const {
  const uint64_t size = entry.end - entry.begin;
  if (offset > size || n > size - offset) {
    return DataLoss(path_, ": bytes [", offset, ", +", n, ") are outside a ", size,
                    "-byte tensor");
  }
  errno = 0;
  if (n > 0 && !PreadAll(fd_, header_.data_start + entry.begin + offset, n, out)) {
    return DataLoss(path_, ": could not read ", n, " bytes at ",
                    header_.data_start + entry.begin + offset, " (",
                    errno ? std::strerror(errno) : "short read", ")");
  }
  return OkStatus();
}

StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  SY_ASSIGN_OR_RETURN(SafetensorsReader reader, SafetensorsReader::Open(path));
  SafetensorsFile out;
  out.metadata = reader.header().metadata;
  for (const auto& [name, entry] : reader.header().tensors) {
    Tensor t = Tensor::Empty(entry.shape, entry.dtype);
    SY_RETURN_IF_ERROR(reader.Read(entry, 0, t.nbytes(), t.raw_data()));
    out.tensors.emplace(name, std::move(t));
  }
  return out;
}

Status WriteSafetensors(const std::string& path, const SafetensorsFile& file, uint32_t* crc) {
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
  std::string head(8, '\0');
  for (int i = 0; i < 8; ++i) head[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  head += text;
  return WriteFileThroughTemporary(path, [&](int fd) {
    uint32_t sum = crc ? Crc32(0, head.data(), head.size()) : 0;
    int err = WriteAll(fd, head.data(), head.size());
    for (auto it = file.tensors.begin(); err == 0 && it != file.tensors.end(); ++it) {
      err = WriteAll(fd, it->second.raw_data(), it->second.nbytes());
      if (crc) sum = Crc32(sum, it->second.raw_data(), it->second.nbytes());
    }
    if (crc) *crc = sum;
    return err;
  });
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
