// `switchyard import --format hf-mixtral`'s reading of config.json (engine/cli/hf_mixtral.h) on
// arbitrary JSON: an error or a config, never a crash or a hang. A config.json it imports must
// give YAML that parses, validates and that Mixtral can express; its export (MixtralConfigJson)
// must import to a config that exports to the same config.json.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/cli/hf_mixtral.h"
#include "engine/config/config.h"
#include "tests/fuzz/fuzz_util.h"

using namespace switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json hf = nlohmann::json::parse(fuzz::Text(data, size), nullptr, false);
  if (hf.is_discarded()) return 0;
  StatusOr<std::string> yaml = cli::ConfigYamlFromMixtral(hf, "config.json");
  if (!yaml.ok() || !cli::CheckMixtralValues(*yaml, "config.json").ok()) return 0;
  StatusOr<config::Config> config = config::ParseConfig(*yaml, "<import>");
  if (!config.ok())
    fuzz::Fail("checked YAML does not parse: " + std::string(config.status().message()));
  (void)cli::CheckSlidingWindow(hf, *config, "config.json");
  if (Status s = cli::CheckMixtralExpressible(*config); !s.ok()) {
    fuzz::Fail("an imported config is not expressible: " + std::string(s.message()) + "\n" + *yaml);
  }
  const nlohmann::ordered_json exported = cli::MixtralConfigJson(*config);
  StatusOr<std::string> again = cli::ConfigYamlFromMixtral(nlohmann::json(exported), "export");
  if (!again.ok())
    fuzz::Fail("the export does not import: " + std::string(again.status().message()));
  StatusOr<config::Config> reread = config::ParseConfig(*again, "<export>");
  if (!reread.ok())
    fuzz::Fail("the export's YAML does not parse: " + std::string(reread.status().message()));
  if (cli::MixtralConfigJson(*reread) != exported) {
    fuzz::Fail("export -> import -> export changed config.json:\n" + exported.dump(1) + "\n---\n" +
               cli::MixtralConfigJson(*reread).dump(1));
  }
  return 0;
}
