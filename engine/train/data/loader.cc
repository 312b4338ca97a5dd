// The deterministic data loader; see loader.h.
#include "engine/train/data/loader.h"

#include <algorithm>
#include <bit>

#include "engine/core/check.h"
#include "engine/core/philox.h"
#include "engine/train/data/shards.h"

namespace switchyard::data {
namespace {

constexpr int kFeistelRounds = 4;

}  // namespace

uint64_t PermuteIndex(uint64_t x, uint64_t n, uint64_t seed, uint64_t stream) {
  SY_CHECK_LT(x, n);
  if (n == 1) return 0;
  // A balanced Feistel network on 2h bits, 2^(2h) < 4n, so cycle walking (re-applying it
  // until the value lands below n) takes under four tries on average.
  const int bits = 64 - std::countl_zero(n - 1);
  const int half = (bits + 1) / 2;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  const RngKey key{seed, stream};
  do {
    uint64_t left = x >> half, right = x & mask;
    for (int round = 0; round < kFeistelRounds; ++round) {
      const uint64_t f = RandomBitsAt(key, (static_cast<uint64_t>(round) << 32) | right);
      const uint64_t next = left ^ (f & mask);
      left = right;
      right = next;
    }
    x = (left << half) | right;
  } while (x >= n);
  return x;
}

Status LoaderOptions::Validate() const {
  if (dir.empty()) return InvalidArgument("data dir is empty");
  if (seq_len < 1) return InvalidArgument("seq_len must be >= 1, got ", seq_len);
  if (micro_batch_size < 1) {
    return InvalidArgument("micro_batch_size must be >= 1, got ", micro_batch_size);
  }
  if (dp_size < 1) return InvalidArgument("dp_size must be >= 1, got ", dp_size);
  if (dp_rank < 0 || dp_rank >= dp_size) {
    return InvalidArgument("dp_rank must be in [0, ", dp_size, "), got ", dp_rank);
  }
  if (global_batch_size < 1 || global_batch_size % (dp_size * micro_batch_size) != 0) {
    return InvalidArgument("global_batch_size ", global_batch_size,
                           " is not a positive multiple of dp_size * micro_batch_size = ", dp_size,
                           " * ", micro_batch_size);
  }
  return OkStatus();
}

StatusOr<DataLoader> DataLoader::Open(const LoaderOptions& options) {
  SY_RETURN_IF_ERROR(options.Validate());
  DataLoader loader;
  loader.options_ = options;
  SY_ASSIGN_OR_RETURN(loader.index_, ReadIndex(options.dir));
  const Index& index = loader.index_;

  // Each split's stream is its shards in index order.
  std::vector<int64_t> shard_base(index.shards.size());
  for (size_t s = 0; s < index.shards.size(); ++s) {
    const ShardEntry& entry = index.shards[s];
    const std::string path = options.dir + "/" + entry.name;
    ShardHeader header;
    SY_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, ReadShard(path, &header));
    if (header.token_bytes != index.token_bytes) {
      return DataLoss(path, ": holds ", header.token_bytes * 8, "-bit tokens but the index says ",
                      index.token_bytes == 2 ? "u16" : "u32");
    }
    if (header.count != entry.tokens) {
      return DataLoss(path, ": holds ", header.count, " tokens but ", kIndexFile, " says ",
                      entry.tokens);
    }
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] >= index.vocab_size) {
        return DataLoss(path, ": token ", i, " is ", tokens[i], ", not below the vocabulary size ",
                        index.vocab_size);
      }
    }
    Stream& stream = entry.split == Split::kTrain ? loader.train_ : loader.val_;
    shard_base[s] = static_cast<int64_t>(stream.tokens.size());
    stream.tokens.insert(stream.tokens.end(), tokens.begin(), tokens.end());
  }
  for (const DocumentEntry& doc : index.documents) {
    Stream& stream = doc.split == Split::kTrain ? loader.train_ : loader.val_;
    stream.doc_starts.push_back(shard_base[doc.shard] + static_cast<int64_t>(doc.offset));
    stream.doc_labels.push_back(doc.label);
  }
  for (Stream* stream : {&loader.train_, &loader.val_}) {
    // Documents are listed in shard order, so the starts ascend; keep that an invariant.
    SY_CHECK(std::is_sorted(stream->doc_starts.begin(), stream->doc_starts.end()));
  }
  if (loader.train_tokens() < options.seq_len + 1) {
    return FailedPrecondition(
        options.dir, ": the training split has ", loader.train_tokens(),
        " tokens, fewer than one sequence needs (seq_len + 1 = ", options.seq_len + 1, ")");
  }
  return loader;
}

