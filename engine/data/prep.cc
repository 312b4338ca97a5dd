// The prep pipeline; see prep.h.
#include "engine/data/prep.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <thread>

#include "engine/core/file.h"
#include "engine/core/philox.h"
#include "engine/data/parallel_encoder.h"
#include "engine/data/prep_output.h"
#include "engine/data/shards.h"
#include "engine/data/tokenizer.h"
#include "engine/data/tokenizer_sample.h"

namespace switchyard::data {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string Fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

std::string Megabytes(uint64_t bytes) { return Fixed(bytes / 1e6, 1) + " MB"; }

// Which documents of the corpus are kept, as positions j in reading order (ascending),
// or all of them. Position() maps j to the document's index i among the kept ones; it
// must be called with ascending j (Rewind() starts again).
class KeptDocuments {
 public:
  KeptDocuments() = default;
  explicit KeptDocuments(std::vector<uint64_t> kept) : all_(false), kept_(std::move(kept)) {}
  std::optional<uint64_t> Position(uint64_t j) {
    if (all_) return j;
    if (next_ < kept_.size() && kept_[next_] == j) return next_++;
    return std::nullopt;
  }
  void Rewind() { next_ = 0; }

 private:
  bool all_ = true;
  std::vector<uint64_t> kept_;
  size_t next_ = 0;
};

// Reads every document of `files` in order and calls fn(doc, j, f) with its position j
// and its file's index f.
// With `callbacks`, bad JSONL lines are reported (the first few of each file, then the
// total); `bad_lines` receives their count.
Status WalkCorpus(const std::vector<CorpusFile>& files, const ReadOptions& options,
                  const std::function<Status(Document& doc, uint64_t j, int f)>& fn,
                  const PrepCallbacks* callbacks, uint64_t* bad_lines) {
  uint64_t j = 0, bad = 0;
  Document doc;
  for (size_t f = 0; f < files.size(); ++f) {
    const CorpusFile& file = files[f];
    SY_ASSIGN_OR_RETURN(std::unique_ptr<DocumentReader> reader,
                        DocumentReader::Open(file, options));
    while (true) {
      SY_ASSIGN_OR_RETURN(bool more, reader->Next(&doc));
      if (!more) break;
      SY_RETURN_IF_ERROR(fn(doc, j++, static_cast<int>(f)));
    }
    bad += reader->bad_lines();
    if (callbacks != nullptr && callbacks->warning) {
      for (const std::string& message : reader->bad_line_messages()) {
        callbacks->warning(StrCat(message, " (line skipped)"));
      }
      const uint64_t unreported = reader->bad_lines() - reader->bad_line_messages().size();
      if (unreported > 0) {
        callbacks->warning(StrCat(file.path, ": ", unreported, " more bad lines skipped"));
      }
    }
  }
  if (bad_lines != nullptr) *bad_lines = bad;
  return OkStatus();
}

// The survey of the corpus (stage 1 and 2): the kept documents, their labels and size,
// and the tokenizer's sample.
struct Survey {
  uint64_t read = 0;       // documents read
  uint64_t kept = 0;       // documents kept
  uint64_t bytes = 0;      // text bytes of the kept documents
  uint64_t train = 0;      // kept documents in training
  uint64_t bad_lines = 0;  // skipped JSONL lines
  std::set<std::string> labels;
  KeptDocuments keep;
};

StatusOr<Survey> SurveyCorpus(const PrepOptions& options, const std::vector<CorpusFile>& files,
                              const PrepCallbacks& callbacks, TokenizerSample* sample) {
  Survey survey;
  const bool capped = options.max_docs_per_label > 0;
  // Stage 2 for a kept document i: its split, and the tokenizer's sample.
  const auto visit = [&](Document& doc, uint64_t i) {
    ++survey.kept;
    survey.bytes += doc.text.size();
    survey.labels.insert(doc.label);
    if (!IsValidation(options.seed, i, options.val_fraction)) {
      ++survey.train;
      if (sample != nullptr) sample->Offer(i, doc.text);
    }
  };
  if (!capped) {
    SY_RETURN_IF_ERROR(WalkCorpus(
        files, options.read,
        [&](Document& doc, uint64_t j, int) {
          ++survey.read;
          visit(doc, j);
          return OkStatus();
        },
        &callbacks, &survey.bad_lines));
    return survey;
  }
  // Keep the max_docs_per_label documents of each label with the smallest draw
  // RandomBitsAt({seed, StreamId("data.prep.sample")}, j) (ties by position).
  const RngKey key{options.seed, StreamId("data.prep.sample")};
  std::map<std::string, std::priority_queue<std::pair<uint32_t, uint64_t>>> best;
  SY_RETURN_IF_ERROR(WalkCorpus(
      files, options.read,
      [&](Document& doc, uint64_t j, int) {
        ++survey.read;
        auto& heap = best[doc.label];
        heap.push({RandomBitsAt(key, j), j});
        if (heap.size() > static_cast<size_t>(options.max_docs_per_label)) heap.pop();
        return OkStatus();
      },
      &callbacks, &survey.bad_lines));
  std::vector<uint64_t> kept;
  for (auto& [label, heap] : best) {
    for (; !heap.empty(); heap.pop()) kept.push_back(heap.top().second);
  }
  std::sort(kept.begin(), kept.end());
  survey.keep = KeptDocuments(std::move(kept));
  SY_RETURN_IF_ERROR(WalkCorpus(
      files, options.read,
      [&](Document& doc, uint64_t j, int) {
        if (std::optional<uint64_t> i = survey.keep.Position(j)) visit(doc, *i);
        return OkStatus();
      },
      nullptr, nullptr));
  survey.keep.Rewind();
  return survey;
}

// One document's place, kept in a temporary file while the shards are written.
struct DocumentRecord {
  uint64_t offset = 0;
  uint64_t tokens = 0;
  uint32_t shard = 0;  // among its split's shards
  uint32_t label = 0;
  uint32_t file = 0;
  uint32_t split = 0;
};

// Writes the shards of both splits as the encoded documents arrive (stage 3), and then
// index.json. A new shard starts when the next document would pass shard_tokens; a
// document never spans two shards.
class ShardSet {
 public:
  ShardSet(std::string dir, uint32_t token_bytes, int64_t shard_tokens, Index* index)
      : dir_(std::move(dir)), token_bytes_(token_bytes), shard_tokens_(shard_tokens),
        index_(index) {}
  ~ShardSet() {
    if (records_ != nullptr) std::fclose(records_);
  }

