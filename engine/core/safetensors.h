// Reading and writing safetensors files: an 8-byte little-endian header length, a JSON
// header {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}, then the raw little-endian data. Host tensors only.
// Whole files (ReadSafetensors), or a header alone and then byte ranges of its tensors
// (SafetensorsReader: what checkpoint loading uses to read only the parts it needs).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/core/tensor.h"

namespace switchyard {

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;          // name -> host tensor (sorted by name)
  std::map<std::string, std::string> metadata;    // "__metadata__"
};

// Reads a whole file. Every problem is one error naming the path and what is wrong: a
// missing or short file, a malformed header, an unknown dtype, offsets outside the data or
// overlapping, a shape that does not match its byte range.
StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);

// Writes atomically: to "<path>.tmp.<pid>", fsync, then rename over `path`, so an existing
// file is replaced whole or not at all. Tensors must be on the host; their bytes are
// written straight from their storage (views are fine), never copied into one buffer.
// With `crc`, the CRC-32 (engine/core/crc32.h) of the bytes written, computed as they go.
Status WriteSafetensors(const std::string& path, const SafetensorsFile& file,
                        uint32_t* crc = nullptr);

// One tensor of a header: its dtype, shape and bytes [begin, end) of the data section.
struct SafetensorsEntry {
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

// A checked header: every entry's byte range lies inside the file (overflow-checked sums
// and products), holds exactly its dtype and shape, and overlaps no other.
struct SafetensorsHeader {
  uint64_t file_size = 0;
  uint64_t data_start = 0;  // 8 + the header's length: the file offset of the data section
  std::map<std::string, SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
};

// A safetensors file open for reading byte ranges of its tensors (pread), after reading and
// checking only its header. Every problem is one error naming the path (the messages of
// ReadSafetensors). Movable, not copyable; closes the file when destroyed.
class SafetensorsReader {
 public:
  static StatusOr<SafetensorsReader> Open(const std::string& path);
  SafetensorsReader(SafetensorsReader&& other) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&& other) noexcept;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;
  ~SafetensorsReader();

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  // Bytes [offset, offset + n) of `entry`'s data into out. DataLoss naming the file when
  // the range is not inside the entry or the read comes up short.
  Status Read(const SafetensorsEntry& entry, uint64_t offset, uint64_t n, void* out) const;

 private:
  SafetensorsReader(std::string path, int fd, SafetensorsHeader header)
      : path_(std::move(path)), fd_(fd), header_(std::move(header)) {}
  std::string path_;
  int fd_ = -1;
  SafetensorsHeader header_;
};

// The safetensors dtype string ("F32", "BF16", "F16", "I32", "I64", "U8") and back.
const char* SafetensorsDType(DType dtype);
StatusOr<DType> ParseSafetensorsDType(const std::string& name);

// Looks up `name` and checks its dtype and shape: "x: expected f32 (4, 8), got bf16 (4, 8)
// in in.safetensors". An empty `shape` skips the shape check.
StatusOr<Tensor> GetTensor(const SafetensorsFile& file, const std::string& name, DType dtype,
                           const Shape& shape, const std::string& path);

}  // namespace switchyard
