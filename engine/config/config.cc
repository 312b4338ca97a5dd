#include "engine/config/config.h"

#include "engine/config/config_checks.h"
#include "engine/config/yaml_documents.h"
#include "engine/config/yaml_scalar.h"
#include "engine/core/file.h"

#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

namespace switchyard::config {
namespace {

// One settable, printable key of a section.
struct Field {
  std::string key;
  std::function<Status(const YAML::Node&, const std::string& where)> set;
  std::function<std::string()> show;
};

template <typename T>
Field Bind(const std::string& key, T* ptr) {
  Field f;
  f.key = key;
  f.set = [ptr](const YAML::Node& node, const std::string& where) -> Status {
    const char* kind = std::is_same_v<T, bool>                   ? "true or false"
                       : std::is_same_v<T, std::string>          ? "a string"
                       : std::is_same_v<T, std::vector<int64_t>> ? "a list of integers"
                       : std::is_integral_v<T>                   ? "an integer"
                                                                 : "a number";
    try {
      if constexpr (std::is_same_v<T, bool>) {
        SY_ASSIGN_OR_RETURN(*ptr, ReadBool(node, where));
      } else if constexpr (std::is_same_v<T, std::string>) {
        if (!node.IsScalar()) return ExpectedError(node, where, kind);
        *ptr = node.Scalar();
      } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
        if (!node.IsSequence()) return ExpectedError(node, where, kind);
        std::vector<int64_t> list(node.size());
        for (size_t i = 0; i < node.size(); ++i) {
          SY_RETURN_IF_ERROR(ReadScalar(node[i], StrCat(where, "[", i, "]"), &list[i]));
        }
        *ptr = std::move(list);
      } else {
        SY_RETURN_IF_ERROR(ReadScalar(node, where, ptr));
      }
    } catch (const YAML::Exception&) {
      return ExpectedError(node, where, kind);
    }
    return OkStatus();
  };
  f.show = [ptr]() {
    std::ostringstream out;
    if constexpr (std::is_same_v<T, bool>) {
      out << (*ptr ? "true" : "false");
    } else if constexpr (std::is_same_v<T, std::string>) {
      out << YamlString(*ptr);  // reads back as the same string (config.yaml)
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      out << "[";
      for (size_t i = 0; i < ptr->size(); ++i) out << (i ? ", " : "") << (*ptr)[i];
      out << "]";
    } else {
      out.precision(std::numeric_limits<float>::max_digits10);
      out << *ptr;
    }
    return out.str();
  };
  return f;
}

template <typename E>
Field BindEnum(const std::string& key, E* ptr, StatusOr<E> (*parse)(const std::string&),
               const char* (*name)(E)) {
  Field f;
  f.key = key;
  f.set = [ptr, parse](const YAML::Node& node, const std::string& where) -> Status {
    if (!node.IsScalar()) return ExpectedError(node, where, "a name");
    auto value = parse(node.Scalar());
    if (!value.ok()) return value.status();
    *ptr = *value;
    return OkStatus();
  };
  f.show = [ptr, name]() { return std::string(name(*ptr)); };
  return f;
}

// A key whose value is one of the names of `table` (engine/core/enum_names.h); an unknown
// name is "section.key='x' is not one of a, b, c".
template <typename E, size_t N>
Field BindNamed(const std::string& key, E* ptr, const EnumName<E> (&table)[N]) {
  Field f;
  f.key = key;
  f.set = [ptr, &table](const YAML::Node& node, const std::string& where) -> Status {
    if (!node.IsScalar()) return ExpectedError(node, where, "a name");
    SY_ASSIGN_OR_RETURN(*ptr, ParseByName(table, node.Scalar(), where));
    return OkStatus();
  };
  f.show = [ptr, &table]() { return std::string(NameOf(table, *ptr)); };
  return f;
}

// runtime.device: cpu, cuda or cuda:N (runtime_config.h).
Field BindRuntimeDevice(const std::string& key, RuntimeDevice* ptr) {
  Field f;
  f.key = key;
  f.set = [ptr](const YAML::Node& node, const std::string& where) -> Status {
    if (!node.IsScalar()) return ExpectedError(node, where, "a name");
    SY_ASSIGN_OR_RETURN(*ptr, ParseRuntimeDevice(node.Scalar()));
    return OkStatus();
  };
  f.show = [ptr]() { return RuntimeDeviceName(*ptr); };
  return f;
}

// data.paths: a list of {dir: STRING, weight: NUMBER (default 1)}.
Field BindDataPaths(const std::string& key, std::vector<data::DataPath>* ptr) {
  Field f;
  f.key = key;
  f.set = [ptr](const YAML::Node& node, const std::string& where) -> Status {
    if (!node.IsSequence()) {
      return InvalidArgument(where, ": expected a list of {dir: ..., weight: ...}, got '",
                             ScalarText(node), "'");
    }
    std::vector<data::DataPath> paths;
    for (size_t i = 0; i < node.size(); ++i) {
      const std::string at = StrCat(where, "[", i, "]");
      if (!node[i].IsMap()) return InvalidArgument(at, ": expected {dir: ..., weight: ...}");
      data::DataPath path;
      std::set<std::string> seen;
      for (const auto& kv : node[i]) {
        if (!kv.first.IsScalar()) {
          return InvalidArgument(at, ": a key must be dir or weight, not '", ScalarText(kv.first),
                                 "'");
        }
        const std::string name = kv.first.Scalar();
        if (!seen.insert(name).second) {
          return InvalidArgument(at, ": '", name, "' is set twice; keep one");
        }
        if (name == "dir") {
          if (!kv.second.IsScalar()) return ExpectedError(kv.second, at + ".dir", "a string");
          path.dir = kv.second.Scalar();
        } else if (name == "weight") {
          SY_ASSIGN_OR_RETURN(path.weight,
                              ReadFiniteNumber(kv.second, StrCat(at, ".weight"), false));
        } else {
          return InvalidArgument(at, ": unknown key '", name, "' (expected dir and weight)");
        }
      }
      paths.push_back(std::move(path));
    }
    *ptr = std::move(paths);
    return OkStatus();
  };
  f.show = [ptr]() {
    std::ostringstream out;
    out.precision(std::numeric_limits<double>::max_digits10);
    out << "[";
    for (size_t i = 0; i < ptr->size(); ++i) {
      out << (i ? ", " : "") << "{dir: " << YamlString((*ptr)[i].dir, /*always_quote=*/true)
          << ", weight: " << (*ptr)[i].weight << "}";
    }
    out << "]";
    return out.str();
  };
  return f;
}

// train.min_lr: -1 (0.1 * lr) stays -1, so that a later --set train.lr (a resumed run's,
// eval's) moves it too; the text shows what it resolves to, as a comment.
Field BindMinLr(TrainConfig& t) {
  Field f = Bind("min_lr", &t.min_lr);
  f.show = [&t]() {
    std::ostringstream out;
    out.precision(std::numeric_limits<float>::max_digits10);
    out << t.min_lr;
    if (t.min_lr == -1.0f) out << "  # 0.1 * lr = " << t.resolved_min_lr();
    return out.str();
  };
  return f;
}

struct Section {
  std::string name;
  std::vector<Field> fields;
};

// The moe section's keys (Sections' longest list).
Section MoESection(moe::MoEConfig& m) {
  return {"moe",
          {Bind("num_experts", &m.num_experts), Bind("layer_freq", &m.layer_freq),
           Bind("top_k", &m.top_k), Bind("d_expert", &m.d_expert),
           BindEnum("activation", &m.activation, moe::ParseActivation, moe::ActivationName),
           Bind("bias", &m.bias), Bind("normalize_gates", &m.normalize_gates),
           Bind("routed_scaling_factor", &m.routed_scaling_factor),
           Bind("router_lr_scale", &m.router_lr_scale),
           BindEnum("score", &m.score, moe::ParseScoreFunction, moe::ScoreFunctionName),
           Bind("route_groups", &m.route_groups), Bind("route_group_topk", &m.route_group_topk),
           BindEnum("second_expert_policy", &m.second_expert_policy,
                    moe::ParseSecondExpertPolicy, moe::SecondExpertPolicyName),
           Bind("jitter_eps", &m.jitter_eps), Bind("expert_bias_rate", &m.expert_bias_rate),
           BindEnum("expert_bias_update", &m.expert_bias_update, moe::ParseExpertBiasUpdate,
                    moe::ExpertBiasUpdateName),
           Bind("capacity_factor", &m.capacity_factor),
           Bind("eval_capacity_factor", &m.eval_capacity_factor),
           BindEnum("drop_policy", &m.drop_policy, moe::ParseDropPolicy, moe::DropPolicyName),
           Bind("aux_loss_coef", &m.aux_loss_coef),
           BindEnum("aux_loss_scope", &m.aux_loss_scope, moe::ParseAuxLossScope,
                    moe::AuxLossScopeName),
           Bind("z_loss_coef", &m.z_loss_coef),
           Bind("num_shared_experts", &m.num_shared_experts), Bind("d_shared", &m.d_shared),
           Bind("seed", &m.seed),
           BindEnum("dispatcher", &m.dispatcher, moe::ParseDispatcher, moe::DispatcherName),
           Bind("replicate_hot_experts", &m.replicate_hot_experts),
           Bind("replicate_every", &m.replicate_every), Bind("overlap_chunks", &m.overlap_chunks),
           BindNamed("dispatch_counts", &m.dispatch_counts, moe::kDispatchCountsNames)}};
}

// The key tables: the single list of what a config may contain.
std::vector<Section> Sections(Config& c) {
  ParallelConfig& p = c.parallel;
  TrainConfig& t = c.train;
  return {
      {"model",
       {Bind("vocab_size", &c.model.vocab_size), Bind("seq_len", &c.model.seq_len),
        Bind("d_model", &c.model.d_model), Bind("n_layers", &c.model.n_layers),
        Bind("n_heads", &c.model.n_heads), Bind("n_kv_heads", &c.model.n_kv_heads),
        Bind("head_dim", &c.model.explicit_head_dim), Bind("d_ff", &c.model.d_ff),
        BindEnum("norm", &c.model.norm, model::ParseNorm, dense::NormKindName),
        Bind("norm_eps", &c.model.norm_eps),
        BindEnum("position", &c.model.position, model::ParsePosition, model::PositionName),
        Bind("rope_base", &c.model.rope_base),
        BindEnum("activation", &c.model.activation, model::ParseActivation, dense::ActivationName),
        Bind("bias", &c.model.bias), Bind("tie_embeddings", &c.model.tie_embeddings),
        Bind("init_std", &c.model.init_std), Bind("scaled_init", &c.model.scaled_init)}},
      MoESection(c.moe),
      {"parallel",
       {Bind("tp", &p.tp), Bind("cp", &p.cp), Bind("ep", &p.ep), Bind("etp", &p.etp),
        Bind("pp", &p.pp),
        BindNamed("pipeline_schedule", &p.pipeline_schedule, parallel::kPipelineScheduleNames),
        Bind("virtual_stages", &p.virtual_stages), Bind("pipeline_layers", &p.pipeline_layers),
        Bind("zero_stage", &p.zero_stage),
        Bind("offload_optimizer", &p.offload_optimizer), Bind("order", &p.order),
        Bind("sequence_parallel", &p.sequence_parallel),
        Bind("ranks_per_node", &p.ranks_per_node)}},
      {"train",
       {BindNamed("optimizer", &t.optimizer, kOptimizerKindNames),
        Bind("lr", &t.lr), BindMinLr(t), Bind("warmup_steps", &t.warmup_steps),
        Bind("max_steps", &t.max_steps),
        BindNamed("lr_decay_style", &t.lr_decay_style, kLrDecayStyleNames),
        Bind("lr_decay_steps", &t.lr_decay_steps), Bind("weight_decay", &t.weight_decay),
        Bind("beta1", &t.beta1), Bind("beta2", &t.beta2), Bind("eps", &t.eps),
        Bind("momentum", &t.momentum), Bind("grad_clip", &t.grad_clip),
        Bind("bucket_mb", &t.bucket_mb), Bind("ordered_grad_accum", &t.ordered_grad_accum), Bind("micro_batch_size", &t.micro_batch_size),
        Bind("grad_accum", &t.grad_accum), Bind("seed", &t.seed),
        Bind("eval_every", &t.eval_every), Bind("eval_batches", &t.eval_batches),
        Bind("checkpoint_every", &t.checkpoint_every),
        BindNamed("recompute", &t.recompute, model::kRecomputeNames),
        Bind("head_chunk_tokens", &t.head_chunk_tokens),
        BindNamed("on_nonfinite", &t.on_nonfinite, kNonFiniteActionNames),
        Bind("max_nonfinite_skips", &t.max_nonfinite_skips),
        Bind("collective_timeout_s", &t.collective_timeout_s)}},
      {"data", {Bind("dir", &c.data.dir), BindDataPaths("paths", &c.data.paths),
                Bind("verify", &c.data.verify)}},
      {"runtime",
       {BindRuntimeDevice("device", &c.runtime.device),
        BindNamed("precision", &c.runtime.precision, kPrecisionNames),
        BindNamed("activation_dtype", &c.runtime.activation_dtype, kActivationDtypeNames),
        Bind("cuda_graphs", &c.runtime.cuda_graphs),
        Bind("memory_check", &c.runtime.memory_check)}},
      {"plan", {Bind("world", &c.plan.world), Bind("device_memory_gib", &c.plan.device_memory_gib)}},
      {"logging", {Bind("routing_every", &c.logging.routing_every)}},
  };
}

// "the line 3" of a node of a parsed file ("" for --set's trees, which carry no marks).
std::string LineOf(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  return mark.is_null() ? std::string() : StrCat(" (line ", mark.line + 1, ")");
}

// The keys of a mapping are plain scalars, each once: "model.d_model (line 9) is also set
// on line 4".
Status CheckKeys(const YAML::Node& map, const std::string& prefix, const std::string& source) {
  std::map<std::string, YAML::Node> seen;
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) {
      return InvalidArgument(source, ": ",
                             prefix.empty() ? std::string("a section name")
                                            : StrCat("a key of section '", prefix, "'"),
                             LineOf(kv.first), " must be a plain word, not '", ScalarText(kv.first),
                             "'");
    }
    const std::string key = kv.first.Scalar();
    auto [it, fresh] = seen.emplace(key, kv.first);
    if (!fresh) {
      const std::string name = prefix.empty() ? key : StrCat(prefix, ".", key);
      const YAML::Mark first = it->second.Mark(), again = kv.first.Mark();
      return InvalidArgument(source, ": '", name, "' is set twice",
                             first.is_null() ? std::string()
                                             : StrCat(", on lines ", first.line + 1, " and ",
                                                      again.line + 1),
                             "; keep one");
    }
  }
  return OkStatus();
}