  Status Open() {
    records_path_ = dir_ + "/.documents.tmp";
    records_ = std::fopen(records_path_.c_str(), "w+b");
    if (records_ == nullptr) {
      return FailedPrecondition(records_path_, ": cannot create (", std::strerror(errno), ")");
    }
    return OkStatus();
  }

  Status Add(const EncodeItem& item) {
    const int s = static_cast<int>(item.split);
    std::unique_ptr<ShardWriter>& writer = writers_[s];
    const uint64_t n = item.tokens.size();
    if (writer == nullptr ||
        (writer->count() > 0 && writer->count() + n > static_cast<uint64_t>(shard_tokens_))) {
      SY_RETURN_IF_ERROR(Close(s));
      char name[32];
      std::snprintf(name, sizeof(name), "%s-%05zu.bin", SplitName(item.split), shards_[s].size());
      SY_ASSIGN_OR_RETURN(writer, ShardWriter::Create(dir_ + "/" + name, token_bytes_));
      shards_[s].push_back(ShardEntry{name, item.split, 0});
    }
    const DocumentRecord record{writer->count(), n, static_cast<uint32_t>(shards_[s].size() - 1),
                                static_cast<uint32_t>(item.label),
                                static_cast<uint32_t>(item.file), static_cast<uint32_t>(s)};
    if (std::fwrite(&record, sizeof(record), 1, records_) != 1) {
      return FailedPrecondition(records_path_, ": write failed (", std::strerror(errno), ")");
    }
    LabelTotals& totals = index_->totals[item.label];
    totals.documents[s] += 1;
    totals.tokens[s] += n;
    ++documents_;
    return writer->Append(item.tokens.data(), n);
  }

