#include "engine/plan/hardware.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "engine/core/file.h"

namespace switchyard::plan {
namespace {

// The values a key may take: wide enough for any device from a laptop's core to a future
// accelerator, narrow enough that the model's products and quotients stay finite (a bandwidth
// of 1e-300 bytes/s made every step time overflow and print NaN). Rates and shares divide, so
// they have a floor; a latency or F_half near 0 is harmless (the calibrations fit ones that small).
struct Range {
  double lo, hi;
  const char* unit;
};
constexpr Range kFlops{1e6, 1e19, " FLOP/s"};
constexpr Range kBytes{1e6, 1e16, " bytes"};
constexpr Range kBandwidth{1e3, 1e16, " bytes/s"};
constexpr Range kLatency{0, 10, " s"};
constexpr Range kHalfFlops{0, 1e18, " FLOP"};
constexpr Range kShare{1e-6, 1, ": a share of the peak"};
constexpr Range kCount{0, std::numeric_limits<double>::infinity(), ""};  // bounds checked after

// A positive finite number at `node` within `range`, or an error naming `key`.
Status Number(const YAML::Node& node, const std::string& source, const std::string& key,
              Range range, double* out) {
  double v = 0;
  try {
    if (!node.IsScalar()) throw YAML::Exception(YAML::Mark(), "not a scalar");
    v = node.as<double>();
  } catch (const YAML::Exception&) {
    return InvalidArgument(source, ": ", key, ": expected a number");
  }
  if (!(v > 0) || !std::isfinite(v)) {
    return InvalidArgument(source, ": ", key, "=", node.Scalar(), " must be a positive number");
  }
  if (v < range.lo || v > range.hi) {
    return InvalidArgument(source, ": ", key, "=", node.Scalar(), " is out of range (", range.lo,
                           " to ", range.hi, range.unit, ")");
  }
  *out = v;
  return OkStatus();
}

// The keys of a mapping, each read by its setter; unknown and missing keys are errors.
Status ReadMap(const YAML::Node& map, const std::string& source, const std::string& prefix,
               const std::map<std::string, std::function<Status(const YAML::Node&, const std::string&)>>& keys,
               const std::vector<std::string>& optional) {
  if (!map.IsMap()) {
    return InvalidArgument(source, ": ", prefix.empty() ? "the file" : prefix, " must be a mapping");
  }
  std::map<std::string, bool> seen;
  for (const auto& kv : map) {
    const std::string key = kv.first.as<std::string>();
    const std::string name = prefix.empty() ? key : prefix + "." + key;
    auto it = keys.find(key);
    if (it == keys.end()) return InvalidArgument(source, ": unknown key '", name, "'");
    if (seen[key]) return InvalidArgument(source, ": '", name, "' is set twice");
    seen[key] = true;
    SY_RETURN_IF_ERROR(it->second(kv.second, name));
  }
  for (const auto& [key, set] : keys) {
    if (seen[key] || std::find(optional.begin(), optional.end(), key) != optional.end()) continue;
    return InvalidArgument(source, ": missing key '", prefix.empty() ? key : prefix + "." + key, "'");
  }
  return OkStatus();
}

using Setter = std::function<Status(const YAML::Node&, const std::string&)>;

Setter NumberOf(const std::string& source, Range range, double* out) {
  return [source, range, out](const YAML::Node& n, const std::string& key) {
    return Number(n, source, key, range, out);
  };
}

Setter LinkOf(const std::string& source, Link* link) {
  return [source, link](const YAML::Node& n, const std::string& key) {
    return ReadMap(n, source, key,
                   {{"bandwidth", NumberOf(source, kBandwidth, &link->bandwidth)},
                    {"latency", NumberOf(source, kLatency, &link->latency)}},
                   {});
  };
}

Status Apply(Hardware& h, const YAML::Node& root, const std::string& source) {
  double per_node = 0, cores = 0;
  const auto text = [](std::string* out) {
    return [out](const YAML::Node& n, const std::string&) {
      *out = n.IsScalar() ? n.Scalar() : "";
      return OkStatus();
    };
  };
  const std::map<std::string, Setter> keys = {
      {"name", text(&h.name)},
      {"source", text(&h.source)},
      {"peak_flops",
       [&](const YAML::Node& n, const std::string& key) {
         return ReadMap(n, source, key,
                        {{"bf16", NumberOf(source, kFlops, &h.peak_bf16)},
                         {"fp32", NumberOf(source, kFlops, &h.peak_fp32)},
                         {"fp8", NumberOf(source, kFlops, &h.peak_fp8)}},
                        {"fp8"});
       }},
      {"memory_bytes", NumberOf(source, kBytes, &h.memory_bytes)},
      {"memory_bandwidth", NumberOf(source, kBandwidth, &h.memory_bandwidth)},
      {"gpus_per_node", NumberOf(source, kCount, &per_node)},
      {"intra_node", LinkOf(source, &h.intra_node)},
      {"inter_node", LinkOf(source, &h.inter_node)},
      {"gemm",
       [&](const YAML::Node& n, const std::string& key) {
         return ReadMap(n, source, key,
                        {{"efficiency", NumberOf(source, kShare, &h.gemm_efficiency)},
                         {"half_flops", NumberOf(source, kHalfFlops, &h.gemm_half_flops)}},
                        {});
       }},
      {"attention_efficiency", NumberOf(source, kShare, &h.attention_efficiency)},
      {"grouped_gemm_efficiency", NumberOf(source, kShare, &h.grouped_gemm_efficiency)},
      {"elementwise_efficiency", NumberOf(source, kShare, &h.elementwise_efficiency)},
      {"cores_per_node", NumberOf(source, kCount, &cores)},
      {"op_latency", NumberOf(source, kLatency, &h.op_latency)},
      {"graph_op_latency", NumberOf(source, kLatency, &h.graph_op_latency)},
  };
  SY_RETURN_IF_ERROR(ReadMap(root, source, "", keys,
                             {"source", "cores_per_node", "op_latency", "graph_op_latency",
                              "grouped_gemm_efficiency", "elementwise_efficiency"}));
  if (cores != std::floor(cores)) {
    return InvalidArgument(source, ": cores_per_node=", cores, " must be a whole number");
  }
  if (cores > 1 << 20) {
    return InvalidArgument(source, ": cores_per_node=", cores, " is out of range (0 to 1048576)");
  }
  h.cores_per_node = static_cast<int>(cores);
  if (per_node != std::floor(per_node)) {
    return InvalidArgument(source, ": gpus_per_node=", per_node, " must be a whole number");
  }
  if (per_node > 131072) {  // --gpus' bound too: a node of more GPUs than any job has
    return InvalidArgument(source, ": gpus_per_node=", per_node, " is out of range (1 to 131072)");
  }
  h.gpus_per_node = static_cast<int>(per_node);
  return OkStatus();
}

}  // namespace

double Hardware::ComputeShare(int world) const {
  if (cores_per_node <= 0) return 1;
  return double(cores_per_node) / std::max(1, std::min(world, gpus_per_node));
}

double Hardware::Peak(const std::string& precision) const {
  if (precision == "fp32") return peak_fp32;
  if ((precision == "fp8" || precision == "fp8-cs") && peak_fp8 > 0) return peak_fp8;
  return peak_bf16;
}

StatusOr<Hardware> ParseHardware(const std::string& yaml, const std::string& source) {
  Hardware h;
  try {
    const YAML::Node root = YAML::Load(yaml);
    if (!root || root.IsNull()) return InvalidArgument(source, ": the hardware file is empty");
    SY_RETURN_IF_ERROR(Apply(h, root, source));
  } catch (const YAML::Exception& e) {
    return InvalidArgument(source, ":", e.mark.line + 1, ": YAML error: ", e.msg);
  }
  return h;
}

StatusOr<Hardware> LoadHardware(const std::string& name_or_path, const std::string& dir) {
  std::string path = name_or_path;
  const bool bare = name_or_path.find('/') == std::string::npos &&
                    name_or_path.find(".yaml") == std::string::npos;
  if (bare) path = (std::filesystem::path(dir) / (name_or_path + ".yaml")).string();
  if (bare && !std::filesystem::exists(path)) {
    std::vector<std::string> found;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      if (e.path().extension() == ".yaml") found.push_back(e.path().stem().string());
    }
    std::sort(found.begin(), found.end());
    std::string names;
    for (const std::string& n : found) names += (names.empty() ? "" : ", ") + n;
    return InvalidArgument("--gpu ", name_or_path, ": no such hardware (known in ", dir, ": ",
                           names.empty() ? "none" : names, "; or give a YAML file's path)");
  }
  SY_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseHardware(text, path);
}

}  // namespace switchyard::plan
