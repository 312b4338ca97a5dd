// Encoding documents on several threads with the output in input order, in bounded memory.
//
// Documents are grouped into batches of about 1 MiB of text; at most `threads` batches are
// encoded at once (one thread each) while the caller reads the next ones, and the sink
// receives every document, encoded, in the order they were added. So the output does not
// depend on the thread count, and memory holds at most threads + 1 batches.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/data/index.h"
#include "engine/data/tokenizer.h"

namespace switchyard::data {

// One document on its way to the shards.
struct EncodeItem {
  std::string text;             // cleared once encoded
  uint64_t text_bytes = 0;      // the text's size
  uint64_t index = 0;           // position in the corpus
  int label = 0;                // index into the labels
  int file = 0;                 // index into the input files
  Split split = Split::kTrain;
  std::vector<int32_t> tokens;  // the text's ids and the end-of-document id
};

class ParallelEncoder {
 public:
  using Sink = std::function<Status(EncodeItem& item)>;

  // `threads` >= 1; `sink` runs on the caller's thread, inside Add and Finish.
  ParallelEncoder(const Tokenizer& tokenizer, int threads, Sink sink);
  // Waits for the batches in flight (their results are dropped).
  ~ParallelEncoder();

  // Queues one document; may hand finished ones to the sink. Returns the sink's error.
  Status Add(EncodeItem item);
  // Encodes what is left and hands everything to the sink.
  Status Finish();

 private:
  using BatchPtr = std::unique_ptr<std::vector<EncodeItem>>;
  // Starts encoding the current batch.
  void Launch();
  // Waits for the oldest batch in flight and hands it to the sink.
  Status Drain();

  Tokenizer tokenizer_;
  int threads_;
  Sink sink_;
  BatchPtr batch_;
  uint64_t batch_bytes_ = 0;
  std::deque<std::future<BatchPtr>> in_flight_;
};

}  // namespace switchyard::data