int64_t DataLoader::micro_batches_per_step() const {
  return options_.global_batch_size / (options_.dp_size * options_.micro_batch_size);
}

int64_t DataLoader::train_windows() const { return (train_tokens() - 1) / options_.seq_len; }

Batch DataLoader::MakeBatch() const {
  const Shape shape = {options_.micro_batch_size, options_.seq_len};
  Batch batch;
  batch.inputs = Tensor::Empty(shape, DType::kI32);
  batch.targets = Tensor::Empty(shape, DType::kI32);
  batch.labels = Tensor::Empty(shape, DType::kI32);
  return batch;
}

void DataLoader::FillRow(const Stream& stream, int64_t offset, int64_t row, Batch* batch) const {
  const int64_t len = options_.seq_len;
  SY_CHECK_LE(offset + len + 1, static_cast<int64_t>(stream.tokens.size()));
  int32_t* inputs = batch->inputs.data<int32_t>() + row * len;
  int32_t* targets = batch->targets.data<int32_t>() + row * len;
  int32_t* labels = batch->labels.data<int32_t>() + row * len;
  const int32_t* tokens = stream.tokens.data() + offset;
  std::copy(tokens, tokens + len, inputs);
  std::copy(tokens + 1, tokens + len + 1, targets);
  // The document holding `offset`, then walk forward across document starts.
  size_t doc = std::upper_bound(stream.doc_starts.begin(), stream.doc_starts.end(), offset) -
               stream.doc_starts.begin() - 1;
  for (int64_t t = 0; t < len; ++t) {
    while (doc + 1 < stream.doc_starts.size() && stream.doc_starts[doc + 1] <= offset + t) ++doc;
    labels[t] = stream.doc_labels[doc];
  }
  batch->offsets.push_back(offset);
}

Batch DataLoader::GetBatch(int64_t step, int64_t micro) const {
  SY_CHECK_GE(step, 0);
  SY_CHECK(micro >= 0 && micro < micro_batches_per_step())
      << "micro=" << micro << " of " << micro_batches_per_step();
  const int64_t windows = train_windows();
  const int64_t per_rank = options_.global_batch_size / options_.dp_size;
  const int64_t first = step * options_.global_batch_size + options_.dp_rank * per_rank +
                        micro * options_.micro_batch_size;
  Batch batch = MakeBatch();
  for (int64_t row = 0; row < options_.micro_batch_size; ++row) {
    const int64_t g = first + row;
    const uint64_t epoch = static_cast<uint64_t>(g / windows);
    const uint64_t window = PermuteIndex(static_cast<uint64_t>(g % windows), windows, options_.seed,
                                         StreamId("data.train.windows") + epoch);
    FillRow(train_, static_cast<int64_t>(window) * options_.seq_len, row, &batch);
    batch.sequences.push_back(g);
  }
  return batch;
}

StatusOr<std::vector<Batch>> DataLoader::ValidationBatches(int64_t max_batches) const {
  const int64_t mbs = options_.micro_batch_size;
  const int64_t windows = val_tokens() > 0 ? (val_tokens() - 1) / options_.seq_len : 0;
  int64_t count = windows / (mbs * options_.dp_size);
  if (count == 0) {
    return FailedPrecondition(
        options_.dir, ": the validation split has ", val_tokens(), " tokens, ", windows,
        " windows of seq_len + 1 = ", options_.seq_len + 1,
        "; one validation batch on every rank needs ", mbs * options_.dp_size);
  }
  if (max_batches > 0) count = std::min(count, max_batches);
  std::vector<Batch> batches;
  for (int64_t b = 0; b < count; ++b) {
    Batch batch = MakeBatch();
    for (int64_t row = 0; row < mbs; ++row) {
      const int64_t k = (b * options_.dp_size + options_.dp_rank) * mbs + row;
      FillRow(val_, k * options_.seq_len, row, &batch);
      batch.sequences.push_back(k);
    }
    batches.push_back(std::move(batch));
  }
  return batches;
}

}  // namespace switchyard::data
