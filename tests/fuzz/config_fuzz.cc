// config::ParseConfig on arbitrary YAML, and --set overrides (the lines after a line "%%"):
// an error or a config, never a crash or a hang; a config that parses and validates prints
// (ToYaml) to YAML that parses to the same text again.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "tests/fuzz/fuzz_util.h"

using namespace switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string yaml = fuzz::Text(data, size);
  std::vector<std::string> overrides;
  if (const size_t at = yaml.find("\n%%\n"); at != std::string::npos) {
    std::string rest = yaml.substr(at + 4);
    yaml.resize(at + 1);
    for (size_t begin = 0; begin <= rest.size();) {
      const size_t end = std::min(rest.find('\n', begin), rest.size());
      overrides.push_back(rest.substr(begin, end - begin));
      begin = end + 1;
    }
  }
  auto config = config::ParseConfig(yaml, "<fuzz>", overrides);
  if (!config.ok()) return 0;
  for (int world : {1, 2, 8}) (void)config->Validate(world);
  if (!config->ValidateModel().ok() || !config->Validate(1).ok()) return 0;
  const std::string printed = config->ToYaml();
  auto again = config::ParseConfig(printed, "<ToYaml>");
  if (!again.ok()) fuzz::Fail("ToYaml does not parse: " + std::string(again.status().message()) + "\n" + printed);
  if (again->ToYaml() != printed) fuzz::Fail("ToYaml does not round-trip:\n" + printed + "\n---\n" + again->ToYaml());
  return 0;
}
