// trainer_state.json written and read; see trainer_state.h.
#include "engine/checkpoint/trainer_state.h"

#include <filesystem>
#include <utility>

#include <nlohmann/json.hpp>

#include "engine/core/file.h"

#ifndef SWITCHYARD_VERSION
#define SWITCHYARD_VERSION "0.1.0"
#endif

namespace switchyard::checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kFormat = "switchyard-checkpoint";
// Keys of trainer_state.json that the checkpoint owns.
constexpr const char* kReservedKeys[] = {"format", "format_version", "switchyard_version",
                                         "layout"};

// The mesh's sizes and axis order ("layout").
json LayoutJson(const dist::Mesh& mesh) {
  return {{"world", mesh.world()}, {"tp", mesh.tp()},   {"cp", mesh.cp()},
          {"ep", mesh.ep()},       {"etp", mesh.etp()}, {"pp", mesh.pp()},
          {"dp", mesh.dp()},       {"edp", mesh.edp()}, {"order", mesh.OrderString()}};
}

}  // namespace

StatusOr<std::string> TrainerStateText(const std::string& trainer_json, int64_t step,
                                       const dist::Mesh& mesh) {
  json j = trainer_json.empty() ? json::object()
                                : json::parse(trainer_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument("checkpoint: trainer_state_json is not a JSON object: '",
                           trainer_json.substr(0, 80), "'");
  }
  for (const char* key : kReservedKeys) {
    if (j.contains(key)) {
      return InvalidArgument("checkpoint: trainer_state_json sets '", key,
                             "', which the checkpoint writes itself");
    }
  }
  if (j.contains("step") && j["step"] != json(step)) {
    return InvalidArgument("checkpoint: trainer_state_json has step ", j["step"].dump(),
                           " but step ", step, " is being saved");
  }
  j["format"] = kFormat;
  j["format_version"] = kCheckpointFormatVersion;
  j["switchyard_version"] = SWITCHYARD_VERSION;
  j["step"] = step;
  j["layout"] = LayoutJson(mesh);
  return j.dump(2) + "\n";
}

StatusOr<LoadedCheckpoint> ReadTrainerState(const std::string& dir, int* version) {
  const std::string path = (fs::path(dir) / kTrainerStateFile).string();
  if (!fs::exists(path)) {
    return FailedPrecondition(dir, ": incomplete checkpoint (no ", kTrainerStateFile, ")");
  }
  LoadedCheckpoint out;
  out.dir = dir;
  SY_ASSIGN_OR_RETURN(out.trainer_state_json, ReadFile(path));
  json j = json::parse(out.trainer_state_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("format") || j["format"] != kFormat ||
      !j.contains("format_version") || !j["format_version"].is_number_integer() ||
      !j.contains("step") || !j["step"].is_number_integer()) {
    return DataLoss(path, ": not a Switchyard trainer state (needs \"format\": \"", kFormat,
                    "\", \"format_version\" and \"step\")");
  }
  *version = j["format_version"].get<int>();
  if (*version > kCheckpointFormatVersion) {
    const json saver = j.contains("switchyard_version") ? j["switchyard_version"] : json("?");
    return FailedPrecondition(path, ": format version ", *version, " (Switchyard ",
                              saver.is_string() ? saver.get<std::string>() : saver.dump(),
                              "); this build reads up to ", kCheckpointFormatVersion);
  }
  out.step = j["step"].get<int64_t>();
  const json layout = j.contains("layout") && j["layout"].is_object() ? j["layout"] : json::object();
  SavedLayout& l = out.layout;
  for (auto [key, field] : {std::pair{"world", &l.world},
                            {"tp", &l.tp},
                            {"cp", &l.cp},
                            {"ep", &l.ep},
                            {"etp", &l.etp},
                            {"pp", &l.pp},
                            {"dp", &l.dp},
                            {"edp", &l.edp}}) {
    if (layout.contains(key) && layout[key].is_number_integer()) *field = layout[key].get<int>();
  }
  l.order = layout.contains("order") && layout["order"].is_string() ? layout["order"].get<std::string>()
                                                                      : "";
  const std::string config = (fs::path(dir) / kConfigFile).string();
  if (!fs::exists(config))
    return FailedPrecondition(dir, ": incomplete checkpoint (no ", kConfigFile, ")");
  SY_ASSIGN_OR_RETURN(out.config_yaml, ReadFile(config));
  return out;
}

}  // namespace switchyard::checkpoint
