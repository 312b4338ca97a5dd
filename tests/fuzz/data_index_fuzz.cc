// data::ParseIndex (a prepared corpus's index.json) on arbitrary text: an error or an index
// that prints (IndexToJson) to text that parses to the same bytes again.
#include <cstdint>

#include "engine/data/index.h"
#include "tests/fuzz/fuzz_util.h"

using namespace switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto index = data::ParseIndex(fuzz::Text(data, size), "index.json");
  if (!index.ok()) return 0;
  const std::string json = data::IndexToJson(*index);
  auto again = data::ParseIndex(json, "index.json");
  if (!again.ok()) fuzz::Fail("IndexToJson does not parse: " + std::string(again.status().message()));
  if (data::IndexToJson(*again) != json) fuzz::Fail("IndexToJson does not round-trip");
  return 0;
}
