// The seeded sample of training documents the tokenizer is trained on, in bounded memory.
//
// Each training document i gets the draw (RandomBitsAt({seed, StreamId(
// "data.prep.tokenizer_sample")}, i), i); the sample is the longest run of documents in
// draw order whose texts add up to at most `budget_bytes`. So it is a function of the
// corpus, the seed and the budget (not of the reading order or thread count), a corpus
// that fits in the budget is used whole, and memory stays below budget plus one document.
// Texts() returns the sample in corpus order.
#pragma once

#include <cstdint>
#include <optional>
#include <queue>
#include <string>
#include <utility>
#include <vector>

namespace switchyard::data {

class TokenizerSample {
 public:
  TokenizerSample(uint64_t budget_bytes, uint64_t seed);

  // Offers training document `index` (its position in the corpus).
  void Offer(uint64_t index, const std::string& text);
  // The kept texts in corpus order (leaves the sample empty).
  std::vector<std::string> TakeTexts();
  // Documents offered and kept, and the kept bytes.
  uint64_t offered() const { return offered_; }
  uint64_t kept() const { return heap_.size(); }
  uint64_t kept_bytes() const { return bytes_; }

 private:
  using Key = std::pair<uint32_t, uint64_t>;  // (draw, index)
  struct Entry {
    Key key;
    std::string text;
    bool operator<(const Entry& other) const { return key < other.key; }
  };

  uint64_t budget_;
  uint64_t seed_;
  std::priority_queue<Entry> heap_;  // largest key on top
  std::optional<Key> cutoff_;        // smallest key dropped so far
  uint64_t bytes_ = 0;
  uint64_t offered_ = 0;
};

}  // namespace switchyard::data
