// `switchyard plan --config F --gpus N [--gpu h100|h200|a100-80g|a100-40g|FILE]
// [--gpus-per-node N] [--global-batch N] [--skew X|routing.jsonl] [--precision P] [--top N]
// [--config-layout] [--json] [--set k=v ...]`: the fastest layouts of a config
// on N devices that fit their memory, with predicted step time, tokens/s, MFU, memory and
// where the time goes (engine/plan/planner.h, docs/plan.md).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cli/args.h"
#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/config/config.h"
#include "engine/plan/dry_run.h"
#include "engine/plan/planner.h"

namespace switchyard::cli {
namespace {

constexpr char kCommand[] = "switchyard plan";

struct Flags {
  std::string config, gpu = "h100", skew = "1", precision;
  int gpus = 0, gpus_per_node = 0, top = 10, global_batch = 0;
  bool json = false, config_layout = false;
  std::vector<std::string> overrides;
};

std::string HardwareDir() {
  if (const char* dir = std::getenv("SWITCHYARD_HARDWARE_DIR")) return dir;
  return std::string(SWITCHYARD_SOURCE_DIR) + "/configs/hardware";
}

nlohmann::ordered_json Json(const plan::Candidate& c, int world) {
  const plan::StepTime& t = c.time;
  const plan::Layout& l = c.layout;
  return {{"layout", {{"tp", l.tp}, {"cp", l.cp}, {"pp", l.pp}, {"ep", l.ep}, {"etp", l.etp},
                      {"dp", l.dp(world)}, {"schedule", parallel::PipelineScheduleName(l.schedule)},
                      {"virtual_stages", l.virtual_stages}, {"zero_stage", l.zero_stage},
                      {"micro_batch_size", l.micro_batch_size}, {"micro_batches", l.micro_batches},
                      {"recompute", model::RecomputeName(l.recompute)},
                      {"head_chunk_tokens", l.head_chunk_tokens}}},
          {"step_s", t.total()}, {"tokens_per_s", c.tokens_per_s},
          {"tflops_per_gpu", c.flops_per_gpu / 1e12}, {"mfu", c.mfu},
          {"peak_bytes", c.peak_bytes}, {"fits", c.fits},
          {"seconds", {{"compute", t.compute}, {"tp", t.tp}, {"cp", t.cp}, {"ep", t.ep},
                       {"dp", t.dp}, {"pp", t.pp}, {"bubble", t.bubble}}}};
}

// The config as the planned run would have it: on the hardware file's device (a GPU unless
// the file is a cpu* calibration) and with --precision's products, so that a config whose
// runtime section is valid there (activation_dtype bf16 with precision auto, say) is not
// rejected for the CPU it names by default. The user's --set come after and win.
std::vector<std::string> PlannedRunOverrides(const Flags& f, const plan::Hardware& hw) {
  std::vector<std::string> out;
  out.push_back(hw.name.rfind("cpu", 0) == 0 ? "runtime.device=cpu" : "runtime.device=cuda");
  // fp8 products keep bf16 tensors. An fp32 plan of bf16 activations gets the plan's own error.
  if (!f.precision.empty() && f.precision != "fp32") out.push_back("runtime.precision=bf16");
  out.insert(out.end(), f.overrides.begin(), f.overrides.end());
  return out;
}

StatusOr<plan::PlanInputs> Inputs(const Flags& f, const plan::Hardware& hw) {
  SY_ASSIGN_OR_RETURN(config::Config config,
                      config::LoadConfig(f.config, PlannedRunOverrides(f, hw)));
  plan::PlanInputs in;
  in.world = f.gpus;
  in.max_tp = hw.gpus_per_node;
  const config::ParallelConfig& p = config.parallel;
  if (f.global_batch > 0) {
    in.global_batch = f.global_batch;
  } else {
    // The config's batch: micro_batch_size x grad_accum x its dp on this world.
    const int64_t replica = int64_t{p.tp} * p.cp * p.pp;
    if (f.gpus % replica != 0) {
      return InvalidArgument("--gpus ", f.gpus, " is not a multiple of the config's tp*cp*pp = ",
                             replica, ", so its global batch is undefined; give --global-batch");
    }
    in.global_batch = config.train.micro_batch_size * config.train.grad_accum * (f.gpus / replica);
  }
  in.precision = f.precision;
  if (in.precision.empty()) {
    in.precision = config.runtime.precision != config::Precision::kAuto
                       ? NameOf(config::kPrecisionNames, config.runtime.precision)
                   : hw.name.rfind("cpu", 0) == 0 ? "fp32"
                                                  : "bf16";
  }
  if (in.precision != "bf16" && in.precision != "fp32" && in.precision != "fp8" && in.precision != "fp8-cs") {
    return InvalidArgument("--precision ", in.precision, " is not one of bf16, fp32, fp8, fp8-cs");
  }
  if (in.precision == "fp32" && config.runtime.activation_dtype == config::ActivationDtype::kBf16) {
    return InvalidArgument("runtime.activation_dtype=bf16 needs bf16 matrix products, but the plan's "
                           "precision is fp32; plan with --precision bf16 or set runtime.activation_dtype=fp32");
  }
  SY_ASSIGN_OR_RETURN(in.skew, plan::ParseSkew(f.skew));
  if (in.skew.expert_counts.empty() && in.skew.constant > f.gpus) {
    return InvalidArgument("--skew ", f.skew, ": the busiest expert-parallel rank's load over the "
                           "mean is at most ep (every token on that rank), and ep is at most "
                           "--gpus ", f.gpus);
  }
  for (size_t l = 0; l < in.skew.expert_counts.size(); ++l) {
    const std::vector<double>& counts = in.skew.expert_counts[l];
    if (static_cast<int64_t>(counts.size()) != config.moe.num_experts) {
      return InvalidArgument("--skew ", f.skew, ": MoE layer ", l, " has ", counts.size(),
                             " expert counts, but the model has moe.num_experts=",
                             config.moe.num_experts, " (a log of another model?)");
    }
    if (std::all_of(counts.begin(), counts.end(), [](double n) { return n == 0; })) {
      return InvalidArgument("--skew ", f.skew, ": MoE layer ", l, " routed no token, so it "
                             "says nothing of the load");
    }
  }
  in.config = std::move(config);
  return in;
}

// Why the search found no valid layout (every layout's check failed): a global batch that
// no layout's data-parallel size divides, or the first layout's own error.
std::string NoLayoutReason(const plan::PlanInputs& in, const plan::PlanResult& result) {
  const std::string what = StrCat("no layout of ", in.world, " devices is valid for a global ",
                                  "batch of ", in.global_batch, " sequences");
  const std::vector<plan::Layout> space = plan::SearchSpace(in);
  if (space.empty()) {
    return StrCat(what, ": no layout's data-parallel size (devices / (tp x cp x pp)) divides it");
  }
  const config::Config c = space.front().Apply(in.config);
  const Status s = c.parallel.Validate(c.model, c.moe, c.train.grad_accum, in.world);
  return StrCat(what, " (", result.searched, " searched); the first, ",
                space.front().Describe(in.world), ": ", s.message());
}

int Report(const Flags& f, const plan::PlanInputs& in, const plan::Hardware& hw) {
  plan::PlanResult result;
  if (f.config_layout) {
    const plan::Layout l = plan::LayoutOf(in.config);
    const config::Config c = l.Apply(in.config);
    if (Status s = c.parallel.Validate(c.model, c.moe, c.train.grad_accum, in.world); !s.ok()) {
      return UsageError(kCommand, std::string(s.message()));
    }
    if (in.global_batch != l.micro_batch_size * l.micro_batches * l.dp(in.world)) {
      return UsageError(kCommand, StrCat("--global-batch ", in.global_batch, " is not the config's ",
                                         "micro_batch_size x grad_accum x dp = ",
                                         l.micro_batch_size * l.micro_batches * l.dp(in.world)));
    }
    plan::CostCache cache;
    plan::Candidate c1 = plan::Evaluate(in, l, hw, cache);
    c1.peak_bytes = plan::PeakMemory(in, l);
    c1.fits = c1.peak_bytes <= hw.memory_bytes;
    result.best.push_back(c1);
  } else {
    result = plan::Plan(in, hw, {.top = f.top});
    if (result.valid == 0) return UsageError(kCommand, NoLayoutReason(in, result));
  }
  if (f.json) {
    nlohmann::ordered_json j = {{"gpus", in.world}, {"gpu", hw.name}, {"global_batch", in.global_batch},
                                {"precision", in.precision}, {"searched", result.searched},
                                {"valid", result.valid}, {"layouts", nlohmann::ordered_json::array()}};
    for (const plan::Candidate& c : result.best) j["layouts"].push_back(Json(c, in.world));
    std::printf("%s\n", j.dump().c_str());
    return kExitOk;
  }
  std::printf("plan: %s on %d x %s (%d per node), global batch %lld sequences of %lld tokens, %s\n",
              f.config.c_str(), in.world, hw.name.c_str(), hw.gpus_per_node,
              static_cast<long long>(in.global_batch), static_cast<long long>(in.config.model.seq_len),
              in.precision.c_str());
  if (!f.config_layout) {
    std::printf("searched %lld layouts, %lld valid, memory checked for %lld%s\n",
                static_cast<long long>(result.searched), static_cast<long long>(result.valid),
                static_cast<long long>(result.memory_checked),
                result.memory_skipped > 0
                    ? StrCat(" (", result.memory_skipped, " more whose model states and one "
                             "micro-batch's activations exceed the device)").c_str()
                    : "");
  }
  if (result.best.empty()) {
    std::fflush(stdout);
    PrintError(kCommand, StrCat("no valid layout fits ", plan::FormatBytes(hw.memory_bytes),
                                " of memory per device; the smallest needs ",
                                plan::FormatBytes(result.smallest.peak_bytes), " (",
                                result.smallest.layout.Describe(in.world), ")"));
    return kExitFailure;
  }
  std::fputs(plan::FormatCandidates(result.best, in.world).c_str(), stdout);
  if (f.config_layout && !result.best[0].fits) std::printf("note: the layout does not fit the device's memory\n");
  return kExitOk;
}

// Nodes hold the same number of devices (--gpus-per-node, else the hardware file's
// gpus_per_node, already in hw); a job smaller than one node uses part of it.
Status CheckNodes(const Flags& f, const plan::Hardware& hw) {
  const std::string per_node = f.gpus_per_node > 0
                                   ? StrCat("--gpus-per-node=", hw.gpus_per_node)
                                   : StrCat("the hardware file's gpus_per_node=", hw.gpus_per_node,
                                            " (", f.gpu, ")");
  if (hw.gpus_per_node < 1) return InvalidArgument(per_node, " must be >= 1");
  if (f.gpus > hw.gpus_per_node && f.gpus % hw.gpus_per_node != 0) {
    return InvalidArgument(per_node, " does not divide --gpus=", f.gpus,
                           " (every node holds the same number of devices)");
  }
  return OkStatus();
}

}  // namespace

int RunPlan(const std::vector<std::string>& args_in) {
  std::vector<std::string> args = args_in;
  Flags f;
  auto overrides = TakeOverrides(args);
  if (!overrides.ok()) return UsageError(kCommand, std::string(overrides.status().message()));
  f.overrides = *overrides;
  std::string unused;
  FlagSet flags(kCommand,
                "Searches every valid layout (tp, cp, pp and schedule, ep, etp, ZeRO, micro-batch,\n"
                "recompute) of a config on N devices, drops those the dry-run's memory model does not\n"
                "fit, and prints the fastest by predicted step time. See docs/plan.md.");
  flags.AddPath("config", &f.config, "YAML config (configs/*.yaml)", true);
  flags.AddInt("gpus", &f.gpus, "number of devices (ranks)", true);
  flags.AddString("gpu", &f.gpu, "hardware: h100, h200, a100-80g, a100-40g, h800, a name in "
                  "configs/hardware or a YAML file (default h100)");
  flags.AddInt("gpus-per-node", &f.gpus_per_node, "devices per node (default: the hardware file's)");
  flags.AddInt("global-batch", &f.global_batch, "sequences per step (default: the config's "
               "micro_batch_size x grad_accum x dp)");
  flags.AddString("skew", &f.skew, "busiest expert-parallel rank's load over the mean (>= 1), or "
                  "a routing.jsonl (default 1)");
  flags.AddString("precision", &f.precision, "bf16, fp32, fp8 (block scales) or fp8-cs (current scaling) "
                  "(default: runtime.precision; auto "
                  "is fp32 on a cpu* hardware file, else bf16)");
  flags.AddInt("top", &f.top, "rows to print (default 10)");
  flags.AddBool("config-layout", &f.config_layout, "predict the config's own layout only");
  flags.AddBool("json", &f.json, "print one JSON object");
  flags.AddString("set", &unused, "section.key=value config override; repeatable");
  if (Status s = flags.Parse(args); !s.ok()) return UsageError(kCommand, std::string(s.message()));
  if (flags.help_requested()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return kExitOk;
  }
  if (Status s = CheckWorldFlag("gpus", f.gpus); !s.ok()) {
    return UsageError(kCommand, std::string(s.message()));
  }
  if (f.top < 1) return UsageError(kCommand, StrCat("--top ", f.top, " must be >= 1"));
  auto hw = plan::LoadHardware(f.gpu, HardwareDir());
  if (!hw.ok()) return UsageError(kCommand, std::string(hw.status().message()));
  if (flags.IsSet("gpus-per-node") && f.gpus_per_node < 1) {
    return UsageError(kCommand, StrCat("--gpus-per-node=", f.gpus_per_node, " must be >= 1"));
  }
  if (flags.IsSet("global-batch") && f.global_batch < 1) {
    return UsageError(kCommand, StrCat("--global-batch=", f.global_batch, " must be >= 1 (leave it "
                                       "out for the config's)"));
  }
  if (f.gpus_per_node > 0) hw->gpus_per_node = f.gpus_per_node;
  if (Status s = CheckNodes(f, *hw); !s.ok()) return UsageError(kCommand, std::string(s.message()));
  auto in = Inputs(f, *hw);
  if (!in.ok()) return UsageError(kCommand, std::string(in.status().message()));
  // The model as `train` checks it (a rope head of odd width plans nothing that could train).
  Status valid = in->config.Validate(0);
  if (valid.ok()) valid = in->config.ValidateModel();
  if (!valid.ok()) return UsageError(kCommand, std::string(valid.message()));
  return Report(f, *in, *hw);
}

}  // namespace switchyard::cli
