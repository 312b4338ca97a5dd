// The one place that includes SentencePiece's headers. SentencePiece 0.1.97 defines
// `absl::string_view` as an alias of std::string_view, which clashes with Debian's abseil
// (its own class), so this file uses plain std types and reports errors as strings; the
// rest of the folder (tokenizer.h) wraps it in Status.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace switchyard::data::spm {

// How the BPE model is trained (see TrainBpe in the .cc for the SentencePiece flags).
struct BpeSpec {
  int vocab_size = 2000;       // a soft limit: a small corpus may give fewer pieces
  uint32_t seed = 0;           // SentencePiece's random generator (sampling, if any)
  bool byte_fallback = false;  // unknown characters become <0xNN> byte pieces
};

// Trains a BPE model on `texts` (each may hold newlines; "\n" is its own piece) and
// stores the serialized ModelProto in *model. Returns "" on success, else the error.
std::string TrainBpe(const std::vector<std::string>& texts, const BpeSpec& spec,
                     std::string* model);

// A loaded model; wraps sentencepiece::SentencePieceProcessor.
class Processor {
 public:
  Processor();
  ~Processor();
  Processor(const Processor&) = delete;
  Processor& operator=(const Processor&) = delete;

  // Loads a serialized ModelProto. Returns "" on success, else the error.
  std::string Load(const std::string& serialized);
  // Token ids of `text`. Returns "" on success, else the error.
  std::string Encode(std::string_view text, std::vector<int>* ids) const;
  // The text of `ids`. Returns "" on success, else the error.
  std::string Decode(const std::vector<int>& ids, std::string* text) const;
  // Vocabulary size and special ids of the loaded model.
  int PieceSize() const;
  int EosId() const;
  int UnkId() const;
  // The piece of one id.
  std::string IdToPiece(int id) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace switchyard::data::spm
