// `switchyard checkpoint verify DIR [--json]`: checks a checkpoint without building a
// model (train::VerifyCheckpoint): the trainer state's step against its directory, the
// index, the CRC-32 of every file, every tensor's pieces, every value finite, and the values
// of its config.yaml (train::CheckSavedConfig). DIR is a step-* directory or an output
// directory (its latest). One process; exit status 0 when it is sound, 1 with one error
// line naming the damaged file, 2 for bad flags.
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cli/args.h"
#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/train/evaluator.h"

namespace switchyard::cli {
namespace {

constexpr char kCommand[] = "switchyard checkpoint";

constexpr char kSummary[] =
    "usage: switchyard checkpoint verify DIR [--json]\n\n"
    "Checks a checkpoint without building a model: the trainer state's step against its\n"
    "directory, the index, the CRC-32 of every file, every tensor's pieces, every value\n"
    "finite. DIR is a step-* directory or a training output directory (its latest).\n"
    "Checkpoints saved before checksums are checked for everything else (said so).\n";

}  // namespace

int VerifyCheckpointDir(const std::string& command, const std::string& dir, bool json) {
  StatusOr<checkpoint::CheckpointReport> r = checkpoint::VerifyCheckpoint(dir);
  // Its config.yaml too, as every command that reads it checks it (train::CheckSavedConfig).
  const Status config = r.ok() ? train::ReadCheckpointConfig(r->dir).status() : r.status();
  if (!config.ok()) {
    PrintError(command, std::string(config.message()));
    return kExitFailure;
  }
  if (json) {
    nlohmann::ordered_json j;
    j["dir"] = r->dir;
    j["step"] = r->step;
    j["checksums"] = r->checksums;
    j["files"] = r->files;
    j["bytes"] = r->bytes;
    j["tensors"] = r->tensors;
    j["ok"] = true;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s: ok (step %lld, %lld tensors, %s)\n", r->dir.c_str(),
                static_cast<long long>(r->step), static_cast<long long>(r->tensors),
                r->checksums ? StrCat(r->files, " files, ", r->bytes, " bytes, CRC-32 verified").c_str()
                             : "no checksums: saved by an older build, files not verified");
  }
  return kExitOk;
}

int RunCheckpoint(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    if (!args.empty()) {
      std::printf("%s", kSummary);
      return kExitOk;
    }
    return UsageError(kCommand, "expected a subcommand: verify DIR");
  }
  if (args[0] != "verify") {
    return UsageError(kCommand, "unknown subcommand \"" + args[0] + "\"; expected verify DIR");
  }
  std::string dir;
  bool json = false;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--json") {
      if (json) return UsageError(kCommand, "--json is given twice; give it once");
      json = true;
    } else if (args[i] == "--help" || args[i] == "-h") {
      std::printf("%s", kSummary);
      return kExitOk;
    } else if (args[i].rfind("--", 0) == 0) {
      return UsageError(kCommand, "unknown flag " + args[i]);
    } else if (!dir.empty()) {
      return UsageError(kCommand, "one DIR expected, got " + dir + " and " + args[i]);
    } else {
      dir = args[i];
    }
  }
  if (dir.empty()) return UsageError(kCommand, "verify needs a checkpoint directory: verify DIR");
  return VerifyCheckpointDir("switchyard checkpoint verify", dir, json);
}

}  // namespace switchyard::cli
