// `switchyard upcycle --checkpoint DIR --out DIR [--set k=v ...]`: sparse upcycling
// (Komatsuzaki et al., ICLR 2023; Megatron-Core's --moe-use-upcycling). A trained model's
// checkpoint becomes the step-0 checkpoint of a Mixture-of-Experts model of the same shape:
// the checkpoint's config with the `--set` overrides (the moe.* keys: which layers are MoE,
// how many experts, top-k, capacity, the losses). In every layer that is MoE in the new
// config and dense in the checkpoint, each routed expert starts as a copy of the layer's
// MLP (w1, w2, w3 and the biases); its router is initialised as a fresh model's (the
// config's train.seed). Every other tensor is copied unchanged, and the optimizer state
// is fresh. docs/upcycling.md.
//
// The new config must keep the model section (model.* cannot be set) and give the experts
// the MLP's shape: moe.d_expert, moe.activation and moe.bias default to the model's d_ff
// (model.d_ff, or 4 x d_model), activation and bias, and anything else is refused. Shared
// experts are refused (a copy of the MLP beside the routed copies would double the layer).
// Every tensor of the checkpoint must find its place in the new model; a layer that is
// MoE in the checkpoint stays as it is when its shape is the new config's.
//
// Exit status: 0 ok, 1 an unreadable checkpoint, a tensor with no place, or an OUT that
// already holds something, 2 bad flags or config (no layer upcycled among them); nothing
// is written on an error.
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/checkpoint/checkpoint.h"
#include "engine/cli/args.h"
#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/dist/process.h"
#include "engine/model/decoder.h"
#include "engine/train/evaluator.h"
#include "engine/train/optimizer.h"

