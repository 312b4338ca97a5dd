// Reading and writing safetensors files: an 8-byte little-endian header length, a JSON
// header {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}, then the raw little-endian data. Host tensors only.
#pragma once

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
// file is replaced whole or not at all. Tensors must be on the host.
Status WriteSafetensors(const std::string& path, const SafetensorsFile& file);

// The safetensors dtype string ("F32", "BF16", "F16", "I32", "I64", "U8") and back.
const char* SafetensorsDType(DType dtype);
StatusOr<DType> ParseSafetensorsDType(const std::string& name);

// Looks up `name` and checks its dtype and shape: "x: expected f32 (4, 8), got bf16 (4, 8)
// in in.safetensors". An empty `shape` skips the shape check.
StatusOr<Tensor> GetTensor(const SafetensorsFile& file, const std::string& name, DType dtype,
                           const Shape& shape, const std::string& path);

// Writes `bytes` to `path` atomically (temporary name, fsync, rename); shared by the
// checkpoint writer for its JSON files.
Status WriteFileAtomically(const std::string& path, const std::string& bytes);

}  // namespace switchyard
