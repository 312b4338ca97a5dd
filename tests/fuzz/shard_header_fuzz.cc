// data::ParseShardHeader and ReadShard on arbitrary bytes: an error or a header whose token
// count fits the bytes, never a crash.
#include <cstdint>

#include "engine/data/shards.h"
#include "tests/fuzz/fuzz_util.h"

using namespace switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)data::ParseShardHeader("train-00000.bin", data, size);
  const std::string& path = fuzz::AsFile(data, size, "train-00000.bin");
  (void)data::ReadShard(path);
  return 0;
}
