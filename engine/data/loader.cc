// The deterministic data loader; see loader.h.
#include "engine/data/loader.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "engine/core/check.h"
#include "engine/core/philox.h"
#include "engine/data/tokenizer.h"

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
  if (dir.empty() && paths.empty()) return InvalidArgument("data dir is empty");
  if (!dir.empty() && !paths.empty()) {
    return InvalidArgument("data.dir (", dir, ") and data.paths are both set; use one");
  }
  for (size_t d = 0; d < paths.size(); ++d) {
    if (paths[d].dir.empty()) return InvalidArgument("data.paths[", d, "].dir is empty");
    if (!(paths[d].weight > 0) || !std::isfinite(paths[d].weight)) {
      return InvalidArgument("data.paths[", d, "].weight must be a positive number, got ",
                             paths[d].weight);
    }
  }
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

namespace {

// The Feistel stream of dataset d's windows in epoch e: dataset 0 keeps the single-dataset
// stream StreamId("data.train.windows") + e.
uint64_t WindowStream(int d, uint64_t epoch) {
  return (StreamId("data.train.windows") ^ (static_cast<uint64_t>(d) * 0x9E3779B97F4A7C15ull)) +
         epoch;
}

}  // namespace

StatusOr<DataLoader> DataLoader::Open(const LoaderOptions& options) {
  SY_RETURN_IF_ERROR(options.Validate());
  DataLoader loader;
  loader.options_ = options;
  std::vector<DataPath> paths = options.paths;
  if (paths.empty()) paths.push_back(DataPath{options.dir, 1.0});
  std::vector<double> weights;
  for (const DataPath& path : paths) {
    SY_ASSIGN_OR_RETURN(std::unique_ptr<Dataset> dataset, Dataset::Open(path.dir, options.verify));
    loader.datasets_.push_back(std::move(dataset));
    weights.push_back(path.weight);
  }
  // One tokenizer for the blend.
  const Dataset& first = *loader.datasets_[0];
  std::string model;
  for (size_t d = 0; d < loader.datasets_.size(); ++d) {
    const Dataset& dataset = *loader.datasets_[d];
    if (loader.datasets_.size() > 1) {
      SY_ASSIGN_OR_RETURN(const std::string bytes,
                          ReadTokenizerModel(dataset.dir + "/" + dataset.index.tokenizer));
      if (d == 0) {
        model = bytes;
      } else if (bytes != model || dataset.index.vocab_size != first.index.vocab_size ||
                 dataset.index.eos_id != first.index.eos_id) {
        return FailedPrecondition(dataset.dir, ": its tokenizer differs from ", first.dir,
                                  "'s; the datasets of a blend need one tokenizer (prep them "
                                  "with --tokenizer ", first.dir, "/", kTokenizerFile, ")");
      }
    }
    if (dataset.train.size() < options.seq_len + 1) {
      return FailedPrecondition(
          dataset.dir, ": the training split has ", dataset.train.size(),
          " tokens, fewer than one sequence needs (seq_len + 1 = ", options.seq_len + 1, ")");
    }
  }
  // Labels over every dataset; each dataset's label ids become indexes into them.
  for (const auto& dataset : loader.datasets_) {
    loader.labels_.insert(loader.labels_.end(), dataset->index.labels.begin(),
                          dataset->index.labels.end());
  }
  std::sort(loader.labels_.begin(), loader.labels_.end());
  loader.labels_.erase(std::unique(loader.labels_.begin(), loader.labels_.end()),
                       loader.labels_.end());
  for (const auto& dataset : loader.datasets_) {
    std::vector<int32_t> map;
    for (const std::string& label : dataset->index.labels) {
      map.push_back(static_cast<int32_t>(
          std::lower_bound(loader.labels_.begin(), loader.labels_.end(), label) -
          loader.labels_.begin()));
    }
    for (TokenStream* stream : {&dataset->train, &dataset->val}) {
      for (int32_t& label : stream->doc_labels) label = map[label];
    }
  }
  SY_ASSIGN_OR_RETURN(BlendSchedule blend, BlendSchedule::Create(weights));
  loader.blend_ = std::make_shared<BlendSchedule>(std::move(blend));
  return loader;
}

int64_t DataLoader::micro_batches_per_step() const {
  return options_.global_batch_size / (options_.dp_size * options_.micro_batch_size);
}

int64_t DataLoader::train_windows(int dataset) const {
  return (datasets_[dataset]->train.size() - 1) / options_.seq_len;
}

int64_t DataLoader::train_tokens() const {
  int64_t n = 0;
  for (const auto& dataset : datasets_) n += dataset->train.size();
  return n;
}

int64_t DataLoader::val_tokens() const {
  int64_t n = 0;
  for (const auto& dataset : datasets_) n += dataset->val.size();
  return n;
}

Batch DataLoader::MakeBatch() const {
  const Shape shape = {options_.micro_batch_size, options_.seq_len};
  Batch batch;
  batch.inputs = Tensor::Empty(shape, DType::kI32);
  batch.targets = Tensor::Empty(shape, DType::kI32);
  batch.labels = Tensor::Empty(shape, DType::kI32);
  return batch;
}

