// `switchyard train --config FILE [--out DIR] [--steps N] [--resume DIR] [--set k=v ...]
//                   [--dry-run [--world N] [--search]] [--profile [--profile-skip N]]`: trains a model from a config on one rank or
// under mpirun.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/step_dir.h"
#include "engine/cli/args.h"
#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/core/file.h"
#include "engine/dist/process.h"
#include "engine/plan/device_fit.h"
#include "engine/plan/dry_run.h"
#include "engine/plan/layout_search.h"
#include "engine/train/trainer.h"

namespace switchyard::cli {
namespace {

constexpr char kCommand[] = "switchyard train";

// SIGUSR1 stops training as SIGTERM does (save, exit 75). Open MPI's mpirun forwards
// SIGUSR1 to every rank at once, while SIGTERM to mpirun kills the job (the ranks get
// SIGTERM after odls_base_sigkill_timeout and SIGKILL as long after, and mpirun exits 1);
// scripts/mpirun_job.sh turns a scheduler's SIGTERM into SIGUSR1 (docs/failures.md).
void StopOnUsr1(int) { std::raise(SIGTERM); }

struct Flags {
  std::string config, out, resume;
  bool out_given = false;  // --out on the command line (else runs/<config name> or the resumed run's)
  int steps = 0;
  int world = 0;  // --world, for --dry-run
  int profile_skip = -1;  // --profile-skip (< 0: the default of the device)
  bool dry_run = false, search = false, profile = false, help = false;
  std::vector<std::string> overrides;
  std::string usage;
};

// The directory `path` is in ("." for a bare name).
std::string ParentDir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, std::max<size_t>(slash, 1));
}

// The output directory of the run a --resume path continues: a step directory's parent, an
// out directory (or its `latest` file) itself, also when its `latest` is damaged (the load
// says how); "" for a directory that is neither (a copy of a step directory) or nothing.
std::string ResumedRunDir(const std::string& path) {
  std::string argument = checkpoint::CheckpointArgument(path);
  while (argument.size() > 1 && argument.back() == '/') argument.pop_back();
  if (checkpoint::IsStepDirName(argument.substr(argument.find_last_of('/') + 1))) {
    return ParentDir(argument);
  }
  auto latest = checkpoint::LatestCheckpoint(argument);
  if (!latest.ok()) return argument;
  return latest->has_value() ? ParentDir(**latest) : "";
}

Status ParseFlags(const std::vector<std::string>& args, Flags* f) {
  std::vector<std::string> rest = args;
  SY_ASSIGN_OR_RETURN(f->overrides, TakeOverrides(rest));
  FlagSet flags(kCommand,
                "Trains the model of a config on the data of data.dir (see `switchyard prep`),\n"
                "printing a line per step, writing DIR/metrics.jsonl and checkpoints into DIR.\n"
                "Launch many ranks with `mpirun -np N`; the layout comes from the config's\n"
                "parallel section (data parallelism is what remains).");
  flags.AddPath("config", &f->config, "YAML config (configs/*.yaml)", true);
  flags.AddPath("out", &f->out,
                "output directory: metrics.jsonl and step-* checkpoints "
                "(default runs/<config name>; with --resume, the run it continues)");
  flags.AddInt("steps", &f->steps, "run at most N steps in this invocation (default: to "
                                   "train.max_steps)");
  flags.AddPath("resume", &f->resume,
                "continue from a checkpoint: a step-* directory or an "
                "output directory (its latest); any layout");
  flags.AddBool("dry-run", &f->dry_run, "print parameter counts, FLOPs per token and memory per "
                                        "rank, then exit");
  flags.AddBool("profile", &f->profile, "print where each step's time goes (attention, dense "
                                       "MLPs, router, dispatch, experts, combine, optimizer, "
                                       "communication, ...) at the end; also DIR/profile.json");
  flags.AddInt("profile-skip", &f->profile_skip,
               "with --profile: leave the first N steps out of the profile (warm-up; default "
               "3 on a GPU, whose phases are timed with CUDA events, 0 on the CPU)");
  flags.AddInt("world", &f->world, "with --dry-run: the number of ranks to plan for (default: "
                                   "the ranks launched, or on one rank the smallest world "
                                   "the layout allows, or plan.world)");
  flags.AddBool("search", &f->search, "with --dry-run: also list the layouts of the world that "
                                      "fit plan.device_memory_gib (tp, pp, ep, etp, ZeRO, "
                                      "micro-batch, recompute; the global batch kept), predicted "
                                      "peak first; automatic when the config's layout does not fit");
  std::string unused;
  flags.AddString("set", &unused, "section.key=value config override; repeatable");
  f->usage = flags.Usage();
  SY_RETURN_IF_ERROR(flags.Parse(rest));
  f->help = flags.help_requested();
  if (f->steps < 0 || (flags.IsSet("steps") && f->steps == 0)) {
    return InvalidArgument("--steps=", f->steps, " must be >= 1 (leave it out to train to "
                           "train.max_steps)");
  }
  if (flags.IsSet("world")) SY_RETURN_IF_ERROR(CheckWorldFlag("world", f->world));
  if (flags.IsSet("world") && !f->dry_run) return InvalidArgument("--world needs --dry-run");
  if (f->search && !f->dry_run) return InvalidArgument("--search needs --dry-run");
  // --dry-run trains nothing, reads no checkpoint and writes nothing: these would do nothing.
  for (const char* flag : {"resume", "steps", "out"}) {
    if (f->dry_run && flags.IsSet(flag)) {
      return InvalidArgument("--", flag, " needs training, not --dry-run (which plans the config's "
                             "layout and writes nothing)");
    }
  }
  if (f->profile && f->dry_run) return InvalidArgument("--profile needs training, not --dry-run");
  if (flags.IsSet("profile-skip") && !f->profile) {
    return InvalidArgument("--profile-skip needs --profile");
  }
  if (flags.IsSet("profile-skip") && f->profile_skip < 0) {
    return InvalidArgument("--profile-skip=", f->profile_skip, " must be >= 0");
  }
  f->out_given = flags.IsSet("out");
  if (f->out.empty() && !f->resume.empty()) f->out = ResumedRunDir(f->resume);
  if (f->out.empty()) {
    std::string stem = f->config.substr(f->config.find_last_of('/') + 1);
    stem = stem.substr(0, stem.find('.'));
    f->out = "runs/" + stem;
  }
  return OkStatus();
}

