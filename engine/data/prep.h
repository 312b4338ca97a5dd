// `switchyard prep`: text -> tokenizer -> token shards + index.json (docs/data.md).
//
// The corpus is streamed, so memory does not grow with it (docs/data.md states the bound):
//   1. read the documents once (document_reader.h): labels, counts, bad JSONL lines and,
//      with max_docs_per_label, which documents to keep (a seeded sample per label);
//   2. document i (its position among the kept ones) goes to validation when
//      UniformAt({seed, StreamId("data.prep.split")}, i) < val_fraction, else to training;
//      the tokenizer is trained on a seeded sample of at most tokenizer_sample_bytes of the
//      training documents (tokenizer_sample.h), or loaded from `tokenizer_path`;
//   3. read the documents again, encode them on `threads` threads (parallel_encoder.h),
//      append </s>, and write the shards (shards.h) and index.json (index.h) as they come.
// Everything is a function of the inputs and the options (not of the thread count): two
// runs give identical bytes.
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
#include "engine/data/corpus.h"
#include "engine/data/document_reader.h"
#include "engine/data/index.h"

namespace switchyard::data {

// What `switchyard prep` does; the defaults are the command's.
struct PrepOptions {
  std::string out_dir;             // required
  std::vector<std::string> files;  // files, folders, globs; empty: the fortune corpus
  ReadOptions read;                // text or JSONL, the JSONL keys, --strict
  std::string label;               // label of every file; empty: each file's stem
  std::string fortune_root = kDefaultFortuneRoot;
  int vocab_size = 2000;           // BPE vocabulary (a soft limit on small corpora)
  double val_fraction = 0.05;      // expected share of documents in validation, [0, 1)
  uint64_t seed = 0;               // split, sampling and tokenizer seed
  int64_t max_docs_per_label = 0;  // 0: keep every document
  int64_t shard_tokens = 1 << 24;  // tokens per shard at most (a longer document gets
                                   // a shard of its own)
  bool force = false;              // replace an existing prep output
  std::string tokenizer_path;      // an existing SentencePiece model; "": train one
  uint64_t tokenizer_sample_bytes = uint64_t{16} << 20;  // text the tokenizer trains on
  int threads = 0;                 // encoding threads; 0: every core

  // Names the option and the value it rejects ("val_fraction must be in [0, 1), got 1.5").
  Status Validate() const;
};

// Whether `dir` may receive a prep output: missing, empty, or (with `force`) holding only
// a previous prep output. Fails with one line otherwise.
Status CheckOutputDir(const std::string& dir, bool force);

// Where encoding stands (PrepCallbacks::encoding).
struct EncodeProgress {
  uint64_t bytes = 0;        // document text encoded so far
  uint64_t total_bytes = 0;  // document text in the corpus
  uint64_t documents = 0;
  double seconds = 0;        // since encoding started
};

// What Prepare tells its caller; each may be empty.
struct PrepCallbacks {
  // One line per stage ("trained the tokenizer: 2000 pieces in 24.1 s").
  std::function<void(const std::string&)> progress;
  // A bad input line that was skipped ("de.jsonl:17: not valid JSON"), and the count.
  std::function<void(const std::string&)> warning;
  // About twice a second while encoding, and once at the end.
  std::function<void(const EncodeProgress&)> encoding;
};

// Runs the whole pipeline and returns the index it wrote, without its document list
// (which may be large; ReadIndex reads it back).
StatusOr<Index> Prepare(const PrepOptions& options, const PrepCallbacks& callbacks = {});

// Whether document `index` goes to validation under `seed`.
bool IsValidation(uint64_t seed, uint64_t index, double val_fraction);

// The summary table: documents and tokens per label and split, then the totals.
std::string SummaryTable(const Index& index);

}  // namespace switchyard::data
