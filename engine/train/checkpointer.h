// When and where the trainer's checkpoints go (torchtitan's CheckpointManager, whose
// save(step, last_step) decides itself whether to save): every train.checkpoint_every
// steps, after the run's last step and after the step a SIGTERM/SIGINT stopped the run at.
// The output directory is made ready before the first save, and a run that stops without
// saving (non-finite numbers) names what it leaves. The save itself is
// engine/checkpoint's SaveCheckpoint, given the trainer's state (Trainer::Save).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "engine/core/file.h"
#include "engine/core/status.h"

namespace switchyard::train {

class Checkpointer {
 public:
  // Checkpoints under out_dir (step-NNNNNNNN directories and `latest`); every:
  // train.checkpoint_every (0: none but the last and the stopping step).
  Checkpointer(std::string out_dir, int64_t every) : out_dir_(std::move(out_dir)), every_(every) {}

  // Creates the output directory, takes its lock for as long as this Checkpointer lives
  // (DirectoryLock: a second process writing the same directory is refused) and removes the
  // temporary directories of saves that did not finish, printing each. Rank 0 only (the
  // others do nothing).
  Status Prepare(bool is_root);
  // Whether the state after `steps_done` steps is saved: a multiple of every, the run's
  // last step (last_step), or the step a signal stopped the run at (stopped).
  bool ShouldSave(int64_t steps_done, bool last_step, bool stopped) const;
  // What the output directory keeps: "the latest checkpoint stays DIR", or "there is no
  // checkpoint yet".
  std::string Latest() const;
  // What Latest() says when nothing has been saved.
  static constexpr const char* kNoCheckpointYet = "there is no checkpoint yet";
  const std::string& out_dir() const { return out_dir_; }

 private:
  std::string out_dir_;
  int64_t every_;
  DirectoryLock lock_;
};

}  // namespace switchyard::train
