// The SentencePiece BPE tokenizer; see tokenizer.h. SentencePiece itself is reached only
// through sentencepiece_bridge.h (its headers clash with abseil's).
#include "engine/data/tokenizer.h"

#include <filesystem>
#include <set>

#include "engine/core/check.h"
#include "engine/core/file.h"
#include "engine/data/sentencepiece_bridge.h"

namespace switchyard::data {
namespace {

// Pieces SentencePiece always adds: <unk>, <s>, </s>, "\n", "\t".
constexpr int kMetaPieces = 5;

// Distinct characters (UTF-8 sequences; the corpus reader made them valid) in `texts`,
// not counting the user-defined "\n" and "\t".
size_t DistinctCharacters(const std::vector<std::string>& texts) {
  std::set<std::string_view> chars;
  for (const std::string& text : texts) {
    size_t i = 0;
    while (i < text.size()) {
      const unsigned char c = static_cast<unsigned char>(text[i]);
      const size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
      if (text[i] != '\n' && text[i] != '\t') chars.insert(std::string_view(text).substr(i, n));
      i += n;
    }
  }
  return chars.size();
}

}  // namespace

StatusOr<std::string> TrainTokenizer(const std::vector<std::string>& texts,
                                     const TokenizerOptions& options) {
  if (options.vocab_size < kMetaPieces + 1) {
    return InvalidArgument("vocabulary size ", options.vocab_size, " is too small (minimum ",
                           kMetaPieces + 1, ")");
  }
  if (texts.empty()) return InvalidArgument("no text to train the tokenizer on");
  spm::BpeSpec spec;
  spec.vocab_size = options.vocab_size;
  spec.seed = static_cast<uint32_t>(options.seed ^ (options.seed >> 32));
  spec.byte_fallback = options.vocab_size >= kByteFallbackMinVocab;
  if (!spec.byte_fallback) {
    // Without byte fallback every character needs a piece; say so before SentencePiece
    // fails with its own wording.
    const size_t chars = DistinctCharacters(texts);
    if (chars + kMetaPieces > static_cast<size_t>(options.vocab_size)) {
      return InvalidArgument("vocabulary size ", options.vocab_size, " is smaller than the ", chars,
                             " distinct characters plus ", kMetaPieces,
                             " special pieces the text needs; use at least ", chars + kMetaPieces,
                             " (or ", kByteFallbackMinVocab, "+, which turns on byte fallback)");
    }
  }
  std::string model;
  const std::string error = spm::TrainBpe(texts, spec, &model);
  if (!error.empty()) return Internal("training the tokenizer failed: ", error);
  return model;
}

StatusOr<Tokenizer> Tokenizer::FromSerialized(const std::string& model, const std::string& source) {
  auto processor = std::make_shared<spm::Processor>();
  const std::string error = processor->Load(model);
  if (!error.empty()) return DataLoss(source, ": not a SentencePiece model (", error, ")");
  if (processor->EosId() < 0) return DataLoss(source, ": the model has no </s> piece");
  return Tokenizer(std::move(processor));
}

StatusOr<std::string> ReadTokenizerModel(const std::string& path) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) return NotFound(path, ": cannot open the tokenizer model (", ec.message(), ")");
  if (size > kMaxTokenizerModelBytes) {
    return InvalidArgument(path, ": ", size, " bytes is too large for a SentencePiece model (at most ",
                           kMaxTokenizerModelBytes, "); is it the model?");
  }
  return ReadFile(path);
}

StatusOr<Tokenizer> Tokenizer::Load(const std::string& path) {
  SY_ASSIGN_OR_RETURN(std::string bytes, ReadTokenizerModel(path));
  return FromSerialized(bytes, path);
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text) const {
  std::vector<int> ids;
  const std::string error = processor_->Encode(text, &ids);
  SY_CHECK(error.empty()) << "SentencePiece Encode failed: " << error;
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string text;
  const std::string error = processor_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  SY_CHECK(error.empty()) << "SentencePiece Decode failed: " << error;
  return text;
}

std::string Tokenizer::Piece(int32_t id) const { return processor_->IdToPiece(id); }
int Tokenizer::vocab_size() const { return processor_->PieceSize(); }
int32_t Tokenizer::eos_id() const { return processor_->EosId(); }
int32_t Tokenizer::unk_id() const { return processor_->UnkId(); }

}  // namespace switchyard::data
