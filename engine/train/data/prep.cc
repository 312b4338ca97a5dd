// The prep pipeline; see prep.h.
#include "engine/train/data/prep.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <regex>
#include <thread>

#include "engine/core/philox.h"
#include "engine/core/safetensors.h"
#include "engine/train/data/shards.h"
#include "engine/train/data/tokenizer.h"

namespace switchyard::data {
namespace {

namespace fs = std::filesystem;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string Fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

// Names prep writes into its folder (and nothing else).
bool IsPrepOutputName(const std::string& name) {
  static const std::regex kShard("(train|val)-[0-9]{5}\\.bin");
  return name == kIndexFile || name == kTokenizerFile || std::regex_match(name, kShard);
}

// Keeps at most `max_per_label` documents of each label: those with the smallest
// Philox draw (ties by position), still in corpus order.
std::vector<Document> SampleDocuments(std::vector<Document> documents, int64_t max_per_label,
                                      uint64_t seed) {
  if (max_per_label <= 0) return documents;
  const RngKey key{seed, StreamId("data.prep.sample")};
  std::map<std::string, std::vector<std::pair<uint32_t, size_t>>> by_label;
  for (size_t i = 0; i < documents.size(); ++i) {
    by_label[documents[i].label].push_back({RandomBitsAt(key, i), i});
  }
  std::vector<bool> keep(documents.size(), false);
  for (auto& [label, draws] : by_label) {
    const size_t n = std::min(draws.size(), static_cast<size_t>(max_per_label));
    std::partial_sort(draws.begin(), draws.begin() + n, draws.end());
    for (size_t k = 0; k < n; ++k) keep[draws[k].second] = true;
  }
  std::vector<Document> kept;
  for (size_t i = 0; i < documents.size(); ++i) {
    if (keep[i]) kept.push_back(std::move(documents[i]));
  }
  return kept;
}

// Encodes every document and appends </s>; threads split the documents, the result does
// not depend on how.
std::vector<std::vector<int32_t>> EncodeAll(const Tokenizer& tokenizer,
                                            const std::vector<Document>& documents) {
  std::vector<std::vector<int32_t>> encoded(documents.size());
  const size_t threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  std::vector<std::thread> workers;
  for (size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (size_t i = t; i < documents.size(); i += threads) {
        encoded[i] = tokenizer.Encode(documents[i].text);
        encoded[i].push_back(tokenizer.eos_id());
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
  return encoded;
}

// Fills `index` (shards and documents) and writes the shards into `dir`.
Status WriteShards(const std::string& dir, const std::vector<Document>& documents,
                   const std::vector<Split>& splits,
                   const std::vector<std::vector<int32_t>>& encoded, int64_t shard_tokens,
                   Index* index) {
  std::map<std::string, int> label_ids;
  for (size_t l = 0; l < index->labels.size(); ++l) label_ids[index->labels[l]] = l;
  for (Split split : {Split::kTrain, Split::kVal}) {
    std::vector<int32_t> tokens;
    int shard = -1;
    const auto flush = [&]() -> Status {
      if (shard < 0) return OkStatus();
      index->shards[shard].tokens = tokens.size();
      SY_RETURN_IF_ERROR(
          WriteShard(dir + "/" + index->shards[shard].name, tokens, index->token_bytes));
      tokens.clear();
      return OkStatus();
    };
    int count = 0;
    for (size_t i = 0; i < documents.size(); ++i) {
      if (splits[i] != split) continue;
      const std::vector<int32_t>& doc = encoded[i];
      if (shard < 0 ||
          (!tokens.empty() && tokens.size() + doc.size() > static_cast<size_t>(shard_tokens))) {
        SY_RETURN_IF_ERROR(flush());
        char name[32];
        std::snprintf(name, sizeof(name), "%s-%05d.bin", SplitName(split), count++);
        shard = static_cast<int>(index->shards.size());
        index->shards.push_back(ShardEntry{name, split, 0});
      }
      index->documents[i] = DocumentEntry{split,
                                          shard,
                                          tokens.size(),
                                          doc.size(),
                                          label_ids.at(documents[i].label),
                                          documents[i].source};
      tokens.insert(tokens.end(), doc.begin(), doc.end());
    }
    SY_RETURN_IF_ERROR(flush());
  }
  return OkStatus();
}

// fsyncs a folder so a rename inside it is durable.
void SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Moves the finished `staging` folder to `out`, replacing a previous prep output.
Status Publish(const std::string& staging, const std::string& out, bool force) {
  SY_RETURN_IF_ERROR(CheckOutputDir(out, force));
  std::error_code ec;
  std::string old;
  if (fs::exists(out, ec)) {
    if (fs::is_empty(out, ec)) {
      fs::remove(out, ec);
    } else {
      old = StrCat(out, ".old-", ::getpid());
      fs::rename(out, old, ec);
    }
    if (ec) return FailedPrecondition(out, ": cannot replace (", ec.message(), ")");
  }
  fs::rename(staging, out, ec);
  if (ec) {
    if (!old.empty()) fs::rename(old, out, ec);
    return FailedPrecondition(out, ": cannot move ", staging, " into place");
  }
  SyncDirectory(fs::absolute(out).parent_path().string());
  if (!old.empty()) fs::remove_all(old, ec);
  return OkStatus();
}

}  // namespace

Status PrepOptions::Validate() const {
  if (out_dir.empty()) return InvalidArgument("--out is required");
  if (vocab_size < 8 || vocab_size > (1 << 24)) {
    return InvalidArgument("--vocab must be in [8, 16777216], got ", vocab_size);
  }
  if (!(val_fraction >= 0 && val_fraction < 1)) {
    return InvalidArgument("--val-fraction must be in [0, 1), got ", val_fraction);
  }
  if (max_docs_per_label < 0) {
    return InvalidArgument("--max-docs-per-label must be >= 0, got ", max_docs_per_label);
  }
  if (shard_tokens < 1) return InvalidArgument("--shard-tokens must be >= 1, got ", shard_tokens);
  return OkStatus();
}

bool IsValidation(uint64_t seed, uint64_t index, double val_fraction) {
  return UniformAt(RngKey{seed, StreamId("data.prep.split")}, index) < val_fraction;
}

Status CheckOutputDir(const std::string& dir, bool force) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return OkStatus();
  if (!fs::is_directory(dir, ec)) return FailedPrecondition(dir, " exists and is not a folder");
  if (fs::is_empty(dir, ec)) return OkStatus();
  if (!fs::exists(fs::path(dir) / kIndexFile, ec)) {
    return FailedPrecondition(dir, " is not empty and holds no prep output (no ", kIndexFile,
                              "); choose a new or empty folder");
  }
  if (!force) {
    return FailedPrecondition(dir, " already holds a prep output (", kIndexFile,
                              "); pass --force to replace it");
  }
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!IsPrepOutputName(name) || !entry.is_regular_file()) {
      return FailedPrecondition(dir, " holds ", name,
                                ", which prep did not write; not replacing the folder");
    }
  }
  return OkStatus();
}

