// The run configuration: YAML files in configs/ parsed into typed sections, with
// `--set section.key=value` overrides, validated in one place. Every error is one line
// naming the file, the key and the bad value:
//   configs/x.yaml: moe.top_k: expected an integer, got 'two'
//   configs/x.yaml: unknown key 'moe.topk'
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/dist/mesh.h"
#include "engine/model/model_config.h"
#include "engine/data/blend.h"
#include "engine/config/parallel_config.h"
#include "engine/config/runtime_config.h"
#include "engine/config/train_config.h"
#include "moe/moe_config.h"

namespace switchyard::config {

// data: where `switchyard prep` wrote the token shards (docs/data.md).
struct DataConfig {
  std::string dir = "data/fortunes";  // relative to the working directory
  // A weighted blend of prep outputs ([{dir: a, weight: 0.7}, {dir: b, weight: 0.3}]);
  // when not empty it replaces `dir`.
  std::vector<data::DataPath> paths;
  // Read every shard once at the start (checksums, token ids); false: each rank reads
  // only the windows it trains on.
  bool verify = true;

  // Names the key and the value it rejects.
  Status Validate() const;
  // The folder named in messages: `dir`, or the blend's first dataset.
  const std::string& FirstDir() const { return paths.empty() ? dir : paths[0].dir; }
};

// plan: what `switchyard train --dry-run` plans for (docs/recipes.md); training ignores it.
struct PlanConfig {
  // The ranks the dry-run plans for when --world is not given and one process runs
  // (0: the smallest world the layout allows).
  int64_t world = 0;
  // The memory of one device in GiB (80 for an A100 80GB or an H100); > 0: the dry-run
  // checks the largest rank's predicted peak against it, prints the margin, and exits 1
  // when it does not fit. 0: no check.
  float device_memory_gib = 0;

  // Names the key and the value it rejects.
  Status Validate() const;
};

// logging: what a run writes besides the progress line (docs/config.md).
struct LoggingConfig {
  // The per-expert token counts (before and after dropping) and the expert biases go to
  // routing.jsonl every N steps (step % N == 0) and always at the last step of a run;
  // 0 = only at the last step. The per-layer scalars (dropped fraction, entropy, aux, z,
  // loads, max violation, cv) are in metrics.jsonl every step. A run stopped by a signal
  // also logs the step it stopped after.
  int64_t routing_every = 10;
};

struct Config {
  model::ModelConfig model;
  moe::MoEConfig moe;  // moe.d_model mirrors model.d_model
  ParallelConfig parallel;
  DataConfig data;
  TrainConfig train;   // optimizer, LR schedule, clipping, gradient buckets
  RuntimeConfig runtime;
  PlanConfig plan;
  LoggingConfig logging;
  // The required keys (docs/config.md) the parsed text and its overrides did not set;
  // ParseConfig fills it and Validate names the first ("model.d_model is required").
  std::vector<std::string> unset_required;

  // Sections and fields together, plus what the world size allows ("parallel.ep=3 does
  // not divide ..."). world <= 0 skips the layout checks.
  Status Validate(int world = 0) const;
  // The decoder's sizes, for the commands that build one (`moe-layer` builds a layer only):
  // a required key the config did not set is named ("model.seq_len is required"), a value
  // given is ModelConfig::Validate's ("model.seq_len=0 must be positive").
  Status ValidateModel() const;
  // The resolved config as YAML, every key with its value (defaults included).
  std::string ToYaml() const;
};

// runtime.cuda_graphs=true: one rank (world <= 0 skips that check), and a step that does not
// wait for the device: moe.dispatch_counts device, moe.aux_loss_scope group,
// moe.overlap_chunks 1. One error naming the key otherwise. Part of Validate.
Status CheckCudaGraphs(const Config& config, int world);

// A key whose value differs between two configs, with both values as ToYaml prints them.
struct KeyDifference {
  std::string key;  // "model.d_model"
  std::string a, b;
};
// The first key, in the key tables' order, that `compared(section, key)` selects and whose
// values differ between `a` and `b`; nullopt when they agree on every selected key.
std::optional<KeyDifference> FirstDifference(
    const Config& a, const Config& b,
    const std::function<bool(const std::string& section, const std::string& key)>& compared);

// Parses YAML text; `source` names it in errors (a path or "<string>"). Overrides are
// "section.key=value" strings applied on top of the text, in order.
StatusOr<Config> ParseConfig(const std::string& yaml, const std::string& source,
                             const std::vector<std::string>& overrides = {});
// Reads and parses a file. Refused: a directory, an empty file (or one of comments only), and
// (as ParseConfig) non-scalar or duplicate keys, naming the lines.
StatusOr<Config> LoadConfig(const std::string& path,
                            const std::vector<std::string>& overrides = {});

}  // namespace switchyard::config
