// One prep output opened for the loader: its index.json, its shards memory-mapped
// (mapped_shard.h), and each split as one token stream (its shards in index order) with
// where each document starts and its label.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/data/index.h"
#include "engine/data/mapped_shard.h"

namespace switchyard::data {

// A split's shards as one stream of tokens.
class TokenStream {
 public:
  // Appends a shard (owned by the Dataset) to the stream.
  void AddShard(const MappedShard* shard);
  // Tokens in the stream.
  int64_t size() const { return size_; }
  // Copies tokens [offset, offset + n) into out. With vocab_size > 0 every token is
  // checked against it (for streams that were not verified): a bad one is a DataLoss
  // naming the shard file, the token's index in it, its id and the vocabulary size.
  Status Copy(int64_t offset, int64_t n, int32_t* out, int64_t vocab_size) const;

  std::vector<int64_t> doc_starts;  // ascending
  std::vector<int32_t> doc_labels;  // per document, an index into the loader's labels

 private:
  std::vector<const MappedShard*> shards_;
  std::vector<int64_t> bases_;  // first token of each shard in the stream
  int64_t size_ = 0;
};

// One prep output, opened: the shards stay mapped while the Dataset lives.
struct Dataset {
  std::string dir;
  Index index;
  std::vector<std::unique_ptr<MappedShard>> shards;  // as in index.shards
  TokenStream train;
  TokenStream val;

  // Reads DIR/index.json, maps every shard and checks it against the index (width, count);
  // with `verify`, also reads every shard once (checksum, token ids below vocab_size).
  // Document labels are the index's label ids (the loader remaps them for blends).
  static StatusOr<std::unique_ptr<Dataset>> Open(const std::string& dir, bool verify);
};

}  // namespace switchyard::data