StatusOr<Index> Prepare(const PrepOptions& options,
                        const std::function<void(const std::string&)>& progress) {
  const auto say = [&](const std::string& line) {
    if (progress) progress(line);
  };
  SY_RETURN_IF_ERROR(options.Validate());
  SY_RETURN_IF_ERROR(CheckOutputDir(options.out_dir, options.force));

  // 1. Documents.
  auto start = std::chrono::steady_clock::now();
  std::vector<CorpusFile> files;
  if (options.files.empty()) {
    SY_ASSIGN_OR_RETURN(files, FortuneCorpusFiles(options.fortune_root));
  } else {
    SY_ASSIGN_OR_RETURN(files, UserCorpusFiles(options.files, options.label));
  }
  SY_ASSIGN_OR_RETURN(std::vector<Document> documents, ReadCorpus(files));
  const size_t read = documents.size();
  documents = SampleDocuments(std::move(documents), options.max_docs_per_label, options.seed);
  if (documents.empty()) {
    return InvalidArgument("the corpus holds no documents (", files.size(), " files read)");
  }
  Index index;
  index.seed = options.seed;
  index.val_fraction = options.val_fraction;
  for (const Document& doc : documents) index.labels.push_back(doc.label);
  std::sort(index.labels.begin(), index.labels.end());
  index.labels.erase(std::unique(index.labels.begin(), index.labels.end()), index.labels.end());
  say(StrCat("read ", read, " documents from ", files.size(),
             " files (labels: ", index.labels.size(), ")",
             documents.size() < read ? StrCat(", kept ", documents.size()) : "", " in ",
             Fixed(SecondsSince(start), 1), " s"));

  // 2. Splits.
  std::vector<Split> splits(documents.size());
  std::vector<std::string> train_texts;
  for (size_t i = 0; i < documents.size(); ++i) {
    splits[i] = IsValidation(options.seed, i, options.val_fraction) ? Split::kVal : Split::kTrain;
    if (splits[i] == Split::kTrain) train_texts.push_back(documents[i].text);
  }
  if (train_texts.empty()) {
    return InvalidArgument("no document went to training; lower --val-fraction");
  }

  // 3. Tokenizer.
  start = std::chrono::steady_clock::now();
  SY_ASSIGN_OR_RETURN(
      std::string model,
      TrainTokenizer(train_texts, TokenizerOptions{options.vocab_size, options.seed}));
  train_texts.clear();
  SY_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::FromSerialized(model));
  index.vocab_size = tokenizer.vocab_size();
  index.eos_id = tokenizer.eos_id();
  index.token_bytes = TokenBytesForVocab(index.vocab_size);
  say(StrCat("trained the tokenizer: ", index.vocab_size, " pieces in ",
             Fixed(SecondsSince(start), 1), " s"));

  // 4. Encoding.
  start = std::chrono::steady_clock::now();
  const std::vector<std::vector<int32_t>> encoded = EncodeAll(tokenizer, documents);
  say(StrCat("encoded ", documents.size(), " documents in ", Fixed(SecondsSince(start), 1), " s"));

  // 5. Files, into a staging folder that replaces the output at the end.
  const fs::path out = fs::path(options.out_dir).lexically_normal();
  const std::string out_dir = out.has_filename() ? out.string() : out.parent_path().string();
  const std::string staging = StrCat(out_dir, ".tmp-", ::getpid());
  std::error_code ec;
  fs::remove_all(staging, ec);
  if (fs::path parent = fs::absolute(out_dir).parent_path(); !fs::exists(parent, ec)) {
    fs::create_directories(parent, ec);
  }
  if (!fs::create_directory(staging, ec) || ec) {
    return FailedPrecondition(staging, ": cannot create (", ec.message(), ")");
  }
  index.documents.resize(documents.size());
  Status status = WriteShards(staging, documents, splits, encoded, options.shard_tokens, &index);
  ComputeTotals(&index);
  if (status.ok()) status = WriteFileAtomically(staging + "/" + kTokenizerFile, model);
  if (status.ok()) status = WriteFileAtomically(staging + "/" + kIndexFile, IndexToJson(index));
  if (status.ok()) status = Publish(staging, out_dir, options.force);
  if (!status.ok()) {
    fs::remove_all(staging, ec);
    return status;
  }
  return index;
}

