// `switchyard export --format hf-mixtral CHECKPOINT OUT` and `switchyard import --format
// hf-mixtral DIR OUT [--set k=v ...]`: the Hugging Face bridge (docs/hf.md). Export writes
// OUT/config.json and OUT/model.safetensors that transformers' MixtralForCausalLM loads with
// from_pretrained; a config Mixtral cannot express is refused with one line naming the key.
// Import reads such a directory (model.safetensors, or the shards its
// model.safetensors.index.json lists; float32) and writes a step-0 checkpoint in OUT (fresh
// optimizer state), which `switchyard eval` evaluates and `switchyard train --resume`
// continues. Exit status: 0 ok; 1 unreadable input, a config.json value that is bad or that
// changes the model in a way Switchyard does not compute (one line naming the file and
// config.json's key), a config export cannot express or an OUT that already holds
// something; 2 bad flags (a --set the config refuses).
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cli/args.h"
#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/cli/hf_mixtral.h"
#include "engine/core/file.h"
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
  return OkStatus();
}

int Fail(const char* command, const Status& s) {
  PrintError(command, std::string(s.message()));
  return kExitFailure;
}

constexpr char kExport[] = "switchyard export";
constexpr char kImport[] = "switchyard import";

}  // namespace

int RunExport(const std::vector<std::string>& args) {
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
  auto cc = train::ReadCheckpointConfig(a.in);
  if (!cc.ok()) return Fail(kExport, cc.status());
  if (Status s = CheckMixtralExpressible(cc->config); !s.ok()) return Fail(kExport, s);
  if (Status s = CheckFreshOutput(a.out); !s.ok()) return Fail(kExport, s);
  auto tensors = checkpoint::ReadWholeTensors(cc->dir, /*optimizer=*/false);
  if (!tensors.ok()) return Fail(kExport, tensors.status());
  SafetensorsFile file;
  file.tensors = ToMixtral(*tensors, cc->config);
  file.metadata["format"] = "pt";  // what transformers requires of a safetensors file
  std::error_code ec;
  fs::create_directories(a.out, ec);
  if (ec) return Fail(kExport, FailedPrecondition(a.out, ": cannot create (", ec.message(), ")"));
  if (Status s = WriteSafetensors(a.out + "/model.safetensors", file); !s.ok()) return Fail(kExport, s);
  if (Status s = WriteFileAtomically(a.out + "/config.json", MixtralConfigJson(cc->config).dump(2) + "\n");
      !s.ok()) {
    return Fail(kExport, s);
  }
  std::printf("exported %s to %s: %zu tensors, MixtralForCausalLM\n", cc->dir.c_str(),
              a.out.c_str(), file.tensors.size());
  return kExitOk;
}

namespace {

// Every tensor of an HF directory: model.safetensors, or the files of its index.
StatusOr<std::map<std::string, Tensor>> ReadHfTensors(const std::string& dir) {
  std::vector<std::string> files;
  const std::string index = dir + "/model.safetensors.index.json";
  if (fs::exists(index)) {
    SY_ASSIGN_OR_RETURN(std::string text, ReadFile(index));
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      return InvalidArgument(index, ": not a safetensors index (no weight_map)");
    }
    std::set<std::string> names;
    for (const auto& [tensor, file] : j["weight_map"].items()) names.insert(file.get<std::string>());
    for (const std::string& f : names) files.push_back(dir + "/" + f);
  } else {
    files.push_back(dir + "/model.safetensors");
  }
  std::map<std::string, Tensor> all;
  for (const std::string& f : files) {
    SY_ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(f));
    for (auto& [name, t] : file.tensors) all[name] = t;
  }
  return all;
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
  if (world->size() != 1) return UsageError(kImport, "runs on one rank (launch it without mpirun)");
  const std::string source = a.in + "/config.json";
  auto text = ReadFile(source);
  if (!text.ok()) return Fail(kImport, text.status());
  nlohmann::json hf = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (hf.is_discarded() || !hf.is_object()) return Fail(kImport, InvalidArgument(source, ": not a JSON object"));
  // config.json's values (exit 1, naming its keys), then the --set flags on top (exit 2).
  auto yaml = ConfigYamlFromMixtral(hf, source);
  if (!yaml.ok()) return Fail(kImport, yaml.status());
  if (Status s = CheckMixtralValues(*yaml, source); !s.ok()) return Fail(kImport, s);
  auto config = config::ParseConfig(*yaml, source, a.overrides);
  if (!config.ok()) return UsageError(kImport, std::string(config.status().message()));
  Status valid = config->Validate(1);
  if (valid.ok()) valid = config->ValidateModel();
  if (valid.ok()) valid = CheckMixtralExpressible(*config);
  if (!valid.ok()) return UsageError(kImport, std::string(valid.message()));
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
  auto mesh = dist::Mesh::Create(1, config->parallel.MeshSizes(), config->parallel.order);
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