namespace switchyard::cli {
namespace {


constexpr char kCommand[] = "switchyard upcycle";

struct Flags {
  std::string checkpoint, out;
  std::vector<std::string> overrides;
  bool help = false;
  std::string usage;
};

Status ParseFlags(const std::vector<std::string>& args, Flags* f) {
  std::vector<std::string> rest = args;
  SY_ASSIGN_OR_RETURN(f->overrides, TakeOverrides(rest));
  FlagSet flags(kCommand,
                "Sparse upcycling: writes a step-0 checkpoint of a Mixture-of-Experts model\n"
                "whose routed experts start as copies of a trained checkpoint's MLPs (the\n"
                "routers fresh, every other tensor copied, fresh optimizer state). The new\n"
                "model is the checkpoint's config with the --set overrides (moe.* keys).");
  flags.AddPath("checkpoint", &f->checkpoint,
                "a step-* checkpoint directory, or a training output directory (its latest)", true);
  flags.AddPath("out", &f->out, "a new (or empty) directory for the upcycled checkpoint", true);
  std::string unused;
  flags.AddString("set", &unused,
                  "section.key=value on top of the checkpoint's config (moe.num_experts=8, "
                  "moe.top_k=2, ...); repeatable");
  f->usage = flags.Usage();
  SY_RETURN_IF_ERROR(flags.Parse(rest));
  f->help = flags.help_requested();
  return OkStatus();
}

// The upcycled model's config: the checkpoint's, its experts shaped as its MLP unless the
// user says otherwise, then the user's overrides. Refuses model.* overrides and experts
// that are not the MLP's shape.
StatusOr<config::Config> UpcycledConfig(const std::string& checkpoint,
                                        const std::vector<std::string>& overrides,
                                        const config::Config& dense) {
  for (const std::string& o : overrides) {
    if (o.rfind("model.", 0) == 0) {
      return InvalidArgument("--set ", o, ": upcycling keeps the checkpoint's model section; "
                             "only the other sections (moe.*, train.*, ...) can be set");
    }
  }
  const model::ModelConfig& m = dense.model;
  std::vector<std::string> all = {
      StrCat("moe.d_expert=", m.ff_hidden()),
      StrCat("moe.activation=", dense::ActivationName(m.activation)),
      StrCat("moe.bias=", m.bias ? "true" : "false")};
  all.insert(all.end(), overrides.begin(), overrides.end());
  SY_ASSIGN_OR_RETURN(train::CheckpointConfig cc, train::ReadCheckpointConfig(checkpoint, all));
  const moe::MoEConfig& e = cc.config.moe;
  if (e.d_expert != m.ff_hidden()) {
    return InvalidArgument("moe.d_expert=", e.d_expert, ": an upcycled expert is a copy of the "
                           "MLP, whose hidden width is ", m.ff_hidden());
  }
  if (e.activation != m.activation) {
    return InvalidArgument("moe.activation=", dense::ActivationName(e.activation),
                           ": an upcycled expert is a copy of the MLP, whose activation is ",
                           dense::ActivationName(m.activation));
  }
  if (e.bias != m.bias) {
    return InvalidArgument("moe.bias=", e.bias ? "true" : "false",
                           ": an upcycled expert is a copy of the MLP, which has ",
                           m.bias ? "biases" : "no biases");
  }
  if (e.num_shared_experts > 0) {
    return InvalidArgument("moe.num_shared_experts=", e.num_shared_experts,
                           ": upcycling copies the MLP into the routed experts; a shared copy "
                           "beside them would double the layer's output");
  }
  // The layout the checkpoint was trained under stays in the config (resume under it, or
  // any other); it is checked against its own smallest world, not this one process.
  SY_RETURN_IF_ERROR(cc.config.Validate(static_cast<int>(cc.config.parallel.SmallestWorld())));
  SY_RETURN_IF_ERROR(cc.config.ValidateModel());
  return cc.config;
}

// For an expert tensor "layers.{i}.moe.experts.X" of an upcycled layer, the MLP tensor it
// copies ("" for any other name).
std::string MlpSource(const std::string& name) {
  static const std::map<std::string, std::string> kSuffix = {
      {".moe.experts.w1", ".mlp.w1.weight"}, {".moe.experts.w2", ".mlp.w2.weight"},
      {".moe.experts.w3", ".mlp.w3.weight"}, {".moe.experts.b1", ".mlp.w1.bias"},
      {".moe.experts.b2", ".mlp.w2.bias"}};
  for (const auto& [expert, mlp] : kSuffix) {
    if (name.size() > expert.size() && name.compare(name.size() - expert.size(), expert.size(), expert) == 0) {
      return name.substr(0, name.size() - expert.size()) + mlp;
    }
  }
  return "";
}

// What UpcycleInto did.
struct Upcycled {
  std::set<int64_t> layers;  // the layers whose MLP became experts
  int copied = 0;            // tensors copied as they were
  int fresh = 0;             // tensors left as a fresh model's (routers, expert biases)
};

// Fills the fresh model's parameters from the checkpoint's tensors. A parameter is (1) the
// checkpoint's tensor of its name, which must have its shape; (2) for an expert tensor
// whose name the checkpoint lacks, the layer's MLP tensor, copied into every expert; (3) a
// router weight or a non-trainable state (the loss-free expert bias), left fresh. Anything
// else, and a checkpoint tensor no parameter took, is an error naming the tensor.
StatusOr<Upcycled> UpcycleInto(parallel::ParameterRegistry& reg,
                               const std::map<std::string, Tensor>& dense) {
  Upcycled u;
  std::set<std::string> used;
  for (parallel::Parameter& p : reg.params()) {
    const Shape shape = p.value.shape();
    if (auto it = dense.find(p.name); it != dense.end()) {
      if (it->second.shape() != shape) {
        const bool moe = p.name.find(".moe.") != std::string::npos;
        return FailedPrecondition(p.name, ": the checkpoint's is ", ShapeString(it->second.shape()),
                                  ", the upcycled model's ", ShapeString(shape),
                                  moe ? " (a layer that is MoE in the checkpoint keeps its experts "
                                        "and router as they are)"
                                      : "");
      }
      p.value.CopyFrom(it->second);
      used.insert(p.name);
      ++u.copied;
      continue;
    }
    const std::string mlp = MlpSource(p.name);
    if (auto it = dense.find(mlp); !mlp.empty() && it != dense.end()) {
      const Tensor& src = it->second;
      Shape one = {1};
      one.insert(one.end(), src.shape().begin(), src.shape().end());
      if (Shape(shape.begin() + 1, shape.end()) != src.shape()) {
        return FailedPrecondition(p.name, " ", ShapeString(shape), " cannot hold copies of ", mlp,
                                  " ", ShapeString(src.shape()));
      }
      for (int64_t e = 0; e < shape[0]; ++e) p.value.Slice(e, e + 1).CopyFrom(src.Reshape(one));
      used.insert(mlp);
      u.layers.insert(std::stoll(p.name.substr(7)));  // "layers.{i}."
      continue;
    }
    const bool router = p.name.size() > 18 && p.name.compare(p.name.size() - 18, 18, ".moe.router.weight") == 0;
    if (router || !p.trainable) {
      ++u.fresh;
      continue;
    }
    const size_t mlp_at = p.name.find(".mlp.");
    if (mlp_at != std::string::npos && dense.count(p.name.substr(0, mlp_at) + ".moe.router.weight")) {
      return FailedPrecondition(p.name.substr(0, mlp_at), " is an MoE layer in the checkpoint and "
                                "dense in the new config (moe.layer_freq): upcycling does not turn "
                                "experts back into an MLP");
    }
    return FailedPrecondition(p.name, ": the checkpoint has no such tensor",
                              mlp.empty() ? "" : StrCat(" and no ", mlp, " to copy into it"));
  }
  for (const auto& [name, t] : dense) {
    if (!used.count(name)) {
      return FailedPrecondition(name, ": the checkpoint's tensor has no place in the upcycled "
                                "model (a layer that is MoE in the checkpoint and dense in the "
                                "new config, or a shape the new config does not have)");
    }
  }
  return u;
}

// Why the upcycled model starts as the dense one computes, or why not.
std::string StartNote(const config::Config& c) {
  const moe::MoEConfig& e = c.moe;
  std::vector<std::string> why;
  if (!e.normalize_gates && e.top_k < e.num_experts) {
    why.push_back("the top-k gates do not sum to 1 (moe.normalize_gates=false): a layer starts "
                  "as (sum of the token's gates) x MLP");
  }
  if (e.capacity_factor > 0) why.push_back("capacity drops tokens in training (moe.capacity_factor > 0)");
  if (e.eval_capacity_factor > 0) {
    why.push_back("capacity drops tokens in eval (moe.eval_capacity_factor > 0)");
  }
  if (e.routed_scaling_factor != 1) why.push_back("moe.routed_scaling_factor is not 1");
  if (why.empty()) return "it starts computing what the checkpoint computes (gates summing to 1, dropless)";
  std::string s = "it starts differently from the checkpoint: ";
  for (size_t i = 0; i < why.size(); ++i) s += (i ? "; " : "") + why[i];
  return s;
}

int Fail(const Status& s) {
  PrintError(kCommand, std::string(s.message()));
  return kExitFailure;
}

int Upcycle(const std::vector<std::string>& args) {
  // Under mpirun every rank agrees on one error, which rank 0 prints once.
  auto world = dist::WorldCommunicator();
  Flags f;
  if (int rc = Agree(*world, ParseFlags(args, &f), kExitUsage, kCommand); rc != kExitOk) return rc;
  if (f.help) {
    if (world->rank() == 0) std::printf("%s", f.usage.c_str());
    return kExitOk;
  }
  if (world->size() != 1) {
    return Agree(*world, InvalidArgument("runs on one rank (launch it without mpirun)"), kExitUsage, kCommand);
  }
  auto dense = train::ReadCheckpointConfig(f.checkpoint);
  if (!dense.ok()) return Fail(dense.status());
  auto config = UpcycledConfig(f.checkpoint, f.overrides, dense->config);
  if (!config.ok()) return UsageError(kCommand, std::string(config.status().message()));
  if (Status s = CheckFreshOutput(f.out); !s.ok()) return Fail(s);
  auto tensors = checkpoint::ReadWholeTensors(dense->dir, /*optimizer=*/false);
  if (!tensors.ok()) return Fail(tensors.status());
  auto decoder = model::Decoder::Create(config->model, config->moe, config->train.seed, world.get());
  if (!decoder.ok()) return Fail(decoder.status());
  parallel::ParameterRegistry& reg = (*decoder)->registry();
  auto upcycled = UpcycleInto(reg, *tensors);
  if (!upcycled.ok()) return Fail(upcycled.status());
  if (upcycled->layers.empty()) {
    return UsageError(kCommand, StrCat("no MLP of the checkpoint becomes experts under moe.layer_freq=",
                                       config->moe.layer_freq, " (", config->model.n_layers,
                                       " layers): set it so that a dense layer is MoE"));
  }
  train::Optimizer optimizer(reg, train::OptimizerOptionsFor(config->train));
  // Written from one process, whole tensors (a one-rank layout); any layout loads them.
  const config::ParallelConfig one_rank;
  auto mesh = dist::Mesh::Create(1, one_rank.MeshSizes(), one_rank.order);
  if (!mesh.ok()) return Fail(mesh.status());
  nlohmann::json state{{"step", 0}, {"upcycled_from", dense->dir}};
  checkpoint::CheckpointContents contents{.params = &reg, .optimizer_state = optimizer.State(),
                                          .trainer_state_json = state.dump(),
                                          .config_yaml = config->ToYaml()};
  if (Status s = checkpoint::SaveCheckpoint(f.out, 0, contents, *world, *mesh); !s.ok()) return Fail(s);
  std::string layers;
  for (int64_t l : upcycled->layers) layers += (layers.empty() ? "" : ", ") + std::to_string(l);
  std::printf("upcycled %s into %s/%s: the MLP of layer%s %s copied into %lld experts each "
              "(top-%lld), %d tensors copied, %d fresh (routers: train.seed %lld); %s\n",
              dense->dir.c_str(), f.out.c_str(), checkpoint::StepDirName(0).c_str(),
              upcycled->layers.size() == 1 ? "" : "s", layers.c_str(),
              static_cast<long long>(config->moe.num_experts), static_cast<long long>(config->moe.top_k),
              upcycled->copied, upcycled->fresh, static_cast<long long>(config->train.seed),
              StartNote(*config).c_str());
  return kExitOk;
}

}  // namespace

int RunUpcycle(const std::vector<std::string>& args) {
  return RunInProcess(kCommand, Upcycle, args);
}

}  // namespace switchyard::cli
