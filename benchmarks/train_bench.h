// What the training benchmarks share (tp_comm_perf, zero_perf, pipeline_perf): their
// common flags, a synthetic corpus prepared by rank 0 into a temporary directory, a
// counting copy of the world, trainers made and removed per case, and steps run with the
// trainer's progress lines kept out of the table.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/harness.h"
#include "engine/config/config.h"
#include "engine/core/status.h"
#include "engine/dist/communicator.h"
#include "engine/dist/counting_communicator.h"
#include "engine/train/trainer.h"

namespace switchyard::bench {

// Prepares a synthetic corpus (random syllable words, vocabulary `vocab`) on rank 0 under a
// fresh temporary directory named by rank 0's pid; returns that directory on every rank
// (its "data" subdirectory holds the shards). Collective over world.
StatusOr<std::string> MakeSyntheticData(dist::Communicator& world, const std::string& tag, int vocab);

// trainer.Run(steps) with stdout sent to /dev/null meanwhile.
Status RunQuietly(train::Trainer& trainer, int64_t steps);

// The median (Harness::MedianOfMax), fastest and slowest step of per-step seconds, each
// the slowest rank's.
struct StepSeconds {
  double median = 0, min = 0, max = 0;
};
StepSeconds SummarizeSteps(Harness& h, const std::vector<double>& step_s);

// A training benchmark's shared flags, data and runs.
class TrainBench {
 public:
  // The defaults of --steps and --grad_accum.
  TrainBench(int steps, int grad_accum) : steps_(steps), grad_accum_(grad_accum) {}

  // Declares --config, --data, --steps and --grad_accum (its help says what the micro-batches
  // are in this benchmark).
  void AddFlags(cli::FlagSet& flags, const std::string& grad_accum_help);
  // Declares --set (after the benchmark's own flags: --help lists it last).
  void AddSetFlag(cli::FlagSet& flags);

  // The synthetic corpus (unless --data names one) under a temporary directory named after
  // `tag`, and the counting world. Collective.
  Status Prepare(Harness& h, const std::string& tag);
  // The config file with data.dir, `overrides`, the batch and step settings, then --set.
  StatusOr<config::Config> LoadConfig(const std::vector<std::string>& overrides) const;
  // A trainer on the counting world writing under the temporary directory `out_name`,
  // after its warm-up step.
  StatusOr<std::unique_ptr<train::Trainer>> StartTrainer(const config::Config& config,
                                                         const std::string& out_name);
  // Runs --steps steps one at a time: before() ahead of each, after() once it is done.
  // Returns each step's seconds on this rank.
  StatusOr<std::vector<double>> RunSteps(train::Trainer& trainer,
                                         const std::function<void()>& before,
                                         const std::function<void()>& after);
  // Drops the trainer, waits for every rank and removes its directory (rank 0).
  void EndTrainer(std::unique_ptr<train::Trainer> trainer, const std::string& out_name);
  // Removes the synthetic corpus (rank 0), if this run made one.
  void Cleanup(Harness& h);

  // The world every group the trainer splits from counts its traffic.
  dist::CountingCommunicator& world() { return *world_; }
  int steps() const { return steps_; }
  int grad_accum() const { return grad_accum_; }
  const std::string& config_path() const { return config_path_; }

 private:
  // Where the run `out_name` writes: under the job's temporary directory when there is one.
  std::string RunDir(const std::string& out_name) const;

  std::string config_path_ = "configs/switch-tiny.yaml", data_dir_, sets_, tmp_;
  int steps_, grad_accum_;
  std::unique_ptr<dist::CountingCommunicator> world_;
};

}  // namespace switchyard::bench
