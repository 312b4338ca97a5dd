// SentencePiece behind plain std types; see sentencepiece_bridge.h. Includes no abseil.
#include "engine/data/sentencepiece_bridge.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace switchyard::data::spm {
namespace {

// Feeds the texts to the trainer without a temporary file.
class VectorIterator : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& texts) : texts_(texts) {}
  bool done() const override { return next_ >= texts_.size(); }
  void Next() override { ++next_; }
  const std::string& value() const override { return texts_[next_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& texts_;
  size_t next_ = 0;
};

// SentencePiece's BPE trainer (Debian's 0.1.97) crashes (SIGSEGV in ComputeFreq) on texts
// with long runs without a space, such as a line of hex in a source file: one run of 32,800
// characters, or nine of 4,000 in one text, did it. Training never needs such a word: in the
// trainer's copy a run longer than kMaxRun bytes gets a space after every kMaxRun bytes (at a
// UTF-8 character boundary); encoding still sees the text as it is.
constexpr size_t kMaxRun = 256;

bool HasLongRun(const std::string& text) {
  size_t run = 0;
  for (char c : text) {
    run = c == ' ' ? 0 : run + 1;
    if (run > kMaxRun) return true;
  }
  return false;
}

std::string BreakLongRuns(const std::string& text) {
  std::string out;
  out.reserve(text.size() + text.size() / kMaxRun + 1);
  size_t run = 0;
  for (char c : text) {
    const bool continuation = (static_cast<unsigned char>(c) & 0xC0) == 0x80;
    if (c != ' ' && run >= kMaxRun && !continuation) out.push_back(' '), run = 0;
    out.push_back(c);
    run = c == ' ' ? 0 : run + 1;
  }
  return out;
}

// SentencePiece skips a sentence longer than max_sentence_length bytes (kMaxSentenceBytes)
// and fails ("Internal: ... [!sentences_.empty()]") when it skipped them all: a corpus of
// long JSONL records or minified text, one line per document. In the trainer's copy a
// longer text is cut into pieces of at most kMaxPieceBytes (room for the space BreakLongRuns
// may add per kMaxRun bytes),
// each ending at the last line break, else the last space, else a UTF-8 character boundary
// before the limit. Encoding still sees the whole text.
constexpr size_t kMaxSentenceBytes = 65536;
constexpr size_t kMaxPieceBytes = kMaxSentenceBytes - kMaxSentenceBytes / kMaxRun;

std::vector<std::string> CutLongText(const std::string& text) {
  std::vector<std::string> pieces;
  size_t begin = 0;
  while (text.size() - begin > kMaxPieceBytes) {
    const size_t limit = begin + kMaxPieceBytes;  // the piece is [begin, end), end <= limit
    size_t end = text.rfind('\n', limit - 1);
    if (end == std::string::npos || end < begin) end = text.rfind(' ', limit - 1);
    if (end == std::string::npos || end < begin) {
      end = limit;
      while (end > begin + 1 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
    } else {
      ++end;  // the separator ends its piece
    }
    pieces.push_back(text.substr(begin, end - begin));
    begin = end;
  }
  pieces.push_back(text.substr(begin));
  return pieces;
}

}  // namespace

std::string TrainBpe(const std::vector<std::string>& texts, const BpeSpec& spec,
                     std::string* model) {
  // Deterministic BPE: one thread, every input sentence used (no sampling), identity
  // normalisation so Decode(Encode(text)) == text; "\n" is a user-defined piece so
  // documents keep their lines.
  const std::unordered_map<std::string, std::string> kwargs = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(spec.vocab_size)},
      {"hard_vocab_limit", "false"},
      {"character_coverage", spec.byte_fallback ? "0.9995" : "1.0"},
      {"byte_fallback", spec.byte_fallback ? "true" : "false"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "true"},
      {"split_digits", "true"},
      {"user_defined_symbols", "\n,\t"},
      {"max_sentence_length", std::to_string(kMaxSentenceBytes)},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"num_threads", "1"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"minloglevel", "2"},
  };
  sentencepiece::SetRandomGeneratorSeed(spec.seed == static_cast<uint32_t>(-1) ? 0 : spec.seed);
  // A copy only when some text is too long or has a run the trainer cannot take.
  std::vector<std::string> broken;
  bool copied = false;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (!copied && !HasLongRun(texts[i]) && texts[i].size() <= kMaxPieceBytes) continue;
    if (!copied) broken.assign(texts.begin(), texts.begin() + i), copied = true;
    for (const std::string& piece : CutLongText(texts[i])) {
      broken.push_back(HasLongRun(piece) ? BreakLongRuns(piece) : piece);
    }
  }
  VectorIterator iterator(copied ? broken : texts);
  const auto status = sentencepiece::SentencePieceTrainer::Train(kwargs, &iterator, model);
  return status.ok() ? std::string() : std::string(status.ToString());
}

struct Processor::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

Processor::Processor() : impl_(std::make_unique<Impl>()) {}
Processor::~Processor() = default;

std::string Processor::Load(const std::string& serialized) {
  const auto status = impl_->sp.LoadFromSerializedProto(serialized);
  return status.ok() ? std::string() : std::string(status.ToString());
}

std::string Processor::Encode(std::string_view text, std::vector<int>* ids) const {
  const auto status = impl_->sp.Encode(text, ids);
  return status.ok() ? std::string() : std::string(status.ToString());
}

std::string Processor::Decode(const std::vector<int>& ids, std::string* text) const {
  const auto status = impl_->sp.Decode(ids, text);
  return status.ok() ? std::string() : std::string(status.ToString());
}

int Processor::PieceSize() const { return impl_->sp.GetPieceSize(); }
int Processor::EosId() const { return impl_->sp.eos_id(); }
int Processor::UnkId() const { return impl_->sp.unk_id(); }
std::string Processor::IdToPiece(int id) const { return impl_->sp.IdToPiece(id); }

}  // namespace switchyard::data::spm
