// The deterministic data loader: batches of token windows from a `switchyard prep` folder.
//
// The training split is one token stream (the training documents in index order, each
// ending with </s>) cut into W = floor((N - 1) / seq_len) windows: window w is the
// seq_len + 1 tokens starting at w * seq_len. Sequences are numbered globally:
// sequence g = step * global_batch_size + i (0 <= i < global_batch_size) is window
// P_e(g mod W) of epoch e = g / W, where P_e is a Philox-keyed permutation of [0, W)
// (a 4-round Feistel network with cycle walking) under (seed, epoch). Data-parallel rank r
// takes i in [r * B/dp, (r + 1) * B/dp), micro-batch m the next micro_batch_size of those.
// So a batch depends only on (seed, step, rank, micro-batch, row), the union of the dp
// ranks' batches at a step is the same set of sequences for every dp size, and every
// window is seen once per epoch.
//
// Validation: windows k * seq_len of the validation stream, in order, batch b of rank r
// holding windows (b * dp + r) * micro_batch_size + [0, micro_batch_size).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/train/data/index.h"

namespace switchyard::data {

// Where the data is and how batches are cut.
struct LoaderOptions {
  std::string dir;                // a `switchyard prep` output folder
  int64_t seq_len = 0;            // tokens per row; a window is seq_len + 1 tokens
  int64_t micro_batch_size = 1;   // rows per micro-batch
  int64_t global_batch_size = 1;  // rows per step over all dp ranks
  int dp_rank = 0;                // this rank's index in its data-parallel group
  int dp_size = 1;                // data-parallel group size
  uint64_t seed = 0;              // which permutation of the windows

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
};

// A permutation of [0, n) keyed by (seed, stream): x -> PermuteIndex(x, n, seed, stream)
// is a bijection of [0, n). A 4-round Feistel network with cycle walking.
uint64_t PermuteIndex(uint64_t x, uint64_t n, uint64_t seed, uint64_t stream);

class DataLoader {
 public:
  // Reads the index and every shard and checks them (the header, the length, the
  // checksum, token ids below the vocabulary, the index's counts). Errors name the path
  // and what is wrong; a split too short for one window says how many tokens it has.
  static StatusOr<DataLoader> Open(const LoaderOptions& options);

  // Micro-batches per step on each rank: global_batch_size / (dp_size * micro_batch_size).
  int64_t micro_batches_per_step() const;
  // Micro-batch `micro` (< micro_batches_per_step()) of this rank at `step` (>= 0).
  Batch GetBatch(int64_t step, int64_t micro) const;
  // Up to `max_batches` (<= 0: all) validation micro-batches of this rank, the same count
  // on every rank. Fails when the validation split holds fewer than
  // dp_size * micro_batch_size windows.
  StatusOr<std::vector<Batch>> ValidationBatches(int64_t max_batches) const;

  // The options it was opened with, and the parsed index.json.
  const LoaderOptions& options() const { return options_; }
  const Index& index() const { return index_; }
  // Label names; Batch::labels holds indexes into this.
  const std::vector<std::string>& labels() const { return index_.labels; }
  // The tokenizer's vocabulary size and end-of-document id, from index.json.
  int vocab_size() const { return index_.vocab_size; }
  int eos_id() const { return index_.eos_id; }
  // Windows in the training stream (sequences per epoch).
  int64_t train_windows() const;
  // Tokens in the training and validation streams.
  int64_t train_tokens() const { return static_cast<int64_t>(train_.tokens.size()); }
  int64_t val_tokens() const { return static_cast<int64_t>(val_.tokens.size()); }

 private:
  // One split as a stream: its tokens and where each document starts.
  struct Stream {
    std::vector<int32_t> tokens;
    std::vector<int64_t> doc_starts;  // ascending
    std::vector<int32_t> doc_labels;  // per document
  };

  DataLoader() = default;
  // Fills row `row` of `batch` from `stream` at `offset`.
  void FillRow(const Stream& stream, int64_t offset, int64_t row, Batch* batch) const;
  Batch MakeBatch() const;

  LoaderOptions options_;
  Index index_;
  Stream train_;
  Stream val_;
};

}  // namespace switchyard::data