std::string SummaryTable(const Index& index) {
  char line[160];
  std::snprintf(line, sizeof(line), "%-8s %12s %14s %10s %12s\n", "label", "train docs",
                "train tokens", "val docs", "val tokens");
  std::string out = line;
  LabelTotals all;
  const auto row = [&](const std::string& label, const LabelTotals& t) {
    std::snprintf(line, sizeof(line), "%-8s %12llu %14llu %10llu %12llu\n", label.c_str(),
                  static_cast<unsigned long long>(t.documents[0]),
                  static_cast<unsigned long long>(t.tokens[0]),
                  static_cast<unsigned long long>(t.documents[1]),
                  static_cast<unsigned long long>(t.tokens[1]));
    out += line;
  };
  for (size_t l = 0; l < index.labels.size(); ++l) {
    row(index.labels[l], index.totals[l]);
    for (int s = 0; s < 2; ++s) {
      all.documents[s] += index.totals[l].documents[s];
      all.tokens[s] += index.totals[l].tokens[s];
    }
  }
  row("all", all);
  out +=
      StrCat("vocabulary ", index.vocab_size, " pieces (", index.token_bytes == 2 ? "u16" : "u32",
             " tokens), ", index.shards.size(), " shards\n");
  return out;
}

}  // namespace switchyard::data