// Sets the keys of `root` (a file or one --set), adding each key's name to `given`.
Status Apply(Config& config, const YAML::Node& root, const std::string& source,
             std::set<std::string>& given) {
  if (!root || root.IsNull()) return OkStatus();
  if (!root.IsMap()) return InvalidArgument(source, ": the top level must be a mapping of sections");
  SY_RETURN_IF_ERROR(CheckKeys(root, "", source));
  std::vector<Section> sections = Sections(config);
  for (const auto& entry : root) {
    const std::string name = entry.first.Scalar();
    auto section = std::find_if(sections.begin(), sections.end(),
                                [&](const Section& s) { return s.name == name; });
    if (section == sections.end()) return InvalidArgument(source, ": unknown section '", name, "'");
    if (entry.second.IsNull()) continue;
    if (!entry.second.IsMap()) return InvalidArgument(source, ": section '", name, "' must be a mapping");
    SY_RETURN_IF_ERROR(CheckKeys(entry.second, name, source));
    for (const auto& kv : entry.second) {
      const std::string key = kv.first.Scalar();
      auto field = std::find_if(section->fields.begin(), section->fields.end(),
                                [&](const Field& f) { return f.key == key; });
      if (field == section->fields.end()) {
        return InvalidArgument(source, ": unknown key '", name, ".", key, "'");
      }
      Status s = field->set(kv.second, StrCat(name, ".", key));
      if (!s.ok()) return InvalidArgument(source, ": ", s.message());
      given.insert(StrCat(name, ".", key));
    }
  }
  return OkStatus();
}

