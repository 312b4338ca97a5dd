// A safetensors file of arbitrary bytes: ReadSafetensors and SafetensorsReader::Open give an
// error or a file whose every tensor reads back, never a crash or a read outside the file.
#include <cstdint>
#include <vector>

#include "engine/core/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

using namespace switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz::AsFile(data, size, "in.safetensors");
  (void)ReadSafetensors(path);
  auto reader = SafetensorsReader::Open(path);
  if (!reader.ok()) return 0;
  for (const auto& [name, entry] : reader->header().tensors) {
    const uint64_t n = entry.end - entry.begin;
    if (n > (uint64_t{1} << 24)) continue;
    std::vector<unsigned char> bytes(n);
    const Status s = reader->Read(entry, 0, n, bytes.data());
    if (!s.ok()) fuzz::Fail(name + ": a checked entry does not read: " + std::string(s.message()));
  }
  return 0;
}
