// Ordered multi-threaded encoding; see parallel_encoder.h.
#include "engine/data/parallel_encoder.h"

namespace switchyard::data {
namespace {

constexpr uint64_t kBatchBytes = uint64_t{1} << 20;
constexpr size_t kBatchDocuments = 8192;

}  // namespace

ParallelEncoder::ParallelEncoder(const Tokenizer& tokenizer, int threads, Sink sink)
    : tokenizer_(tokenizer), threads_(threads < 1 ? 1 : threads), sink_(std::move(sink)) {}

ParallelEncoder::~ParallelEncoder() {
  for (auto& future : in_flight_) future.wait();
}

void ParallelEncoder::Launch() {
  if (batch_ == nullptr || batch_->empty()) return;
  in_flight_.push_back(std::async(std::launch::async, [this, batch = std::move(batch_)]() mutable {
    for (EncodeItem& item : *batch) {
      item.tokens = tokenizer_.Encode(item.text);
      item.tokens.push_back(tokenizer_.eos_id());
      std::string().swap(item.text);
    }
    return std::move(batch);
  }));
  batch_ = nullptr;
  batch_bytes_ = 0;
}

Status ParallelEncoder::Drain() {
  BatchPtr batch = in_flight_.front().get();
  in_flight_.pop_front();
  for (EncodeItem& item : *batch) SY_RETURN_IF_ERROR(sink_(item));
  return OkStatus();
}

Status ParallelEncoder::Add(EncodeItem item) {
  if (batch_ == nullptr) batch_ = std::make_unique<std::vector<EncodeItem>>();
  batch_bytes_ += item.text.size();
  batch_->push_back(std::move(item));
  if (batch_bytes_ >= kBatchBytes || batch_->size() >= kBatchDocuments) {
    while (in_flight_.size() >= static_cast<size_t>(threads_)) SY_RETURN_IF_ERROR(Drain());
    Launch();
  }
  return OkStatus();
}

Status ParallelEncoder::Finish() {
  Launch();
  while (!in_flight_.empty()) SY_RETURN_IF_ERROR(Drain());
  return OkStatus();
}

}  // namespace switchyard::data