// What a run leaves in its output directory: metrics.jsonl, routing.jsonl, latest (files)
// and step-* checkpoints. Training into it again without --resume would cut its metrics and
// overwrite its checkpoints with another model's, so it is refused before anything is
// written (docs/failures.md). A run still writing there is named as such (its lock). With
// --resume (`resume`), OUT may be the resumed run's own directory, where it goes on.
Status CheckNoPreviousRun(const std::string& out, const std::string& resume) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(out, ec)) return OkStatus();
  const std::string resumed = resume.empty() ? "" : ResumedRunDir(resume);
  if (!resumed.empty() && fs::equivalent(out, resumed, ec)) return OkStatus();
  // A --resume path that does not exist fails its load first (exit 1), writing nothing.
  if (!resume.empty() && !fs::exists(checkpoint::CheckpointArgument(resume), ec)) {
    return OkStatus();
  }
  std::vector<std::string> found;
  int64_t step_dirs = 0;
  for (const auto& entry : fs::directory_iterator(out, ec)) {
    const std::string name = entry.path().filename().string();
    if (checkpoint::IsStepDirName(name) && entry.is_directory(ec)) ++step_dirs;
    const bool run_file =
        name == "metrics.jsonl" || name == "routing.jsonl" || name == checkpoint::kLatestFile;
    if (run_file && entry.is_regular_file(ec)) found.push_back(name);
  }
  if (found.empty() && step_dirs == 0) return OkStatus();
  SY_RETURN_IF_ERROR(DirectoryLock::Acquire(out).status());  // released at once
  std::sort(found.begin(), found.end());
  if (step_dirs > 0) {
    found.push_back(StrCat(step_dirs, " step-* checkpoint", step_dirs > 1 ? "s" : ""));
  }
  std::string listed;
  for (const std::string& item : found) listed += (listed.empty() ? "" : ", ") + item;
  if (!resume.empty()) {
    return FailedPrecondition(out, ": holds another run (", listed, ") than the one --resume ",
                              resume, " continues",
                              resumed.empty() ? "" : StrCat(" (", resumed, ")"), "; ",
                              resumed.empty() ? "train" : "leave out --out to go on there, train",
                              " into another --out, or remove it first");
  }
  const bool saved =
      step_dirs > 0 || std::count(found.begin(), found.end(), checkpoint::kLatestFile) > 0;
  if (!saved) {  // a run that stopped before its first checkpoint: nothing to resume
    return FailedPrecondition(out, ": holds the logs of a run that saved no checkpoint (", listed,
                              "), so there is nothing to resume; remove them or train into "
                              "another --out");
  }
  return FailedPrecondition(out, ": holds a previous run (", listed,
                            "); continue it with --resume ", out,
                            ", train into another --out, or remove it first");
}

