// A prep output as token streams; see dataset.h.
#include "engine/data/dataset.h"

#include <algorithm>

#include "engine/core/check.h"

namespace switchyard::data {

void TokenStream::AddShard(const MappedShard* shard) {
  shards_.push_back(shard);
  bases_.push_back(size_);
  size_ += static_cast<int64_t>(shard->count());
}

Status TokenStream::Copy(int64_t offset, int64_t n, int32_t* out, int64_t vocab_size) const {
  SY_CHECK(offset >= 0 && n >= 0 && offset + n <= size_) << offset << " + " << n << " > " << size_;
  // The last shard starting at or before offset (empty shards are skipped by the walk).
  size_t s = std::upper_bound(bases_.begin(), bases_.end(), offset) - bases_.begin() - 1;
  int64_t done = 0;
  while (done < n) {
    const MappedShard& shard = *shards_[s];
    const int64_t first = offset + done - bases_[s];
    const int64_t take = std::min<int64_t>(n - done, static_cast<int64_t>(shard.count()) - first);
    if (take > 0) {
      shard.Copy(static_cast<uint64_t>(first), static_cast<uint64_t>(take), out + done);
      for (int64_t i = 0; vocab_size > 0 && i < take; ++i) {
        if (out[done + i] < 0 || out[done + i] >= vocab_size) {
          return DataLoss(shard.path(), ": token ", first + i, " is ",
                          static_cast<uint32_t>(out[done + i]), ", not below the vocabulary size ",
                          vocab_size, " (data.verify is false, so the shards were not checked "
                          "at the start; prep the data again, or set data.verify: true)");
        }
      }
      done += take;
    }
    ++s;
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<Dataset>> Dataset::Open(const std::string& dir, bool verify) {
  auto dataset = std::make_unique<Dataset>();
  dataset->dir = dir;
  SY_ASSIGN_OR_RETURN(dataset->index, ReadIndex(dir));
  const Index& index = dataset->index;
  std::vector<int64_t> shard_base(index.shards.size());
  for (size_t s = 0; s < index.shards.size(); ++s) {
    const ShardEntry& entry = index.shards[s];
    const std::string path = dir + "/" + entry.name;
    SY_ASSIGN_OR_RETURN(std::unique_ptr<MappedShard> shard, MappedShard::Open(path));
    if (shard->header().token_bytes != index.token_bytes) {
      return DataLoss(path, ": holds ", shard->header().token_bytes * 8,
                      "-bit tokens but the index says ", index.token_bytes == 2 ? "u16" : "u32");
    }
    if (shard->count() != entry.tokens) {
      return DataLoss(path, ": holds ", shard->count(), " tokens but ", kIndexFile, " says ",
                      entry.tokens);
    }
    if (verify) SY_RETURN_IF_ERROR(shard->Verify(index.vocab_size));
    TokenStream& stream = entry.split == Split::kTrain ? dataset->train : dataset->val;
    shard_base[s] = stream.size();
    stream.AddShard(shard.get());
    dataset->shards.push_back(std::move(shard));
  }
  for (const DocumentEntry& doc : index.documents) {
    TokenStream& stream = doc.split == Split::kTrain ? dataset->train : dataset->val;
    stream.doc_starts.push_back(shard_base[doc.shard] + static_cast<int64_t>(doc.offset));
    stream.doc_labels.push_back(doc.label);
  }
  for (const TokenStream* stream : {&dataset->train, &dataset->val}) {
    // ParseIndex keeps a split's documents in shard order, so the starts ascend.
    SY_CHECK(std::is_sorted(stream->doc_starts.begin(), stream->doc_starts.end()));
  }
  return dataset;
}

}  // namespace switchyard::data