// "moe.top_k=2" -> a YAML tree {moe: {top_k: 2}}.
StatusOr<YAML::Node> OverrideNode(const std::string& text) {
  const size_t eq = text.find('=');
  const size_t dot = text.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq || dot == 0 ||
      dot + 1 == eq) {
    return InvalidArgument("--set '", text, "': expected section.key=value");
  }
  YAML::Node value;
  try {
    value = YAML::Load(text.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    return InvalidArgument("--set '", text, "': bad value: ", e.msg);
  }
  YAML::Node root;
  root[text.substr(0, dot)][text.substr(dot + 1, eq - dot - 1)] = value;
  return root;
}

}  // namespace

Status PlanConfig::Validate() const {
  if (world < 0) return InvalidArgument("plan.world=", world, " must be >= 0 (0: the smallest world)");
  if (!(device_memory_gib >= 0.0f) || !std::isfinite(device_memory_gib)) {
    return InvalidArgument("plan.device_memory_gib=", device_memory_gib,
                           " must be a finite number >= 0 (0: no memory check)");
  }
  return OkStatus();
}

Status DataConfig::Validate() const {
  if (paths.empty() && dir.empty()) return InvalidArgument("data.dir is empty");
  if (paths.size() > 255) return InvalidArgument("data.paths holds ", paths.size(), " datasets (at most 255)");
  for (size_t i = 0; i < paths.size(); ++i) {
    if (paths[i].dir.empty()) return InvalidArgument("data.paths[", i, "].dir is missing or empty");
    if (!(paths[i].weight > 0) || !std::isfinite(paths[i].weight)) {
      return InvalidArgument("data.paths[", i, "].weight=", paths[i].weight,
                             " must be a positive number");
    }
  }
  return OkStatus();
}

