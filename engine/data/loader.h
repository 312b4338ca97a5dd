// The deterministic data loader: batches of token windows from one `switchyard prep`
// folder or a weighted blend of several (data.paths), read from memory-mapped shards.
//
// Each dataset's training split is one token stream (its training documents in index
// order, each ending with </s>) cut into W_d = floor((N_d - 1) / seq_len) windows: window w
// is the seq_len + 1 tokens starting at w * seq_len. Sequences are numbered globally:
// sequence g = step * global_batch_size + i (0 <= i < global_batch_size). The blend
// (blend.h) makes g sequence k of dataset d (one dataset: d = 0, k = g), which is window
// P_{d,e}(k mod W_d) of epoch e = k / W_d, where P_{d,e} is a Philox-keyed permutation of
// [0, W_d) (a 4-round Feistel network with cycle walking) under (seed, d, epoch).
// Data-parallel rank r takes i in [r * B/dp, (r + 1) * B/dp), micro-batch m the next
// micro_batch_size of those. So a batch depends only on (seed, step, rank, micro-batch,
// row): the union of the dp ranks' batches at a step is the same set of sequences for
// every dp size, every window of a dataset is seen once per epoch of that dataset, and a
// run resumes exactly from its step alone.
//
// Validation: the datasets' validation streams one after the other; windows k * seq_len
// of each, in order, batch b of rank r holding windows (b * dp + r) * micro_batch_size +
// [0, micro_batch_size) of that sequence of windows.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/data/blend.h"
#include "engine/data/dataset.h"
#include "engine/data/index.h"

namespace switchyard::data {

// Where the data is and how batches are cut.
struct LoaderOptions {
  std::string dir;                // a `switchyard prep` output folder (or use `paths`)
  std::vector<DataPath> paths;    // a blend of several; `dir` must then be empty
  int64_t seq_len = 0;            // tokens per row; a window is seq_len + 1 tokens
  int64_t micro_batch_size = 1;   // rows per micro-batch
  int64_t global_batch_size = 1;  // rows per step over all dp ranks
  int dp_rank = 0;                // this rank's index in its data-parallel group
  int dp_size = 1;                // data-parallel group size
  uint64_t seed = 0;              // which permutation of the windows
  bool verify = true;             // read every shard once at Open (checksum, token ids);
                                  // false: each rank reads only the windows it uses, and
                                  // token ids are checked as they are read

  // Names the option and value it rejects; global_batch_size must be a multiple of
  // dp_size * micro_batch_size.
  Status Validate() const;
};

// One micro-batch. Every tensor is (micro_batch_size, seq_len) int32 on the host.
struct Batch {
  Tensor inputs;                   // window tokens 0 .. seq_len-1
  Tensor targets;                  // window tokens 1 .. seq_len (inputs shifted by one)
  Tensor labels;                   // label id (DataLoader::labels()) of each input token's document
  std::vector<int64_t> sequences;  // per row: global sequence g (validation: window index)
  std::vector<int64_t> offsets;    // per row: first token's offset in its split's stream
  std::vector<int> datasets;       // per row: which dataset of the blend (0 without one)
  // Trailing rows that only pad the last batches of the whole validation split to full
  // micro-batches on every rank: inputs </s>, targets -1 (ignored by the loss); their
  // sequences are the window numbers past the split (the same on any layout: they key the
  // routing noise), their offsets -1.
  int64_t padding = 0;
};

// A permutation of [0, n) keyed by (seed, stream): x -> PermuteIndex(x, n, seed, stream)
// is a bijection of [0, n). A 4-round Feistel network with cycle walking.
uint64_t PermuteIndex(uint64_t x, uint64_t n, uint64_t seed, uint64_t stream);

class DataLoader {
 public:
  // Reads the index of every dataset and maps its shards, checking them (the header, the
  // length, the index's counts; with options.verify the checksum and every token id).
  // The datasets of a blend must share one tokenizer (equal tokenizer.model files).
  // Errors name the path and what is wrong; a split too short for one window says how
  // many tokens it has.
  static StatusOr<DataLoader> Open(const LoaderOptions& options);

  // Micro-batches per step on each rank: global_batch_size / (dp_size * micro_batch_size).
  int64_t micro_batches_per_step() const;
  // Micro-batch `micro` (< micro_batches_per_step()) of this rank at `step` (>= 0).
  // Without options.verify, a token id outside the vocabulary is the DataLoss of
  // TokenStream::Copy (the shard file, the token's index in it, the id, the vocabulary size).
  StatusOr<Batch> ReadBatch(int64_t step, int64_t micro) const;
  // ReadBatch for callers that checked the step first (CheckStep) or opened with
  // options.verify: a bad token id stops the process with ReadBatch's message.
  Batch GetBatch(int64_t step, int64_t micro) const;
  // Reads this rank's micro-batches of `step` and returns the first ReadBatch error; OK at
  // once with options.verify (Open checked every token). Training calls it before a step,
  // agreed over the ranks, so that a bad token ends the run with one error line.
  Status CheckStep(int64_t step) const;
  // Up to `max_batches` validation micro-batches of this rank, the same count on every
  // rank; fails when the validation splits hold fewer than dp_size * micro_batch_size
  // windows. max_batches <= 0: the whole split, every window once on any layout: the last
  // batches are padded (Batch::padding) so that every rank runs as many, and the windows
  // fall into the same micro-batches (routing groups) whatever dp_size is.
  StatusOr<std::vector<Batch>> ValidationBatches(int64_t max_batches) const;

  // The options it was opened with, and the first dataset's parsed index.json.
  const LoaderOptions& options() const { return options_; }
  const Index& index() const { return datasets_[0]->index; }
  // Datasets in the blend (1 without one).
  int datasets() const { return static_cast<int>(datasets_.size()); }
  // Label names over every dataset, sorted; Batch::labels holds indexes into this.
  const std::vector<std::string>& labels() const { return labels_; }
  // The tokenizer's vocabulary size and end-of-document id, from index.json.
  int vocab_size() const { return index().vocab_size; }
  int eos_id() const { return index().eos_id; }
  // Windows in a dataset's training stream (its sequences per epoch).
  int64_t train_windows(int dataset = 0) const;
  // Tokens in the training and validation streams of every dataset.
  int64_t train_tokens() const;
  int64_t val_tokens() const;

 private:
  DataLoader() = default;
  // Fills row `row` of `batch` from `stream` at `offset` (errors: TokenStream::Copy's).
  Status FillRow(const TokenStream& stream, int64_t offset, int64_t row, Batch* batch) const;
  Batch MakeBatch() const;
  // Fills row `row` of `batch`, window number k past the split, with padding (Batch::padding).
  void PadRow(int64_t row, int64_t k, Batch* batch) const;

  LoaderOptions options_;
  std::vector<std::shared_ptr<Dataset>> datasets_;
  std::vector<std::string> labels_;
  std::shared_ptr<BlendSchedule> blend_;
};

}  // namespace switchyard::data
