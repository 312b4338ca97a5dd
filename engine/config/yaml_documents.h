// The documents of a YAML stream (internal to engine/config): what YAML::LoadAll would say
// of them (whether each holds more than a null, where it starts) without building them, and
// without LoadAll's loop, which in yaml-cpp 0.7 (Debian 12's) never ends on a document that
// starts with a flow indicator: "a: 1\n---\n," has the parser report the same null document
// at the same place forever, each one kept (yaml-cpp issue 1040, fixed upstream in 2024).
// `switchyard train --config` on such a file grew to gigabytes; tests/fuzz/config_fuzz found it.
#pragma once

#include <string>
#include <vector>

#include <yaml-cpp/mark.h>

#include "engine/core/status.h"

namespace switchyard::config {

struct YamlDocument {
  bool null = true;  // nothing but a null (an empty document, "~")
  YAML::Mark mark;   // where its content starts (its first event)
};

// The documents of `yaml` in order, or one InvalidArgument naming `source` and the line: the
// parser's syntax error, or "unexpected ',' where a value starts" where yaml-cpp 0.7 would
// loop (a null document reported twice at the same place).
StatusOr<std::vector<YamlDocument>> ScanYamlDocuments(const std::string& yaml,
                                                      const std::string& source);

}  // namespace switchyard::config