Status Config::Validate(int world) const {
  SY_RETURN_IF_ERROR(runtime.Validate());
  SY_RETURN_IF_ERROR(plan.Validate());
  SY_RETURN_IF_ERROR(data.Validate());
  if (model.d_model <= 0) {
    SY_RETURN_IF_ERROR(CheckRequiredKey(*this, "model.d_model"));
    return InvalidArgument("model.d_model=", model.d_model, " must be positive");
  }
  if (moe.d_expert <= 0) SY_RETURN_IF_ERROR(CheckRequiredKey(*this, "moe.d_expert"));
  SY_RETURN_IF_ERROR(CheckModelLimits(*this));
  SY_RETURN_IF_ERROR(moe.Validate());
  // The CUDA router kernels implement softmax scores without group limits only.
  if (!runtime.device.is_cpu() && moe.score == moe::ScoreFunction::kSigmoid) {
    return InvalidArgument("moe.score=sigmoid runs on the CPU only (runtime.device=",
                           runtime.device, ")");
  }
  if (!runtime.device.is_cpu() && moe.route_groups > 0) {
    return InvalidArgument("moe.route_groups=", moe.route_groups,
                           " (node-limited routing) runs on the CPU only (runtime.device=",
                           runtime.device, ")");
  }
  SY_RETURN_IF_ERROR(train.Validate());
  if (logging.routing_every < 0) {
    return InvalidArgument("logging.routing_every=", logging.routing_every,
                           " must be >= 0 (0: only at the last step)");
  }
  SY_RETURN_IF_ERROR(CheckReplication(moe, parallel));
  SY_RETURN_IF_ERROR(CheckSizeProducts(*this, world));
  SY_RETURN_IF_ERROR(parallel.Validate(model, moe, train.grad_accum, world));
  return CheckCudaGraphs(*this, world);
}