// The step a --resume path continues at, read from its step directory's name (the load
// checks the trainer state against it), or for a directory named otherwise (a copy) from
// its trainer_state.json; -1 when the path names none (the load says why).
int64_t ResumeStep(const std::string& path) {
  const std::string argument = checkpoint::CheckpointArgument(path);
  auto latest = checkpoint::LatestCheckpoint(argument);
  std::string dir = latest.ok() && latest->has_value() ? **latest : argument;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string name = dir.substr(dir.find_last_of('/') + 1);
  if (checkpoint::IsStepDirName(name)) return std::atoll(name.c_str() + 5);
  auto text = ReadFile(dir + "/" + checkpoint::kTrainerStateFile);
  if (!text.ok()) return -1;
  const nlohmann::json state = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  const bool has_step = state.is_object() && state.contains("step") &&
                        state["step"].is_number_integer() && state["step"].get<int64_t>() >= 0;
  return has_step ? state["step"].get<int64_t>() : -1;
}

// What this run trains: nothing when a resumed checkpoint is already at train.max_steps
// (*done set, exit 0 as Megatron and torchtitan do); a --profile-skip that leaves no step
// to profile is an error.
Status PlanSteps(const Flags& f, const config::Config& config, int64_t start, bool* done) {
  const int64_t max_steps = config.train.max_steps;
  const int64_t end = f.steps > 0 ? std::min(max_steps, start + f.steps) : max_steps;
  *done = start >= max_steps;
  if (*done || !f.profile) return OkStatus();
  const bool gpu = !config.runtime.device.is_cpu();
  const int64_t skip = f.profile_skip >= 0 ? f.profile_skip
                       : gpu               ? train::Trainer::kGpuProfileSkipSteps
                                           : 0;
  if (skip >= end - start) {
    return InvalidArgument("--profile-skip=", skip, f.profile_skip < 0 ? " (the GPU default)" : "",
                           " leaves nothing to profile: this run trains ", end - start,
                           " step(s), ", start, " -> ", end, "; lower it or train more steps");
  }
  return OkStatus();
}

// Rank 0 says so when a resumed checkpoint is at train.max_steps already (*done; it is
// verified first, as its load would be). Returns the exit code of a failure, else kExitOk.
int CheckSteps(dist::Communicator& world, const Flags& f, const config::Config& config,
               bool* done) {
  int64_t start = f.resume.empty() ? 0 : std::max<int64_t>(ResumeStep(f.resume), 0);
  if (!f.resume.empty() && start >= config.train.max_steps) {
    auto report = checkpoint::VerifyCheckpoint(f.resume);
    if (int rc = Agree(world, report.status(), kExitFailure, kCommand); rc != kExitOk) return rc;
    start = report->step;
  }
  if (int rc = Agree(world, PlanSteps(f, config, start, done), kExitUsage, kCommand);
      rc != kExitOk || !*done) {
    return rc;
  }
  if (world.rank() == 0) {
    std::printf(
        "nothing to train: %s is at step %lld and train.max_steps is %lld; set it "
        "above %lld (--set train.max_steps=N) to train on\n",
        f.resume.c_str(), static_cast<long long>(start),
        static_cast<long long>(config.train.max_steps), static_cast<long long>(start));
  }
  return kExitOk;
}

// --dry-run: the report; with plan.device_memory_gib the fit of the largest rank (exit 1
// when it does not fit) and, with --search or when it does not fit, the layouts that do.
int DryRun(dist::Communicator& world, const Flags& f, const config::Config& config) {
  const int planned = f.world > 0 ? f.world
                      : world.size() > 1 ? world.size()
                      : config.plan.world > 0 ? static_cast<int>(config.plan.world)
                                              : static_cast<int>(config.parallel.SmallestWorld());
  Status valid = planned <= kMaxWorld ? config.Validate(planned)
                                      : InvalidArgument("plan.world=", planned, " is above ",
                                                        kMaxWorld, " ranks (see --world)");
  if (valid.ok()) valid = config.ValidateModel();
  if (valid.ok() && f.search && config.plan.device_memory_gib <= 0) {
    valid = InvalidArgument("--search needs plan.device_memory_gib > 0 (the memory of one device "
                            "in GiB, e.g. --set plan.device_memory_gib=80)");
  }
  if (int rc = Agree(world, valid, kExitUsage, kCommand); rc != kExitOk) return rc;
  // A pipeline whose action lists fail their check (a bug in a schedule) exits 1.
  Status check;
  std::string report = plan::DryRunReport(config, planned, &check);
  auto mesh = dist::Mesh::Create(planned, config.parallel.MeshSizes(), config.parallel.order);
  if (mesh.ok()) {
    const plan::DeviceFit fit = plan::PredictDeviceFit(config, *mesh);
    report += plan::DeviceFitReport(config, fit);
    if (f.search || !fit.fits()) {
      report += plan::LayoutSearchReport(plan::SearchLayouts(config, planned), planned,
                                         config.plan.device_memory_gib, 8);
    }
    if (check.ok() && !fit.fits()) {
      check = FailedPrecondition("the largest rank's predicted peak, ", plan::FormatBytes(fit.peak),
                                 ", exceeds plan.device_memory_gib=", config.plan.device_memory_gib);
    }
  }
  if (world.rank() == 0) std::printf("%s", report.c_str());
  return Agree(world, check, kExitFailure, kCommand);
}

