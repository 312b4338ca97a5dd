// `switchyard export --format hf-mixtral CHECKPOINT OUT` and `switchyard import --format
// hf-mixtral DIR OUT [--set k=v ...]`: the Hugging Face bridge (docs/hf.md). Export writes
// OUT/config.json and OUT/model.safetensors that transformers' MixtralForCausalLM loads with
// from_pretrained; a config Mixtral cannot express is refused with one line naming the key.
// OUT is written whole or not at all (a temporary sibling renamed into place).
// Import reads such a directory (model.safetensors, or the shards its
// model.safetensors.index.json lists, checked against its weight_map; float32, finite) and
// writes a step-0 checkpoint in OUT (fresh optimizer state), which `switchyard eval`
// evaluates and `switchyard train --resume` continues. Both run on one rank. Exit status:
// 0 ok; 1 unreadable input, a config.json value that is bad or that changes the model in a
// way Switchyard does not compute (one line naming the file and config.json's key), a
// tensor that is not finite, a config export cannot express or an OUT that already holds
// something; 2 bad flags (an empty path, a --set the config refuses, mpirun).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cli/args.h"
#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/cli/hf_mixtral.h"
#include "engine/core/file.h"
#include "engine/core/json_check.h"
#include "engine/core/safetensors.h"
#include "engine/dist/process.h"
#include "engine/model/decoder.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/train/evaluator.h"
#include "engine/train/optimizer.h"