  // Finishes the shards and writes index.json: the training shards, then the validation
  // ones; the documents in corpus order.
  Status Finish(const std::vector<CorpusFile>& files) {
    SY_RETURN_IF_ERROR(Close(0));
    SY_RETURN_IF_ERROR(Close(1));
    index_->shards = shards_[0];
    index_->shards.insert(index_->shards.end(), shards_[1].begin(), shards_[1].end());
    const std::string path = dir_ + "/" + kIndexFile;
    std::FILE* out = std::fopen(path.c_str(), "wb");
    if (out == nullptr) return FailedPrecondition(path, ": cannot create (", std::strerror(errno), ")");
    bool ok = std::fputs(IndexHeadJson(*index_).c_str(), out) >= 0;
    std::rewind(records_);
    DocumentRecord record;
    for (uint64_t d = 0; ok && d < documents_; ++d) {
      ok = std::fread(&record, sizeof(record), 1, records_) == 1;
      if (!ok) break;
      DocumentEntry doc{static_cast<Split>(record.split),
                        static_cast<int>(record.shard + (record.split == 1 ? shards_[0].size() : 0)),
                        record.offset,
                        record.tokens,
                        static_cast<int>(record.label),
                        files[record.file].path};
      ok = std::fputs(DocumentJson(*index_, doc, d + 1 == documents_).c_str(), out) >= 0;
    }
    ok = ok && std::fputs(IndexTailJson(), out) >= 0 && std::fflush(out) == 0 &&
         ::fsync(::fileno(out)) == 0;
    ok = (std::fclose(out) == 0) && ok;
    if (!ok) return FailedPrecondition(path, ": write failed (", std::strerror(errno), ")");
    std::fclose(records_);
    records_ = nullptr;
    std::remove(records_path_.c_str());
    return OkStatus();
  }

 private:
  Status Close(int s) {
    if (writers_[s] == nullptr) return OkStatus();
    shards_[s].back().tokens = writers_[s]->count();
    Status status = writers_[s]->Finish();
    writers_[s] = nullptr;
    return status;
  }

