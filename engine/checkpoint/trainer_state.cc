// trainer_state.json written and read; see trainer_state.h.
#include "engine/checkpoint/trainer_state.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include <nlohmann/json.hpp>

#include "engine/core/file.h"
#include "engine/core/json_check.h"

#ifndef SWITCHYARD_VERSION
#define SWITCHYARD_VERSION "0.1.0"
#endif

namespace switchyard::checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Keys of trainer_state.json that the checkpoint owns.
constexpr const char* kReservedKeys[] = {"format", "format_version", "switchyard_version",
                                         "layout"};

// The mesh's sizes and axis order ("layout").
json LayoutJson(const dist::Mesh& mesh) {
  return {{"world", mesh.world()}, {"tp", mesh.tp()},   {"cp", mesh.cp()},
          {"ep", mesh.ep()},       {"etp", mesh.etp()}, {"pp", mesh.pp()},
          {"dp", mesh.dp()},       {"edp", mesh.edp()}, {"order", mesh.OrderString()}};
}

// The most ranks a saved layout may name: 2^17, as `--world` (above the largest jobs).
constexpr int64_t kMaxRanks = int64_t{1} << 17;
// The largest step or micro-batch count a data position may name: 2^53, the largest count
// engine/config lets a run form.
constexpr int64_t kMaxCount = int64_t{1} << 53;

// `key` of object j as an integer in [lo, hi] into *out (absent: *out unchanged), or an
// error naming the file and the field ("layout.world=0 must be an integer in [1, 131072]").
Status ReadInt(const json& j, const char* section, const char* key, int64_t lo, int64_t hi,
               const std::string& path, int64_t* out) {
  if (!j.contains(key)) return OkStatus();
  const json& v = j[key];
  // An unsigned value above 2^63 would wrap in get<int64_t>: compared unsigned first.
  const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(hi) &&
                                                 v.get<int64_t>() >= lo
                                           : v.is_number_integer() && v.get<int64_t>() >= lo &&
                                                 v.get<int64_t>() <= hi;
  if (!fits) {
    return DataLoss(path, ": ", section, ".", key, "=", v.dump().substr(0, 40),
                    " must be an integer in [", lo, ", ", hi, "]");
  }
  *out = v.get<int64_t>();
  return OkStatus();
}

// "layout": every size in [1, 2^17] and both views of the world complete (tp * cp * pp * dp
// and etp * ep * pp * edp are the world), into *l.
Status ReadLayout(const json& j, const std::string& path, SavedLayout* l) {
  if (!j.contains("layout")) return OkStatus();
  const json& layout = j["layout"];
  if (!layout.is_object()) {
    return DataLoss(path, ": layout is ", layout.dump().substr(0, 40), ", not an object");
  }
  for (auto [key, field] : {std::pair{"world", &l->world}, {"tp", &l->tp}, {"cp", &l->cp},
                            {"ep", &l->ep}, {"etp", &l->etp}, {"pp", &l->pp}, {"dp", &l->dp},
                            {"edp", &l->edp}}) {
    int64_t v = *field;
    SY_RETURN_IF_ERROR(ReadInt(layout, "layout", key, 1, kMaxRanks, path, &v));
    *field = static_cast<int>(v);
  }
  const int64_t dense = int64_t{l->tp} * l->cp * l->pp * l->dp;
  const int64_t expert = int64_t{l->etp} * l->ep * l->pp * l->edp;
  if (dense != l->world || expert != l->world) {
    return DataLoss(path, ": layout.world=", l->world, " but tp ", l->tp, " x cp ", l->cp, " x pp ",
                    l->pp, " x dp ", l->dp, " = ", dense, " and etp ", l->etp, " x ep ", l->ep,
                    " x pp ", l->pp, " x edp ", l->edp, " = ", expert, " (both must be the world)");
  }
  l->order = layout.contains("order") && layout["order"].is_string()
                 ? layout["order"].get<std::string>()
                 : "";
  return OkStatus();
}

// "data_position" (written by training; absent in imported checkpoints): next_step is the
// saved step, micro_batches_per_step in [1, 2^53].
Status CheckDataPosition(const json& j, const std::string& path, int64_t step) {
  if (!j.contains("data_position")) return OkStatus();
  const json& d = j["data_position"];
  if (!d.is_object()) {
    return DataLoss(path, ": data_position is ", d.dump().substr(0, 40), ", not an object");
  }
  int64_t next = step, per_step = 1;
  SY_RETURN_IF_ERROR(ReadInt(d, "data_position", "next_step", 0, kMaxCount, path, &next));
  SY_RETURN_IF_ERROR(ReadInt(d, "data_position", "micro_batches_per_step", 1, kMaxCount,
                             path, &per_step));
  if (next != step) {
    return DataLoss(path, ": data_position.next_step=", next, " but the checkpoint is of step ",
                    step, " (they must agree)");
  }
  return OkStatus();
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
  j["format"] = kCheckpointFormat;
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
  if (j.is_discarded()) {
    return DataLoss(path, ": not JSON (", JsonSyntaxError(out.trainer_state_json), ")");
  }
  if (!j.is_object() || !j.contains("format") || j["format"] != kCheckpointFormat ||
      !j.contains("format_version") || !j["format_version"].is_number_integer() ||
      !j.contains("step") || !j["step"].is_number_integer()) {
    return DataLoss(path, ": not a Switchyard trainer state (needs \"format\": \"",
                    kCheckpointFormat, "\", \"format_version\" and \"step\")");
  }
  const int64_t v = j["format_version"].get<int64_t>();
  if (v < 1) {
    return DataLoss(path, ": format_version ", v, " is not a format version (1 to ",
                    kCheckpointFormatVersion, ")");
  }
  *version = static_cast<int>(std::min<int64_t>(v, kCheckpointFormatVersion + 1));
  if (v > kCheckpointFormatVersion) {
    const json saver = j.contains("switchyard_version") ? j["switchyard_version"] : json("?");
    return FailedPrecondition(path, ": format version ", v, " (Switchyard ",
                              saver.is_string() ? saver.get<std::string>() : saver.dump(),
                              "); this build reads up to ", kCheckpointFormatVersion);
  }
  out.step = j["step"].get<int64_t>();
  SY_RETURN_IF_ERROR(ReadLayout(j, path, &out.layout));
  SY_RETURN_IF_ERROR(CheckDataPosition(j, path, out.step));
  const std::string config = (fs::path(dir) / kConfigFile).string();
  if (!fs::exists(config))
    return FailedPrecondition(dir, ": incomplete checkpoint (no ", kConfigFile, ")");
  SY_ASSIGN_OR_RETURN(out.config_yaml, ReadFile(config));
  return out;
}

}  // namespace switchyard::checkpoint