int Run(const std::vector<std::string>& args) {
  auto world = dist::WorldCommunicator();
  Flags f;
  if (int rc = Agree(*world, ParseFlags(args, &f), kExitUsage, kCommand); rc != kExitOk) return rc;
  if (f.help) {
    if (world->rank() == 0) std::printf("%s", f.usage.c_str());
    return kExitOk;
  }
  auto config = config::LoadConfig(f.config, f.overrides);
  if (int rc = Agree(*world, config.status(), kExitUsage, kCommand); rc != kExitOk) return rc;
  if (int rc = Agree(*world, CheckSameConfig(*world, *config), kExitUsage, kCommand);
      rc != kExitOk) {
    return rc;
  }
  if (f.dry_run) {
    return DryRun(*world, f, *config);
  }
  // A scheduler's signal while the run starts stops it after its first step, saved.
  train::StopSignals::CatchEarly(f.resume);
  std::signal(SIGUSR1, StopOnUsr1);
  if (std::getenv("SWITCHYARD_TEST_SIGNAL_AT_START") != nullptr) std::raise(SIGTERM);  // tests
  // Nothing is written into a previous run's directory unless it is resumed (after the
  // config's own checks, which Trainer::Create repeats, so that a bad layout says so first).
  Status fresh = config->Validate(world->size());
  if (fresh.ok()) fresh = config->ValidateModel();
  if (fresh.ok() && world->rank() == 0) fresh = CheckNoPreviousRun(f.out, f.resume);
  if (int rc = Agree(*world, fresh, kExitUsage, kCommand); rc != kExitOk) return rc;
  bool done = false;
  if (int rc = CheckSteps(*world, f, *config, &done); rc != kExitOk || done) return rc;
  if (world->rank() == 0) {
    std::printf("resolved config (%s):\n%s\n", f.config.c_str(), config->ToYaml().c_str());
  }
  auto trainer = train::Trainer::Create(*config, f.out, *world);
  // Missing or damaged data (no data dir, an unreadable shard, a bad token id in the
  // validation split, a checksum) is a failure (exit 1, as in eval), not usage.
  const absl::StatusCode create_status = trainer.status().code();
  const int create_code =
      create_status == absl::StatusCode::kDataLoss || create_status == absl::StatusCode::kNotFound
          ? kExitFailure
          : kExitUsage;
  if (int rc = Agree(*world, trainer.status(), create_code, kCommand); rc != kExitOk) return rc;
  if (f.profile) (*trainer)->EnableProfile(f.profile_skip);
  if (!f.resume.empty()) {
    Status s = (*trainer)->Resume(f.resume);
    if (int rc = Agree(*world, s, kExitFailure, kCommand); rc != kExitOk) return rc;
  }
  if (const char* hook = std::getenv("SWITCHYARD_TEST_NAN_GRAD"); hook != nullptr) {
    // Tests only: "STEP:NAME[:EXPERT]" writes a NaN into that gradient at that step.
    const std::string text = hook;
    const size_t a = text.find(':'), b = text.find(':', a + 1);
    (*trainer)->InjectNanGrad(std::atoll(text.substr(0, a).c_str()),
                              text.substr(a + 1, b == std::string::npos ? b : b - a - 1),
                              b == std::string::npos ? -1 : std::atoll(text.substr(b + 1).c_str()));
  }
  Status s = (*trainer)->Run(f.steps);
  using Reason = train::Trainer::StopReason;
  const Reason reason = (*trainer)->stop_reason();
  if (int rc = Agree(*world, s, reason == Reason::kNonFinite ? kExitNonFinite : kExitFailure,
                     kCommand);
      rc != kExitOk) {
    return rc;
  }
  // Stopped by a signal with its checkpoint saved (every rank agreed on the step).
  return reason == Reason::kSignal ? kExitPreempted : kExitOk;
}

}  // namespace

int RunTrain(const std::vector<std::string>& args) {
  return RunInProcess(kCommand, Run, args);
}

}  // namespace switchyard::cli
