// The tokenizer: a SentencePiece BPE model trained on the corpus (Sennrich et al., "Neural
// machine translation of rare words with subword units", ACL 2016; Kudo & Richardson,
// "SentencePiece", EMNLP 2018).
//
// Training is deterministic (one thread, every text used, fixed seed) and lossless:
// identity normalisation, whitespace kept, "\n" and "\t" are pieces of their own, so
// Decode(Encode(text)) == text for any text made of characters seen in training. With a
// vocabulary of 384 or more, unseen characters fall back to byte pieces (<0xNN>) and
// round-trip too; below that every training character must fit in the vocabulary.
// Special ids: 0 <unk>, 1 <s>, 2 </s> (the end-of-document token); no padding id.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/status.h"

namespace switchyard::data {

namespace spm {
class Processor;
}  // namespace spm

// The smallest vocabulary that turns on byte fallback.
inline constexpr int kByteFallbackMinVocab = 384;

// How the tokenizer is trained.
struct TokenizerOptions {
  int vocab_size = 2000;  // a soft limit: a small corpus may give fewer pieces
  uint64_t seed = 0;      // SentencePiece's random generator
};

// Trains a BPE model on `texts` and returns the serialized model (the bytes of a
// `tokenizer.model` file). Errors say what to change ("--vocab 100 is smaller than ...").
StatusOr<std::string> TrainTokenizer(const std::vector<std::string>& texts,
                                     const TokenizerOptions& options);

// The largest tokenizer.model prep and the loader read (real ones are a few MB).
inline constexpr uint64_t kMaxTokenizerModelBytes = uint64_t{256} << 20;

// The bytes of a tokenizer model file; errors name the path (missing, or larger than
// kMaxTokenizerModelBytes).
StatusOr<std::string> ReadTokenizerModel(const std::string& path);

// A loaded model. Copies share the model.
class Tokenizer {
 public:
  // Loads a serialized model; `source` names it in errors.
  static StatusOr<Tokenizer> FromSerialized(const std::string& model,
                                            const std::string& source = "<memory>");
  // Reads and loads a `tokenizer.model` file.
  static StatusOr<Tokenizer> Load(const std::string& path);

  // Token ids of `text` (no end-of-document token).
  std::vector<int32_t> Encode(std::string_view text) const;
  // The text of `ids`.
  std::string Decode(const std::vector<int32_t>& ids) const;
  // The piece of one id ("▁the", "\n", "<0x0A>").
  std::string Piece(int32_t id) const;

  // Number of pieces; every id is below it.
  int vocab_size() const;
  // The end-of-document token (</s>).
  int32_t eos_id() const;
  // The unknown-character token (<unk>).
  int32_t unk_id() const;

 private:
  explicit Tokenizer(std::shared_ptr<const spm::Processor> processor)
      : processor_(std::move(processor)) {}
  std::shared_ptr<const spm::Processor> processor_;
};

}  // namespace switchyard::data
