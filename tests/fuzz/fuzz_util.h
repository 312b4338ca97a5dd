// Shared by the fuzz targets (tests/fuzz/README.md): the input as text, or as a file.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace switchyard::fuzz {

inline std::string Text(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// The input written to one file of this process (under $TMPDIR or /tmp), whose path is
// returned; the next call overwrites it.
inline const std::string& AsFile(const uint8_t* data, size_t size, const char* name) {
  static const std::string path = [name] {
    const char* tmp = std::getenv("TMPDIR");
    return std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/sy-fuzz-" +
           std::to_string(getpid()) + "-" + name;
  }();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) std::abort();
  return path;
}

// A property the target checks failed: print it and abort, so the fuzzer keeps the input.
[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz property failed: %s\n", what.c_str());
  std::abort();
}

}  // namespace switchyard::fuzz