namespace switchyard::cli {
namespace {

namespace fs = std::filesystem;

// Splits "--format X", "--set Y" and positionals; the positionals must be two.
struct Args {
  std::string format, in, out;
  std::vector<std::string> overrides;
  bool help = false;
};

Status ParseArgs(const std::string& command, const std::vector<std::string>& args, bool with_set,
                 const char* summary, Args* a, std::string* usage) {
  const char* in_name = with_set ? "DIR" : "CHECKPOINT";  // import's input, export's
  std::vector<std::string> rest = args, positional, flags_only;
  if (with_set) {
    SY_ASSIGN_OR_RETURN(a->overrides, TakeOverrides(rest));
  }
  FlagSet flags(command, summary);
  flags.AddString("format", &a->format, "hf-mixtral (Hugging Face MixtralForCausalLM)", true);
  std::string unused;
  if (with_set) flags.AddString("set", &unused, "section.key=value on top of the imported config; repeatable");
  *usage = flags.Usage();
  for (size_t i = 0; i < rest.size(); ++i) {
    if (rest[i].rfind("--", 0) == 0 || rest[i] == "-h") {
      flags_only.push_back(rest[i]);
      if (rest[i] == "--format" && i + 1 < rest.size()) flags_only.push_back(rest[++i]);
    } else {
      positional.push_back(rest[i]);
    }
  }
  SY_RETURN_IF_ERROR(flags.Parse(flags_only));
  a->help = flags.help_requested();
  if (a->help) return OkStatus();
  if (a->format != "hf-mixtral") return InvalidArgument("--format=", a->format, " is not one of hf-mixtral");
  if (positional.size() != 2) {
    return InvalidArgument("expected two arguments (input and output), got ", positional.size());
  }
  a->in = positional[0];
  a->out = positional[1];
  // As for a flag naming a path: "" is not the current directory (nor "/config.json").
  if (a->in.empty()) return InvalidArgument(in_name, " is empty; it needs a path");
  if (a->out.empty()) return InvalidArgument("OUT is empty; it needs a path");
  return OkStatus();
}

int Fail(const char* command, const Status& s) {
  PrintError(command, std::string(s.message()));
  return kExitFailure;
}

constexpr char kExport[] = "switchyard export";
constexpr char kImport[] = "switchyard import";

// Writes OUT whole or not at all: into the sibling "<OUT>.tmp-<pid>", renamed into place at
// the end (PublishDirectory, as prep does). A failure (a full disk) removes the temporary
// and leaves OUT as it was, so that a retry is not refused; errors name OUT, not it.
Status WriteExport(const std::string& out, const SafetensorsFile& file, const std::string& config) {
  std::error_code ec;
  // A symlink to an empty directory: the directory it names is replaced, the link kept.
  const fs::path target = fs::is_symlink(out, ec) ? fs::canonical(out, ec) : fs::path(out);
  const fs::path normal = target.lexically_normal();
  const std::string base = (normal.has_filename() ? normal : normal.parent_path()).string();
  const std::string staging = StrCat(base, ".tmp-", ::getpid());
  fs::remove_all(staging, ec);
  const fs::path parent = fs::absolute(base, ec).parent_path();
  fs::create_directories(parent, ec);
  Status s = ec ? FailedPrecondition(out, ": cannot create (", ec.message(), ")") : OkStatus();
  if (s.ok() && !fs::create_directory(staging, ec)) {
    s = FailedPrecondition(out, ": cannot create (", ec.message(), ")");
  }
  if (s.ok()) s = WriteSafetensors(staging + "/model.safetensors", file);
  if (s.ok()) s = WriteFileAtomically(staging + "/config.json", config);
  if (s.ok()) s = PublishDirectory(staging, base);
  if (s.ok()) return s;
  fs::remove_all(staging, ec);
  std::string message(s.message());
  for (size_t at = message.find(staging); at != std::string::npos;
       at = message.find(staging, at + base.size())) {
    message.replace(at, staging.size(), base);
  }
  return Status(s.code(), message);
}

int Export(const std::vector<std::string>& args) {
  Args a;
  std::string usage;
  Status parsed = ParseArgs(kExport, args, false,
                            "Writes a checkpoint as a Hugging Face directory (config.json +\n"
                            "model.safetensors) that MixtralForCausalLM.from_pretrained loads.\n"
                            "In full: switchyard export --format hf-mixtral CHECKPOINT OUT",
                            &a, &usage);
  if (!parsed.ok()) return UsageError(kExport, std::string(parsed.message()));
  if (a.help) {
    std::printf("%s", usage.c_str());
    return kExitOk;
  }
  // Ranks of one job would each write OUT: one process writes it.
  auto world = dist::WorldCommunicator();
  if (world->size() != 1) {
    return Agree(*world, InvalidArgument("runs on one rank (launch it without mpirun)"),
                 kExitUsage, kExport);
  }
  auto cc = train::ReadCheckpointConfig(a.in);
  if (!cc.ok()) return Fail(kExport, cc.status());
  if (Status s = CheckMixtralExpressible(cc->config); !s.ok()) return Fail(kExport, s);
  if (Status s = CheckFreshOutput(a.out); !s.ok()) return Fail(kExport, s);
  auto tensors = checkpoint::ReadWholeTensors(cc->dir, /*optimizer=*/false);
  if (!tensors.ok()) return Fail(kExport, tensors.status());
  SafetensorsFile file;
  file.tensors = ToMixtral(*tensors, cc->config);
  file.metadata["format"] = "pt";  // what transformers requires of a safetensors file
  if (Status s = WriteExport(a.out, file, MixtralConfigJson(cc->config).dump(2) + "\n"); !s.ok()) {
    return Fail(kExport, s);
  }
  std::printf("exported %s to %s: %zu tensors, MixtralForCausalLM\n", cc->dir.c_str(),
              a.out.c_str(), file.tensors.size());
  return kExitOk;
}

}  // namespace

int RunExport(const std::vector<std::string>& args) { return RunInProcess(kExport, Export, args); }

namespace {

// A NaN or Inf in an imported tensor: every reader of the checkpoint would refuse it
// (checkpoint verify, eval, train --resume), so import refuses it, naming it (exit 1).
Status CheckFinite(const SafetensorsFile& file, const std::string& path) {
  for (const auto& [name, t] : file.tensors) {
    if (t.dtype() != DType::kF32) continue;  // FromMixtral refuses it by name
    const float* v = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (!std::isfinite(v[i])) {
        return DataLoss(path, ": tensor '", name, "' holds a non-finite value (", v[i],
                        " at flat index ", i, " of ", ShapeString(t.shape()), ")");
      }
    }
  }
  return OkStatus();
}

// The weight_map of a sharded directory's index (tensor -> shard file name) and its
// metadata.total_size (-1: absent).
StatusOr<std::map<std::string, std::string>> ReadWeightMap(const std::string& index,
                                                           int64_t* total_size) {
  SY_ASSIGN_OR_RETURN(std::string text, ReadFile(index));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return DataLoss(index, ": not JSON (", JsonSyntaxError(text), ")");
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    return DataLoss(index, ": not a safetensors index (no weight_map)");
  }
  if (const std::vector<std::string> twice = DuplicateJsonKey(text); !twice.empty()) {
    return DataLoss(index, ": '", twice.back(), "' is set twice");
  }
  std::map<std::string, std::string> out;
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    const std::string name = file.is_string() ? file.get<std::string>() : "";
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
      return DataLoss(index, ": weight_map maps '", tensor, "' to ", file.dump().substr(0, 80),
                      ", not the name of a file beside it");
    }
    out[tensor] = name;
  }
  if (out.empty()) return DataLoss(index, ": weight_map is empty");
  const nlohmann::json metadata = j.value("metadata", nlohmann::json::object());
  if (!metadata.is_object()) return DataLoss(index, ": metadata is not an object");
  if (metadata.contains("total_size")) {
    if (!metadata["total_size"].is_number_unsigned()) {
      return DataLoss(index, ": metadata.total_size is ", metadata["total_size"].dump().substr(0, 80),
                      ", not a byte count");
    }
    *total_size = metadata["total_size"].get<int64_t>();
  }
  return out;
}

