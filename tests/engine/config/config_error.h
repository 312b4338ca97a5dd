// config_test's and config_limits_test's check: the one error a config (and overrides)
// gives when parsed and validated for 8 ranks, or "" when it is accepted.
#pragma once

#include <string>
#include <vector>

#include "engine/config/config.h"

namespace switchyard::train {

inline std::string Error(const std::string& yaml, std::vector<std::string> overrides = {}) {
  auto c = config::ParseConfig(yaml, "x.yaml", overrides);
  if (!c.ok()) return std::string(c.status().message());
  Status s = c->Validate(8);
  return s.ok() ? "" : std::string(s.message());
}

}  // namespace switchyard::train
