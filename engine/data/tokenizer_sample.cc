// The tokenizer's training sample; see tokenizer_sample.h.
#include "engine/data/tokenizer_sample.h"

#include <algorithm>

#include "engine/core/philox.h"

namespace switchyard::data {

TokenizerSample::TokenizerSample(uint64_t budget_bytes, uint64_t seed)
    : budget_(budget_bytes), seed_(seed) {}

void TokenizerSample::Offer(uint64_t index, const std::string& text) {
  ++offered_;
  const Key key{RandomBitsAt({seed_, StreamId("data.prep.tokenizer_sample")}, index), index};
  // Every document above the cutoff lost to one that was dropped already.
  if (cutoff_ && key >= *cutoff_) return;
  heap_.push(Entry{key, text});
  bytes_ += text.size();
  while (bytes_ > budget_) {
    cutoff_ = heap_.top().key;
    bytes_ -= heap_.top().text.size();
    heap_.pop();
  }
}

std::vector<std::string> TokenizerSample::TakeTexts() {
  std::vector<Entry> entries;
  entries.reserve(heap_.size());
  while (!heap_.empty()) {
    entries.push_back(std::move(const_cast<Entry&>(heap_.top())));
    heap_.pop();
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.key.second < b.key.second; });
  std::vector<std::string> texts;
  texts.reserve(entries.size());
  for (Entry& entry : entries) texts.push_back(std::move(entry.text));
  bytes_ = 0;
  return texts;
}

}  // namespace switchyard::data