  std::string dir_;
  uint32_t token_bytes_;
  int64_t shard_tokens_;
  Index* index_;
  std::unique_ptr<ShardWriter> writers_[2];
  std::vector<ShardEntry> shards_[2];
  std::string records_path_;
  std::FILE* records_ = nullptr;
  uint64_t documents_ = 0;
};

// Stage 3: reads the kept documents again, encodes them and writes the shards and the
// index into `staging`.
Status EncodeCorpus(const PrepOptions& options, const std::vector<CorpusFile>& files,
                    const Tokenizer& tokenizer, Survey* survey, const PrepCallbacks& callbacks,
                    const std::string& staging, Index* index) {
  std::map<std::string, int> label_ids;
  for (size_t l = 0; l < index->labels.size(); ++l) label_ids[index->labels[l]] = static_cast<int>(l);
  index->totals.assign(index->labels.size(), LabelTotals{});
  ShardSet shards(staging, index->token_bytes, options.shard_tokens, index);
  SY_RETURN_IF_ERROR(shards.Open());
  const int threads = options.threads > 0
                          ? options.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const Clock::time_point start = Clock::now();
  Clock::time_point last_report = start;
  EncodeProgress progress{0, survey->bytes, 0, 0};
  ParallelEncoder encoder(tokenizer, threads, [&](EncodeItem& item) -> Status {
    progress.bytes += item.text_bytes;
    ++progress.documents;
    if (callbacks.encoding && SecondsSince(last_report) >= 0.5) {
      last_report = Clock::now();
      progress.seconds = SecondsSince(start);
      callbacks.encoding(progress);
    }
    return shards.Add(item);
  });
  SY_RETURN_IF_ERROR(WalkCorpus(
      files, options.read,
      [&](Document& doc, uint64_t j, int file) -> Status {
        std::optional<uint64_t> i = survey->keep.Position(j);
        if (!i) return OkStatus();
        EncodeItem item;
        item.index = *i;
        item.label = label_ids.at(doc.label);
        item.file = file;
        item.split = IsValidation(options.seed, *i, options.val_fraction) ? Split::kVal
                                                                          : Split::kTrain;
        item.text_bytes = doc.text.size();
        item.text = std::move(doc.text);
        return encoder.Add(std::move(item));
      },
      nullptr, nullptr));
  SY_RETURN_IF_ERROR(encoder.Finish());
  progress.seconds = SecondsSince(start);
  if (callbacks.encoding) callbacks.encoding(progress);
  return shards.Finish(files);
}

// Passes `line` to the progress callback, if any.
void Say(const PrepCallbacks& callbacks, const std::string& line) {
  if (callbacks.progress) callbacks.progress(line);
}

// 1-2. The corpus files into *files, surveyed: documents, labels, the split and (sample
// non-null) the tokenizer's sample. Sets the index's seed, split and labels. InvalidArgument
// when no document is kept or none goes to training.
StatusOr<Survey> ReadCorpus(const PrepOptions& options, const PrepCallbacks& callbacks,
                            TokenizerSample* sample, std::vector<CorpusFile>* files,
                            Index* index) {
  const Clock::time_point start = Clock::now();
  if (options.files.empty()) {
    SY_ASSIGN_OR_RETURN(*files, FortuneCorpusFiles(options.fortune_root));
  } else {
    SY_ASSIGN_OR_RETURN(*files, UserCorpusFiles(options.files, options.label));
    SY_RETURN_IF_ERROR(CheckDistinctFiles(*files));
  }
  SY_ASSIGN_OR_RETURN(Survey survey, SurveyCorpus(options, *files, callbacks, sample));
  if (survey.bad_lines > 0 && callbacks.warning) {
    callbacks.warning(StrCat("skipped ", survey.bad_lines,
                             " bad JSONL lines (--strict makes them an error)"));
  }
  if (survey.kept == 0) {
    return InvalidArgument("the corpus holds no documents (", files->size(), " files read",
                           survey.bad_lines > 0 ? StrCat(", ", survey.bad_lines, " bad lines")
                                                : std::string(),
                           ")");
  }
  if (survey.train == 0) {
    return InvalidArgument("no document went to training; lower --val-fraction");
  }
  index->seed = options.seed;
  index->val_fraction = options.val_fraction;
  index->labels.assign(survey.labels.begin(), survey.labels.end());
  Say(callbacks, StrCat("read ", survey.read, " documents (", Megabytes(survey.bytes), ") from ",
                        files->size(), " files (labels: ", index->labels.size(), ")",
                        survey.kept < survey.read ? StrCat(", kept ", survey.kept) : "", " in ",
                        Fixed(SecondsSince(start), 1), " s"));
  return survey;
}

// The tokenizer: *tokenizer as loaded, or trained on the sample (its serialized model into
// *model). Sets the index's vocab_size, eos_id and token_bytes.
Status ProvideTokenizer(const PrepOptions& options, const PrepCallbacks& callbacks,
                        const Survey& survey, TokenizerSample& sample, std::string* model,
                        std::optional<Tokenizer>* tokenizer, Index* index) {
  const Clock::time_point start = Clock::now();
  if (!*tokenizer) {
    const uint64_t sampled = sample.kept(), sampled_bytes = sample.kept_bytes();
    if (sampled == 0) {
      return InvalidArgument("no training document fits in --tokenizer-sample-bytes ",
                             options.tokenizer_sample_bytes, " (the tokenizer trains on whole "
                             "documents); raise it");
    }
    SY_ASSIGN_OR_RETURN(*model, TrainTokenizer(sample.TakeTexts(),
                                               TokenizerOptions{options.vocab_size, options.seed}));
    SY_ASSIGN_OR_RETURN(Tokenizer trained, Tokenizer::FromSerialized(*model));
    *tokenizer = trained;
    Say(callbacks, StrCat("trained the tokenizer: ", (*tokenizer)->vocab_size(), " pieces on ",
                          sampled, " of ", survey.train, " training documents (",
                          Megabytes(sampled_bytes), ") in ", Fixed(SecondsSince(start), 1),
                          " s"));
  } else {
    Say(callbacks, StrCat("loaded the tokenizer ", options.tokenizer_path, ": ",
                          (*tokenizer)->vocab_size(), " pieces"));
  }
  index->vocab_size = (*tokenizer)->vocab_size();
  index->eos_id = (*tokenizer)->eos_id();
  index->token_bytes = TokenBytesForVocab(index->vocab_size);
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
  if (threads < 0 || threads > 4096) {
    return InvalidArgument("--threads must be in [0, 4096] (0: every core), got ", threads);
  }
  if (tokenizer_sample_bytes < 1) {
    return InvalidArgument("--tokenizer-sample-bytes must be >= 1, got ", tokenizer_sample_bytes);
  }
  if (read.json_key.empty()) return InvalidArgument("--json-key must not be empty");
  if (!label.empty() && !IsValidLabel(label)) {
    return InvalidArgument("--label \"", label, "\" is not a label (non-empty, no whitespace)");
  }
  return OkStatus();
}

bool IsValidation(uint64_t seed, uint64_t index, double val_fraction) {
  return UniformAt(RngKey{seed, StreamId("data.prep.split")}, index) < val_fraction;
}

StatusOr<Index> Prepare(const PrepOptions& options, const PrepCallbacks& callbacks) {
  SY_RETURN_IF_ERROR(options.Validate());
  const std::string out_dir = NormalizedOutDir(options.out_dir);
  SY_RETURN_IF_ERROR(CheckOutputDir(out_dir, options.force));
  SY_RETURN_IF_ERROR(CheckOutputCreatable(options.out_dir));

  // An existing tokenizer is loaded first: a model that does not load fails fast.
  std::string model;
  std::optional<Tokenizer> tokenizer;
  if (!options.tokenizer_path.empty()) {
    SY_ASSIGN_OR_RETURN(model, ReadTokenizerModel(options.tokenizer_path));
    SY_ASSIGN_OR_RETURN(Tokenizer loaded, Tokenizer::FromSerialized(model, options.tokenizer_path));
    tokenizer = loaded;
  }

  // 1-2. Documents, labels, the split and the tokenizer's sample; then the tokenizer.
  Index index;
  std::vector<CorpusFile> files;
  TokenizerSample sample(options.tokenizer_sample_bytes, options.seed);
  SY_ASSIGN_OR_RETURN(Survey survey, ReadCorpus(options, callbacks, tokenizer ? nullptr : &sample,
                                                &files, &index));
  SY_RETURN_IF_ERROR(
      ProvideTokenizer(options, callbacks, survey, sample, &model, &tokenizer, &index));

  // 3. Encoding and the files, into a staging folder that replaces the output at the end.
  SY_ASSIGN_OR_RETURN(const std::string staging, CreateStaging(out_dir));
  Status status =
      EncodeCorpus(options, files, *tokenizer, &survey, callbacks, staging, &index);
  if (status.ok()) status = WriteFileAtomically(staging + "/" + kTokenizerFile, model);
  if (status.ok()) status = Publish(staging, out_dir, options.force);
  if (!status.ok()) {
    std::error_code ec;
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
