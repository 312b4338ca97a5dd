// `switchyard prep`: text -> tokenizer -> token shards + index.json (docs/data.md).
//
//   1. read the corpus into labelled documents (corpus.h), optionally keeping at most
//      N documents per label (a seeded sample, in corpus order);
//   2. assign document i to validation when UniformAt({seed, StreamId("data.prep.split")},
//      i) < val_fraction, else to training;
//   3. train the BPE tokenizer on the training documents (tokenizer.h);
//   4. encode every document and append </s>;
//   5. write the shards (shards.h), tokenizer.model and index.json (index.h).
// Everything is a function of the inputs and the options: two runs give identical bytes.
//
// The output folder is replaced whole or not at all: files are written into a sibling
// "<out>.tmp-<pid>" and renamed into place at the end. An existing folder is only
// replaced when it holds a previous prep output and `force` is set; a non-empty folder
// holding anything else is never touched.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/train/data/corpus.h"
#include "engine/train/data/index.h"

namespace switchyard::data {

// What `switchyard prep` does; the defaults are the command's.
struct PrepOptions {
  std::string out_dir;             // required
  std::vector<std::string> files;  // text files; empty: the fortune corpus under fortune_root
  std::string label;               // label of every file; empty: each file's stem
  std::string fortune_root = kDefaultFortuneRoot;
  int vocab_size = 2000;           // BPE vocabulary (a soft limit on small corpora)
  double val_fraction = 0.05;      // expected share of documents in validation, [0, 1)
  uint64_t seed = 0;               // split, sampling and tokenizer seed
  int64_t max_docs_per_label = 0;  // 0: keep every document
  int64_t shard_tokens = 1 << 24;  // tokens per shard at most (a longer document gets
                                   // a shard of its own)
  bool force = false;              // replace an existing prep output

  // Names the option and the value it rejects ("val_fraction must be in [0, 1), got 1.5").
  Status Validate() const;
};

// Whether `dir` may receive a prep output: missing, empty, or (with `force`) holding only
// a previous prep output. Fails with one line otherwise.
Status CheckOutputDir(const std::string& dir, bool force);

// Runs the whole pipeline and returns the index it wrote. `progress`, when set, receives
// one line per stage ("trained the tokenizer: 2000 pieces in 24.1 s").
StatusOr<Index> Prepare(const PrepOptions& options,
                        const std::function<void(const std::string&)>& progress = nullptr);

// Whether document `index` goes to validation under `seed`.
bool IsValidation(uint64_t seed, uint64_t index, double val_fraction);

// The summary table: documents and tokens per label and split, then the totals.
std::string SummaryTable(const Index& index);

}  // namespace switchyard::data