std::string Config::ToYaml() const {
  Config copy = *this;
  std::ostringstream out;
  for (const Section& s : Sections(copy)) {
    out << s.name << ":\n";
    for (const Field& f : s.fields) out << "  " << f.key << ": " << f.show() << "\n";
  }
  return out.str();
}

std::optional<KeyDifference> FirstDifference(
    const Config& a, const Config& b,
    const std::function<bool(const std::string& section, const std::string& key)>& compared) {
  Config copy_a = a, copy_b = b;
  const std::vector<Section> sa = Sections(copy_a), sb = Sections(copy_b);
  for (size_t s = 0; s < sa.size(); ++s) {
    for (size_t f = 0; f < sa[s].fields.size(); ++f) {
      if (!compared(sa[s].name, sa[s].fields[f].key)) continue;
      std::string va = sa[s].fields[f].show(), vb = sb[s].fields[f].show();
      if (va != vb) return KeyDifference{StrCat(sa[s].name, ".", sa[s].fields[f].key), va, vb};
    }
  }
  return std::nullopt;
}

StatusOr<Config> ParseConfig(const std::string& yaml, const std::string& source,
                             const std::vector<std::string>& overrides) {
  Config config;
  SY_ASSIGN_OR_RETURN(const std::vector<YamlDocument> documents, ScanYamlDocuments(yaml, source));
  // A second document (after `---`) would be silently ignored: one config is one document.
  for (size_t i = 1; i < documents.size(); ++i) {
    if (documents[i].null) continue;
    return InvalidArgument(source, ": holds a second YAML document (line ",
                           documents[i].mark.line + 1,
                           "); a config is one document (remove the '---' and merge the keys)");
  }
  YAML::Node root;
  try {
    if (!documents.empty()) root = YAML::Load(yaml);  // the first document
  } catch (const YAML::Exception& e) {
    return InvalidArgument(source, ":", e.mark.line + 1, ": YAML syntax error: ", PrintableText(e.msg));
  }
  std::set<std::string> given;
  // Messages echo the file's keys and values: control bytes in them are escaped.
  const auto printable = [](const Status& s) {
    return Status(s.code(), PrintableText(std::string(s.message())));
  };
  try {
    if (Status s = Apply(config, root, source, given); !s.ok()) return printable(s);
  } catch (const YAML::Exception& e) {  // a conversion the tables did not foresee
    return InvalidArgument(source, ":", e.mark.line + 1, ": ", PrintableText(e.msg));
  }
  for (const std::string& text : overrides) {
    SY_ASSIGN_OR_RETURN(YAML::Node node, OverrideNode(text));
    if (Status s = Apply(config, node, "--set", given); !s.ok()) return printable(s);
  }
  for (const char* key : kRequiredKeys) {
    if (!given.count(key)) config.unset_required.push_back(key);
  }
  config.moe.d_model = config.model.d_model;
  config.moe.seq_len = config.model.seq_len;
  return config;
}

StatusOr<Config> LoadConfig(const std::string& path, const std::vector<std::string>& overrides) {
  SY_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  // A file without a single key is a mistake (every key would be its default); a syntax
  // error is reported as one first.
  SY_ASSIGN_OR_RETURN(const std::vector<YamlDocument> documents, ScanYamlDocuments(text, path));
  if (documents.empty() || documents.front().null) {
    return InvalidArgument(path, ": the config file is empty (", text.empty() ? "0 bytes" : "no keys",
                           "); see configs/ and docs/config.md");
  }
  return ParseConfig(text, path, overrides);
}

}  // namespace switchyard::config