// Every tensor of an HF directory: model.safetensors, or the shards its index lists, each
// holding exactly the tensors the weight_map puts there, total_size their bytes. Every
// value finite.
StatusOr<std::map<std::string, Tensor>> ReadHfTensors(const std::string& dir) {
  const std::string index = dir + "/model.safetensors.index.json";
  std::error_code ec;
  if (!fs::exists(index, ec)) {
    const std::string path = dir + "/model.safetensors";
    SY_ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(path));
    SY_RETURN_IF_ERROR(CheckFinite(file, path));
    return std::move(file.tensors);
  }
  int64_t total_size = -1;
  SY_ASSIGN_OR_RETURN(const auto weight_map, ReadWeightMap(index, &total_size));
  std::map<std::string, std::vector<std::string>> by_file;
  for (const auto& [tensor, file] : weight_map) by_file[file].push_back(tensor);
  std::map<std::string, Tensor> all;
  uint64_t bytes = 0;
  for (const auto& [file, names] : by_file) {
    const std::string path = dir + "/" + file;
    SY_ASSIGN_OR_RETURN(SafetensorsFile shard, ReadSafetensors(path));
    for (const std::string& name : names) {
      if (!shard.tensors.count(name)) {
        return DataLoss(index, ": weight_map puts '", name, "' in ", file, ", which does not hold it");
      }
    }
    for (auto& [name, t] : shard.tensors) {
      const std::string& mapped = weight_map.count(name) ? weight_map.at(name) : "";
      if (mapped != file) {
        return DataLoss(path, ": holds '", name, "', which ", index, "'s weight_map ",
                        mapped.empty() ? "does not list" : "puts in " + mapped);
      }
      bytes += t.nbytes();
      all[name] = t;
    }
    SY_RETURN_IF_ERROR(CheckFinite(shard, path));
  }
  if (total_size >= 0 && static_cast<uint64_t>(total_size) != bytes) {
    return DataLoss(index, ": metadata.total_size is ", total_size, " but the tensors of its ",
                    "weight_map hold ", bytes, " bytes");
  }
  return all;
}

// What an imported config must pass: the config's own checks and Mixtral's.
Status CheckImported(const config::Config& c) {
  Status valid = c.Validate();
  if (valid.ok()) valid = c.ValidateModel();
  if (valid.ok()) valid = CheckMixtralExpressible(c);
  return valid;
}