Status DataLoader::FillRow(const TokenStream& stream, int64_t offset, int64_t row,
                           Batch* batch) const {
  const int64_t len = options_.seq_len;
  std::vector<int32_t> tokens(len + 1);
  SY_RETURN_IF_ERROR(stream.Copy(offset, len + 1, tokens.data(), options_.verify ? 0 : vocab_size()));
  int32_t* inputs = batch->inputs.data<int32_t>() + row * len;
  int32_t* targets = batch->targets.data<int32_t>() + row * len;
  int32_t* labels = batch->labels.data<int32_t>() + row * len;
  std::copy(tokens.begin(), tokens.begin() + len, inputs);
  std::copy(tokens.begin() + 1, tokens.end(), targets);
  // The document holding `offset`, then walk forward across document starts.
  size_t doc = std::upper_bound(stream.doc_starts.begin(), stream.doc_starts.end(), offset) -
               stream.doc_starts.begin() - 1;
  for (int64_t t = 0; t < len; ++t) {
    while (doc + 1 < stream.doc_starts.size() && stream.doc_starts[doc + 1] <= offset + t) ++doc;
    labels[t] = stream.doc_labels[doc];
  }
  batch->offsets.push_back(offset);
  return OkStatus();
}

void DataLoader::PadRow(int64_t row, int64_t k, Batch* batch) const {
  const int64_t len = options_.seq_len;
  std::fill_n(batch->inputs.data<int32_t>() + row * len, len, eos_id());
  std::fill_n(batch->targets.data<int32_t>() + row * len, len, -1);  // the loss's ignore index
  std::fill_n(batch->labels.data<int32_t>() + row * len, len, 0);
  batch->sequences.push_back(k);
  batch->offsets.push_back(-1);
  batch->datasets.push_back(0);
  ++batch->padding;
}

Batch DataLoader::GetBatch(int64_t step, int64_t micro) const {
  StatusOr<Batch> batch = ReadBatch(step, micro);
  SY_CHECK(batch.ok()) << batch.status().message();
  return *std::move(batch);
}

Status DataLoader::CheckStep(int64_t step) const {
  if (options_.verify) return OkStatus();
  for (int64_t micro = 0; micro < micro_batches_per_step(); ++micro) {
    SY_RETURN_IF_ERROR(ReadBatch(step, micro).status());
  }
  return OkStatus();
}

StatusOr<Batch> DataLoader::ReadBatch(int64_t step, int64_t micro) const {
  SY_CHECK_GE(step, 0);
  SY_CHECK(micro >= 0 && micro < micro_batches_per_step())
      << "micro=" << micro << " of " << micro_batches_per_step();
  const int64_t per_rank = options_.global_batch_size / options_.dp_size;
  const int64_t first = step * options_.global_batch_size + options_.dp_rank * per_rank +
                        micro * options_.micro_batch_size;
  Batch batch = MakeBatch();
  for (int64_t row = 0; row < options_.micro_batch_size; ++row) {
    const int64_t g = first + row;
    const auto [d, k] = blend_->Locate(g);
    const int64_t windows = train_windows(d);
    const uint64_t epoch = static_cast<uint64_t>(k / windows);
    const uint64_t window = PermuteIndex(static_cast<uint64_t>(k % windows), windows,
                                         options_.seed, WindowStream(d, epoch));
    SY_RETURN_IF_ERROR(
        FillRow(datasets_[d]->train, static_cast<int64_t>(window) * options_.seq_len, row, &batch));
    batch.sequences.push_back(g);
    batch.datasets.push_back(d);
  }
  return batch;
}

StatusOr<std::vector<Batch>> DataLoader::ValidationBatches(int64_t max_batches) const {
  const int64_t mbs = options_.micro_batch_size;
  // Windows of each dataset's validation stream, one dataset after the other.
  std::vector<int64_t> first_window = {0};
  for (const auto& dataset : datasets_) {
    const int64_t n = dataset->val.size() > 0 ? (dataset->val.size() - 1) / options_.seq_len : 0;
    first_window.push_back(first_window.back() + n);
  }
  const int64_t windows = first_window.back();
  const int64_t per_batch = mbs * options_.dp_size;
  const bool whole = max_batches <= 0;
  int64_t count = whole ? (windows + per_batch - 1) / per_batch : windows / per_batch;
  if (val_tokens() == 0) {
    return FailedPrecondition(
        datasets_.size() == 1 ? datasets_[0]->dir : std::string("the blend"),
        ": the data has no validation split (0 tokens; `prep --val-fraction 0` writes none), "
        "and validating needs one: prep with a --val-fraction above 0 (train runs without "
        "validation with train.eval_every=0)");
  }
  if (count == 0 || (whole && windows < per_batch)) {
    return FailedPrecondition(
        datasets_.size() == 1 ? datasets_[0]->dir : std::string("the blend"),
        ": the validation split has ", val_tokens(), " tokens, ", windows,
        " windows of seq_len + 1 = ", options_.seq_len + 1,
        "; one validation batch on every rank needs ", mbs * options_.dp_size);
  }
  if (!whole) count = std::min(count, max_batches);
  std::vector<Batch> batches;
  for (int64_t b = 0; b < count; ++b) {
    Batch batch = MakeBatch();
    for (int64_t row = 0; row < mbs; ++row) {
      const int64_t k = (b * options_.dp_size + options_.dp_rank) * mbs + row;
      if (k >= windows) {  // past the split: padding, always the trailing rows
        PadRow(row, k, &batch);
        continue;
      }
      const int d = static_cast<int>(
          std::upper_bound(first_window.begin(), first_window.end(), k) - first_window.begin() - 1);
      SY_RETURN_IF_ERROR(
          FillRow(datasets_[d]->val, (k - first_window[d]) * options_.seq_len, row, &batch));
      batch.sequences.push_back(k);
      batch.datasets.push_back(d);
    }
    batches.push_back(std::move(batch));
  }
  return batches;
}

}  // namespace switchyard::data
