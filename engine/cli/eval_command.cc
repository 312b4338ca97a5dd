// `switchyard eval --checkpoint DIR [--data DIR] [--batches N] [--json] [--set k=v ...]`:
// loads the config saved with a checkpoint, builds its model on this world's layout (one
// rank, or many under mpirun; the config's parallel section, or a --set override), loads
// the weights and reports, in eval mode (moe.eval_capacity_factor, no jitter), the mean
// validation cross-entropy, the perplexity and every MoE layer's routing statistics.
//
// The defaults reproduce the validation the training run printed at the checkpoint's step
// (the same micro-batches, train.eval_batches per data-parallel rank, when evaluated under
// the run's layout). Exit status: 0 ok, 1 a missing or corrupt checkpoint or data
// directory, 2 bad flags or an impossible layout, 3 a non-finite loss or statistic (the
// forward of finite but huge weights overflowed; one line naming the MoE layer).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cli/args.h"
#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/data/index.h"
#include "engine/data/tokenizer.h"
#include "engine/dist/process.h"
#include "engine/train/evaluator.h"
#include "engine/train/metrics.h"

namespace switchyard::cli {
namespace {

constexpr char kCommand[] = "switchyard eval";

struct Flags {
  std::string checkpoint, data;
  int batches = 0;
  bool batches_set = false, json = false, help = false, verify = false;
  std::vector<std::string> overrides;
  std::string usage;
};

Status ParseFlags(const std::vector<std::string>& args, Flags* f) {
  std::vector<std::string> rest = args;
  SY_ASSIGN_OR_RETURN(f->overrides, TakeOverrides(rest));
  FlagSet flags(kCommand,
                "Evaluates a checkpoint on the validation split: the mean cross-entropy, the\n"
                "perplexity and each MoE layer's routing statistics in eval mode\n"
                "(moe.eval_capacity_factor, no jitter). The model and the layout come from\n"
                "the config saved with the checkpoint; launch many ranks with `mpirun -np N`.");
  flags.AddPath("checkpoint", &f->checkpoint,
                "a step-* checkpoint directory, or a training output directory (its latest)", true);
  flags.AddPath("data", &f->data, "a `switchyard prep` folder (default: the config's data.dir)");
  flags.AddInt("batches", &f->batches,
               "validation micro-batches per data-parallel rank; 0 = the whole split "
               "(default: the config's train.eval_batches, as the training run validated)");
  flags.AddBool("json", &f->json, "print one JSON object instead of the report");
  flags.AddBool("verify", &f->verify, "only check the checkpoint (checksums, step, pieces, "
                                      "finite values) without building a model, as "
                                      "`switchyard checkpoint verify`");
  std::string unused;
  flags.AddString("set", &unused, "section.key=value override of the saved config; repeatable "
                                  "(e.g. parallel.ep=1)");
  f->usage = flags.Usage();
  SY_RETURN_IF_ERROR(flags.Parse(rest));
  f->help = flags.help_requested();
  f->batches_set = flags.IsSet("batches");
  if (f->batches < 0) return InvalidArgument("--batches=", f->batches, " must be >= 0");
  // --verify builds no model and reads no data: these would do nothing.
  for (const char* flag : {"batches", "data"}) {
    if (f->verify && flags.IsSet(flag)) {
      return InvalidArgument("--", flag, " needs an evaluation, not --verify (which only checks "
                             "the checkpoint's files)");
    }
  }
  if (f->verify && !f->overrides.empty()) {
    return InvalidArgument("--set needs an evaluation, not --verify (which checks the checkpoint "
                           "as saved)");
  }
  return OkStatus();
}

std::string Fmt(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

std::string Report(const train::EvalResult& r, const checkpoint::LoadedCheckpoint& ck,
                   const config::Config& c, const dist::Mesh& mesh, const std::string& data,
                   double seconds) {
  std::ostringstream out;
  out << "checkpoint " << ck.dir << " (step " << ck.step << ", saved with world "
      << ck.layout.world << ", ep " << ck.layout.ep << ", dp " << ck.layout.dp << ")\n"
      << "evaluated with world " << mesh.world() << " (ep " << mesh.ep() << ", dp " << mesh.dp()
      << ") on " << data << ": " << r.batches
      << " validation micro-batches per data-parallel rank, " << r.sequences << " sequences, "
      << r.targets << " target tokens, " << Fmt("%.2f", seconds) << " s\n"
      << "validation loss " << Fmt("%.4f", r.loss) << " | perplexity " << Fmt("%.2f", r.perplexity())
      << " | aux " << Fmt("%.4f", r.aux_loss) << " | z " << Fmt("%.4f", r.z_loss) << "\n";
  if (r.moe.empty()) return out.str();
  out << "\nrouting in eval mode (eval_capacity_factor " << Fmt("%g", c.moe.eval_capacity_factor)
      << (c.moe.eval_capacity_factor > 0 ? "" : ": dropless")
      << ", no jitter), every data-parallel rank\n"
      << "  layer  dropped   entropy  /lnE   min load  max load  tokens per expert (kept)\n";
  for (size_t i = 0; i < r.moe.size(); ++i) {
    const moe::MoEStats& s = r.moe[i];
    const double max_entropy = std::log(static_cast<double>(s.tokens_per_expert.size()));
    out << Fmt("  %5.0f", double(r.moe_layer_ids[i])) << Fmt("  %6.2f%%", 100 * s.dropped_fraction())
        << Fmt("  %7.4f", s.router_entropy())
        << Fmt("  %5.3f", max_entropy > 0 ? s.router_entropy() / max_entropy : 0.0)
        << Fmt("   %6.2f%%", 100 * s.min_load_share()) << Fmt("  %6.2f%%", 100 * s.max_load_share())
        << " ";
    for (int64_t n : s.tokens_per_expert_kept) out << " " << n;
    out << "\n";
  }
  return out.str();
}

std::string Json(const train::EvalResult& r, const checkpoint::LoadedCheckpoint& ck,
                 const config::Config& c, const dist::Mesh& mesh, const std::string& data,
                 double seconds) {
  nlohmann::ordered_json j;
  j["checkpoint"] = ck.dir;
  j["step"] = ck.step;
  j["data"] = data;
  j["world"] = mesh.world();
  j["ep"] = mesh.ep();
  j["dp"] = mesh.dp();
  j["batches"] = r.batches;
  j["sequences"] = r.sequences;
  j["tokens"] = r.targets;
  j["loss"] = r.loss;
  j["perplexity"] = r.perplexity();
  j["aux_loss"] = r.aux_loss;
  j["z_loss"] = r.z_loss;
  j["eval_capacity_factor"] = c.moe.eval_capacity_factor;
  j["eval_s"] = seconds;
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (size_t i = 0; i < r.moe.size(); ++i) {
    layers.push_back(train::MoEStatsJson(r.moe_layer_ids[i], r.moe[i]));
  }
  j["moe"] = layers;
  return j.dump();
}

int Run(const std::vector<std::string>& args) {
  auto world = dist::WorldCommunicator();
  Flags f;
  if (int rc = Agree(*world, ParseFlags(args, &f), kExitUsage, kCommand); rc != kExitOk) return rc;
  if (f.help) {
    if (world->rank() == 0) std::printf("%s", f.usage.c_str());
    return kExitOk;
  }
  if (f.verify) {  // rank 0 reads; every rank returns its answer
    const int mine = world->rank() == 0 ? VerifyCheckpointDir(kCommand, f.checkpoint, f.json) : 0;
    Tensor rc = Tensor::FromVector<int32_t>({mine}, {1});
    world->AllReduce(rc, dist::ReduceOp::kMax);
    return rc.data<int32_t>()[0];
  }
  // A missing or damaged checkpoint (its config.yaml included) is a failure; a bad --set
  // on top of a good config is a usage error.
  auto saved = train::ReadCheckpointConfig(f.checkpoint);
  if (int rc = Agree(*world, saved.status(), kExitFailure, kCommand); rc != kExitOk) return rc;
  auto cc = train::ReadCheckpointConfig(f.checkpoint, f.overrides);
  if (int rc = Agree(*world, cc.status(), kExitUsage, kCommand); rc != kExitOk) return rc;
  config::Config& config = cc->config;
  if (!f.data.empty()) {
    const Status same = CheckSameTokenizer(config.data.FirstDir(), f.data);
    if (int rc = Agree(*world, same, kExitFailure, kCommand); rc != kExitOk) return rc;
    config.data.dir = f.data;
    config.data.paths.clear();
  }
  // The saved config (+ --set) against this world: a usage error, like a bad flag.
  Status valid = config.Validate(world->size());
  if (valid.ok()) valid = config.ValidateModel();
  if (!valid.ok() && config.parallel.ep > 1 && world->size() % config.parallel.ep != 0) {
    valid = InvalidArgument(valid.message(), " (the checkpoint's config has parallel.ep=",
                            config.parallel.ep, "; run under `mpirun -np ", config.parallel.ep,
                            "` or pass --set parallel.ep=1: a checkpoint loads under any layout)");
  }
  if (int rc = Agree(*world, valid, kExitUsage, kCommand); rc != kExitOk) return rc;
  auto evaluator = train::Evaluator::Create(config, *world);
  const int create_code = evaluator.status().code() == absl::StatusCode::kUnimplemented
                              ? kExitUsage
                              : kExitFailure;
  if (int rc = Agree(*world, evaluator.status(), create_code, kCommand); rc != kExitOk) {
    return rc;
  }
  auto ck = (*evaluator)->Load(cc->dir);
  // LoadCheckpoint already agrees over the world; this only prints the error once. A load
  // that a --set of the model's keys made fail is a usage error.
  const Status load = train::BlameModelOverride(ck.status(), saved->config, config);
  const bool blamed = load.message() != ck.status().message();
  if (int rc = Agree(*world, load, blamed ? kExitUsage : kExitFailure, kCommand);
      rc != kExitOk) {
    return rc;
  }
  const auto start = std::chrono::steady_clock::now();
  auto result =
      (*evaluator)->Run(f.batches_set ? f.batches : config.train.eval_batches, ck->step);
  if (int rc = Agree(*world, result.status(), kExitFailure, kCommand); rc != kExitOk) return rc;
  // A non-finite statistic is training's non-finite stop (exit 3), not a number to print.
  const Status finite = train::CheckFiniteResult(*result);
  if (int rc = Agree(*world, finite, kExitNonFinite, kCommand); rc != kExitOk) return rc;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (world->rank() == 0) {
    const dist::Mesh& mesh = (*evaluator)->mesh();
    if (f.json) {
      std::printf("%s\n", Json(*result, *ck, config, mesh, config.data.dir, seconds).c_str());
    } else {
      std::printf("%s", Report(*result, *ck, config, mesh, config.data.dir, seconds).c_str());
    }
    std::fflush(stdout);
  }
  return kExitOk;
}

}  // namespace

int RunEval(const std::vector<std::string>& args) {
  return RunInProcess(kCommand, Run, args);
}

}  // namespace switchyard::cli
