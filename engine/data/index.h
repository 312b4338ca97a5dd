// index.json: what `switchyard prep` wrote into its output folder, and where every
// document's tokens are. docs/data.md shows a complete file; in short:
//   {"format": "switchyard-tokens", "version": 1, "vocab_size": 2000, "eos_id": 2,
//    "dtype": "u16", "tokenizer": "tokenizer.model", "seed": 0, "val_fraction": 0.05,
//    "labels": ["de", "en"],
//    "totals": {"de": {"train": {"documents": 9, "tokens": 812}, "val": {...}}, ...},
//    "shards": [{"name": "train-00000.bin", "split": "train", "tokens": 1500}, ...],
//    "documents": [{"split": "train", "shard": 0, "offset": 0, "tokens": 57,
//                   "label": "en", "source": "/usr/share/games/fortunes/art"}, ...]}
// Documents are listed in corpus order; inside each shard they are contiguous and in
// order, each ending with the end-of-document token.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace switchyard::data {

// File names inside a prep output folder.
inline constexpr char kIndexFile[] = "index.json";
inline constexpr char kTokenizerFile[] = "tokenizer.model";
// index.json's "format" and "version"; a reader refuses any other.
inline constexpr char kIndexFormat[] = "switchyard-tokens";
inline constexpr int kIndexVersion = 1;

// The two splits; documents go to one of them.
enum class Split : int { kTrain = 0, kVal = 1 };
// "train" or "val".
const char* SplitName(Split split);

// One shard file (a name inside the output folder).
struct ShardEntry {
  std::string name;  // "train-00000.bin"
  Split split = Split::kTrain;
  uint64_t tokens = 0;
};

// Where one document's tokens are.
struct DocumentEntry {
  Split split = Split::kTrain;
  int shard = 0;        // index into Index::shards
  uint64_t offset = 0;  // first token inside the shard
  uint64_t tokens = 0;  // with the end-of-document token
  int label = 0;        // index into Index::labels
  std::string source;   // the file it came from
};

// Documents and tokens of one label, per split (indexed by Split).
struct LabelTotals {
  std::array<uint64_t, 2> documents{};
  std::array<uint64_t, 2> tokens{};
};

// The whole index.json.
struct Index {
  int vocab_size = 0;
  int eos_id = 0;
  uint32_t token_bytes = 2;  // "dtype": "u16" (2) or "u32" (4)
  std::string tokenizer = kTokenizerFile;
  uint64_t seed = 0;
  double val_fraction = 0;
  std::vector<std::string> labels;  // sorted
  std::vector<LabelTotals> totals;  // per label
  std::vector<ShardEntry> shards;
  std::vector<DocumentEntry> documents;
};

// Recomputes `totals` from `documents`.
void ComputeTotals(Index* index);

// The JSON text in three parts, so prep can write it while streaming the documents:
// everything before the first document, one document's line, and the end.
std::string IndexHeadJson(const Index& index);
std::string DocumentJson(const Index& index, const DocumentEntry& doc, bool last);
const char* IndexTailJson();

// The JSON text: fixed key order, one document per line, so equal indexes are equal bytes.
std::string IndexToJson(const Index& index);

// Parses and checks an index: every field present with the right type, labels and
// shards well formed, documents contiguous inside their shards and adding up to the
// shard sizes, totals matching the documents. Errors name `path` and the field.
StatusOr<Index> ParseIndex(const std::string& text, const std::string& path);

// Reads DIR/index.json.
StatusOr<Index> ReadIndex(const std::string& dir);

}  // namespace switchyard::data
