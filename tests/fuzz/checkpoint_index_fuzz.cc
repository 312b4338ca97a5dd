// checkpoint::ParseIndex (model.safetensors.index.json) on arbitrary text, formats 1 and 2:
// an error or an index, never a crash.
#include <cstdint>

#include "engine/checkpoint/index.h"
#include "tests/fuzz/fuzz_util.h"

using namespace switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = fuzz::Text(data, size);
  for (int version : {1, 2}) (void)checkpoint::ParseIndex(text, "index.json", version);
  return 0;
}