int Import(const std::vector<std::string>& args) {
  Args a;
  std::string usage;
  Status parsed = ParseArgs(kImport, args, true,
                            "Reads a Hugging Face MixtralForCausalLM directory (config.json + float32\n"
                            "safetensors) and writes a Switchyard checkpoint of step 0 in OUT.\n"
                            "In full: switchyard import --format hf-mixtral DIR OUT [--set k=v ...]",
                            &a, &usage);
  if (!parsed.ok()) return UsageError(kImport, std::string(parsed.message()));
  if (a.help) {
    std::printf("%s", usage.c_str());
    return kExitOk;
  }
  auto world = dist::WorldCommunicator();
  if (world->size() != 1) {
    return Agree(*world, InvalidArgument("runs on one rank (launch it without mpirun)"),
                 kExitUsage, kImport);
  }
  const std::string source = a.in + "/config.json";
  auto text = ReadFile(source);
  if (!text.ok()) return Fail(kImport, text.status());
  nlohmann::json hf = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (hf.is_discarded()) {
    return Fail(kImport, InvalidArgument(source, ": not JSON (", JsonSyntaxError(*text), ")"));
  }
  if (!hf.is_object()) return Fail(kImport, InvalidArgument(source, ": not a JSON object"));
  // config.json's values (exit 1, naming its keys), then the --set flags on top (exit 2).
  auto yaml = ConfigYamlFromMixtral(hf, source);
  if (!yaml.ok()) return Fail(kImport, yaml.status());
  if (Status s = CheckMixtralValues(*yaml, source); !s.ok()) return Fail(kImport, s);
  // config.json alone first: what it gets wrong is the file's fault (exit 1), not the
  // --set flags' (exit 2). The layout is the saved config's, for the runs that load it (under
  // any layout); the import itself writes from one rank.
  auto from_file = config::ParseConfig(*yaml, source);
  if (!from_file.ok()) return Fail(kImport, from_file.status());
  if (Status s = CheckImported(*from_file); !s.ok()) {
    return Fail(kImport, InvalidArgument(source, ": ", s.message()));
  }
  auto config = config::ParseConfig(*yaml, source, a.overrides);
  if (!config.ok()) return UsageError(kImport, std::string(config.status().message()));
  if (Status s = CheckImported(*config); !s.ok()) return UsageError(kImport, std::string(s.message()));
  if (Status s = CheckSlidingWindow(hf, *config, source); !s.ok()) return Fail(kImport, s);
  if (Status s = CheckFreshOutput(a.out); !s.ok()) return Fail(kImport, s);
  auto hf_tensors = ReadHfTensors(a.in);
  if (!hf_tensors.ok()) return Fail(kImport, hf_tensors.status());
  auto ours = FromMixtral(*hf_tensors, *config, a.in);
  if (!ours.ok()) return Fail(kImport, ours.status());
  auto decoder = model::Decoder::Create(config->model, config->moe, config->train.seed, world.get());
  if (!decoder.ok()) return Fail(kImport, decoder.status());
  parallel::ParameterRegistry& reg = (*decoder)->registry();
  for (parallel::Parameter& p : reg.params()) {
    auto it = ours->find(p.name);
    SY_CHECK(it != ours->end()) << "the Mixtral mapping lacks " << p.name;
    p.value.CopyFrom(it->second);
  }
  SY_CHECK_EQ(reg.params().size(), ours->size()) << "parameters vs mapped tensors";
  train::Optimizer optimizer(reg, train::OptimizerOptionsFor(config->train));
  auto mesh = dist::Mesh::Create(1, dist::MeshSizes{}, config->parallel.order);
  if (!mesh.ok()) return Fail(kImport, mesh.status());
  nlohmann::json state{{"step", 0}, {"imported_from", a.in}};
  checkpoint::CheckpointContents contents{.params = &reg, .optimizer_state = optimizer.State(),
                                     .trainer_state_json = state.dump(),
                                     .config_yaml = config->ToYaml()};
  if (Status s = checkpoint::SaveCheckpoint(a.out, 0, contents, *world, *mesh); !s.ok()) return Fail(kImport, s);
  std::printf("imported %s into %s/%s: %zu tensors (evaluate with: switchyard eval --checkpoint %s "
              "--data DIR)\n",
              a.in.c_str(), a.out.c_str(), checkpoint::StepDirName(0).c_str(), ours->size(), a.out.c_str());
  return kExitOk;
}

}  // namespace

int RunImport(const std::vector<std::string>& args) { return RunInProcess(kImport, Import, args); }

}  // namespace switchyard::cli
