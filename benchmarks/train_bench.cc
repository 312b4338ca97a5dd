// The training benchmarks' shared flags, data and runs; see train_bench.h.
#include "benchmarks/train_bench.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "engine/data/prep.h"

namespace switchyard::bench {
namespace {

namespace fs = std::filesystem;

Status WriteAndPrepare(const std::string& dir, int vocab) {
  const fs::path text = fs::path(dir) / "corpus";
  fs::create_directories(text);
  std::mt19937 rng(7);
  const char* syllables[] = {"ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "pe", "du"};
  std::ofstream out(text / "synthetic.txt");
  for (int doc = 0; doc < 2000; ++doc) {
    for (int w = 0; w < 60; ++w) {
      const int n = 1 + static_cast<int>(rng() % 3);
      for (int s = 0; s < n; ++s) out << syllables[rng() % 10];
      out << (w % 12 == 11 ? "\n" : " ");
    }
    out << "\n%\n";
  }
  out.close();
  data::PrepOptions options;
  options.out_dir = (fs::path(dir) / "data").string();
  options.files = {(text / "synthetic.txt").string()};
  options.vocab_size = vocab;
  return data::Prepare(options).status();
}

}  // namespace

StatusOr<std::string> MakeSyntheticData(dist::Communicator& world, const std::string& tag, int vocab) {
  Tensor pid = Tensor::FromVector<int64_t>({static_cast<int64_t>(::getpid())}, {1});
  world.Broadcast(pid, 0);
  const std::string dir =
      (fs::temp_directory_path() / (tag + "_" + std::to_string(pid.ToVector<int64_t>()[0]))).string();
  Status made = OkStatus();
  if (world.rank() == 0) made = WriteAndPrepare(dir, vocab);
  Tensor ok = Tensor::FromVector<int32_t>({made.ok() ? 1 : 0}, {1});
  world.Broadcast(ok, 0);
  if (ok.ToVector<int32_t>()[0] == 0) {
    return made.ok() ? FailedPrecondition("synthetic data: rank 0 failed") : made;
  }
  return dir;
}

Status RunQuietly(train::Trainer& trainer, int64_t steps) {
  std::fflush(stdout);
  const int saved = ::dup(1);
  std::FILE* null = std::freopen("/dev/null", "w", stdout);
  (void)null;
  Status ran = trainer.Run(steps);
  std::fflush(stdout);
  ::dup2(saved, 1);
  ::close(saved);
  return ran;
}

StepSeconds SummarizeSteps(Harness& h, const std::vector<double>& step_s) {
  std::vector<double> sorted = step_s;
  std::sort(sorted.begin(), sorted.end());
  StepSeconds s;
  s.median = h.MedianOfMax(step_s);
  s.min = h.Max(sorted.front());
  s.max = h.Max(sorted.back());
  return s;
}

void TrainBench::AddFlags(cli::FlagSet& flags, const std::string& grad_accum_help) {
  flags.AddString("config", &config_path_, "the model config (switch-tiny)");
  flags.AddString("data", &data_dir_, "prepared data (switchyard prep); default: a synthetic corpus");
  flags.AddInt("steps", &steps_, "timed training steps after one warm-up step");
  flags.AddInt("grad_accum", &grad_accum_, grad_accum_help);
}

void TrainBench::AddSetFlag(cli::FlagSet& flags) {
  flags.AddString("set", &sets_, "comma-separated config overrides (section.key=value,...)");
}

Status TrainBench::Prepare(Harness& h, const std::string& tag) {
  if (data_dir_.empty()) {
    SY_ASSIGN_OR_RETURN(tmp_, MakeSyntheticData(h.world(), tag, 2000));
    data_dir_ = (fs::path(tmp_) / "data").string();
  }
  std::vector<int> all(h.ranks());
  for (int r = 0; r < h.ranks(); ++r) all[r] = r;
  world_ = std::make_unique<dist::CountingCommunicator>(h.world().Split({all}));
  return OkStatus();
}

StatusOr<config::Config> TrainBench::LoadConfig(const std::vector<std::string>& overrides) const {
  std::vector<std::string> all = {"data.dir=" + data_dir_};
  all.insert(all.end(), overrides.begin(), overrides.end());
  for (const std::string& s : {"train.grad_accum=" + std::to_string(grad_accum_),
                               std::string("train.eval_every=0"),
                               "train.max_steps=" + std::to_string(steps_ + 1),
                               std::string("train.warmup_steps=0")}) {
    all.push_back(s);
  }
  for (const std::string& s : SplitList(sets_)) all.push_back(s);
  return config::LoadConfig(config_path_, all);
}

std::string TrainBench::RunDir(const std::string& out_name) const {
  // Under this job's own directory (named after rank 0's pid) when it made one, so that two
  // jobs at once (ctest -j) never share a run directory.
  return ((tmp_.empty() ? fs::temp_directory_path() : fs::path(tmp_)) / out_name).string();
}

StatusOr<std::unique_ptr<train::Trainer>> TrainBench::StartTrainer(const config::Config& config,
                                                                   const std::string& out_name) {
  const std::string out = RunDir(out_name);
  SY_ASSIGN_OR_RETURN(std::unique_ptr<train::Trainer> trainer,
                      train::Trainer::Create(config, out, *world_));
  SY_RETURN_IF_ERROR(RunQuietly(*trainer, 1));  // warm-up
  return trainer;
}

StatusOr<std::vector<double>> TrainBench::RunSteps(train::Trainer& trainer,
                                                   const std::function<void()>& before,
                                                   const std::function<void()>& after) {
  std::vector<double> step_s;
  for (int s = 0; s < steps_; ++s) {
    before();
    const double t0 = Now();
    SY_RETURN_IF_ERROR(RunQuietly(trainer, 1));
    step_s.push_back(Now() - t0);
    after();
  }
  return step_s;
}

void TrainBench::EndTrainer(std::unique_ptr<train::Trainer> trainer, const std::string& out_name) {
  trainer.reset();
  world_->Barrier();
  if (world_->rank() == 0) {
    std::error_code ec;
    fs::remove_all(RunDir(out_name), ec);
  }
}

void TrainBench::Cleanup(Harness& h) {
  if (h.rank() == 0 && !tmp_.empty()) {
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }
}

}  // namespace switchyard::bench
