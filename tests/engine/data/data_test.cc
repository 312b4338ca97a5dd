// `switchyard prep` and the data loader: corpus splitting, the tokenizer round trip, the
// shard and index formats, bitwise-reproducible prep output and --force, and the loader's
// determinism and layout invariance (the union of the dp ranks' batches is the dp=1 batch).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "engine/data/corpus.h"
#include "engine/data/document_reader.h"
#include "engine/data/index.h"
#include "engine/data/loader.h"
#include "engine/data/prep.h"
#include "engine/data/shards.h"
#include "engine/data/tokenizer.h"
#include "tests/testing/files.h"

namespace switchyard::data {
namespace {

namespace fs = std::filesystem;
using test_util::ReadBytes;
using test_util::WriteBytes;

// A small corpus in three "languages": en and de in fortune format, it in paragraphs.
std::string MakeText(const std::vector<std::string>& words, int docs, int seed, bool fortune) {
  std::string text;
  uint32_t state = 12345u + seed;
  const auto next = [&] { return (state = state * 1664525u + 1013904223u) >> 8; };
  for (int d = 0; d < docs; ++d) {
    const int n = 4 + next() % 20;
    for (int w = 0; w < n; ++w) {
      text += words[next() % words.size()];
      text += (w + 1 == n) ? "\n" : (next() % 7 == 0 ? "\n" : " ");
    }
    text += fortune ? "%\n" : "\n";
  }
  return text;
}

class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sy_data_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    WriteBytes(
        dir_ / "corpus/en.txt",
        MakeText({"the", "cat", "sat", "on", "mat", "dog", "ran", "far", "away"}, 40, 1, true));
    WriteBytes(
        dir_ / "corpus/de.txt",
        MakeText({"der", "hund", "lief", "weit", "weg", "und", "schlief", "katze"}, 30, 2, true));
    WriteBytes(
        dir_ / "corpus/it.txt",
        MakeText({"il", "gatto", "cane", "corse", "lontano", "e", "poi", "dormi"}, 25, 3, false));
  }
  void TearDown() override { fs::remove_all(dir_); }

  PrepOptions Options(const std::string& out) const {
    PrepOptions options;
    options.out_dir = (dir_ / out).string();
    for (const char* name : {"en.txt", "de.txt", "it.txt"}) {
      options.files.push_back((dir_ / "corpus" / name).string());
    }
    options.vocab_size = 100;
    options.val_fraction = 0.2;
    options.seed = 7;
    options.shard_tokens = 600;  // several shards
    return options;
  }
  // Runs prep into `out` (once per name) and returns the folder.
  std::string Prepped(const std::string& out = "prep") {
    const std::string path = (dir_ / out).string();
    if (!fs::exists(path)) {
      auto index = Prepare(Options(out));
      EXPECT_TRUE(index.ok()) << index.status();
    }
    return path;
  }
  LoaderOptions Loader(int dp_rank, int dp_size, int64_t mbs) {
    LoaderOptions options;
    options.dir = Prepped();
    options.seq_len = 16;
    options.micro_batch_size = mbs;
    options.global_batch_size = 8;
    options.dp_rank = dp_rank;
    options.dp_size = dp_size;
    options.seed = 3;
    return options;
  }
  fs::path dir_;
};

TEST(CorpusTest, SplitsFortuneFilesAtPercentLinesAndOthersAtBlankLines) {
  EXPECT_EQ(SplitDocuments("a b\nc\n%\n\nd\n%\n%\ne\r\n"),
            (std::vector<std::string>{"a b\nc", "d", "e"}));
  EXPECT_EQ(SplitDocuments("one\ntwo\n\n  \nthree\n\n"),
            (std::vector<std::string>{"one\ntwo", "three"}));
  EXPECT_EQ(SanitizeUtf8("ok \xC3\xA9 \xFF \xE2\x82"),
            "ok \xC3\xA9 \xEF\xBF\xBD \xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST_F(DataTest, LabelsTheFortuneTreeByLanguage) {
  const fs::path root = dir_ / "fortunes";
  WriteBytes(root / "art", "x\n%\ny\n");
  WriteBytes(root / "art.dat", "index");
  WriteBytes(root / "brasil", "ola\n%\n");
  WriteBytes(root / "de/witze", "witz\n%\n");
  WriteBytes(root / "off/rude", "no\n%\n");
  fs::create_symlink(root / "de/witze", root / "witze");
  auto files = FortuneCorpusFiles(root.string());
  ASSERT_TRUE(files.ok()) << files.status();
  std::vector<std::pair<std::string, std::string>> got;
  for (const CorpusFile& f : *files)
    got.push_back({f.label, fs::path(f.path).lexically_relative(root).string()});
  EXPECT_EQ(got, (std::vector<std::pair<std::string, std::string>>{
                     {"de", "de/witze"}, {"en", "art"}, {"pt", "brasil"}}));
  auto missing = FortuneCorpusFiles((dir_ / "nowhere").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("bash scripts/setup.sh"), std::string::npos);
  EXPECT_NE(missing.status().message().find("nowhere"), std::string::npos);
}

TEST_F(DataTest, TokenizerRoundTripsAndIsDeterministic) {
  const std::vector<std::string> texts = {"the cat sat on the mat\nand the dog ran",
                                          "a  tab\there, the end", "the cat ran away"};
  auto model = TrainTokenizer(texts, {100, 1});
  ASSERT_TRUE(model.ok()) << model.status();
  auto again = TrainTokenizer(texts, {100, 1});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*model, *again);
  auto tokenizer = Tokenizer::FromSerialized(*model);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_LE(tokenizer->vocab_size(), 100);
  EXPECT_EQ(tokenizer->eos_id(), 2);
  for (const std::string& text : texts) {
    const std::vector<int32_t> ids = tokenizer->Encode(text);
    EXPECT_LT(ids.size(), text.size());
    EXPECT_EQ(tokenizer->Decode(ids), text);
  }
  EXPECT_EQ(tokenizer->Decode(tokenizer->Encode("then\nthe mat sat")), "then\nthe mat sat");
  auto small = TrainTokenizer(texts, {10, 1});
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("distinct characters"), std::string::npos)
      << small.status();
  EXPECT_FALSE(Tokenizer::FromSerialized("not a model").ok());
}

// SentencePiece's BPE trainer crashed (SIGSEGV) on long runs without a space, e.g. a line of
// hex in a kernel source file: nine 4000-character words in one text were enough. The
// trainer now sees such runs cut every 256 bytes; the tokenizer still encodes the text whole.
TEST_F(DataTest, TokenizerTrainsOnLongRunsWithoutSpaces) {
  std::string words, run, accents;
  for (int i = 0; i < 9; ++i) words += std::string(4000, "ab"[i % 2]) + "ba ";
  for (int i = 0; i < 16400; ++i) run += "ab";
  for (int i = 0; i < 20000; ++i) accents += "\xc3\xa9";  // e acute: no cut inside a character
  const std::vector<std::string> texts = {"the cat sat on the mat", "q " + words + "y", "q " + run + " y",
                                          accents + " ok"};
  auto model = TrainTokenizer(texts, {200, 1});
  ASSERT_TRUE(model.ok()) << model.status();
  auto tokenizer = Tokenizer::FromSerialized(*model);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  for (const std::string& text : texts) EXPECT_EQ(tokenizer->Decode(tokenizer->Encode(text)), text);
}

TEST_F(DataTest, ShardsRoundTripAndRejectDamage) {
  const std::vector<int32_t> tokens = {0, 1, 2, 65535, 7};
  for (uint32_t width : {2u, 4u}) {
    const fs::path path = dir_ / (std::to_string(width) + "-wide.bin");
    fs::create_directories(dir_);
    ASSERT_TRUE(WriteShard(path.string(), tokens, width).ok());
    EXPECT_EQ(fs::file_size(path), kShardHeaderBytes + tokens.size() * width);
    EXPECT_EQ(ReadBytes(path).substr(0, 8), "SYTOKENS");
    ShardHeader header;
    auto read = ReadShard(path.string(), &header);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(*read, tokens);
    EXPECT_EQ(header.token_bytes, width);
  }
  const std::string bytes = ReadBytes(dir_ / "2-wide.bin");
  const auto expect_error = [&](const std::string& damaged, const std::string& what) {
    WriteBytes(dir_ / "bad.bin", damaged);
    auto read = ReadShard((dir_ / "bad.bin").string());
    ASSERT_FALSE(read.ok()) << what;
    EXPECT_NE(read.status().message().find("bad.bin"), std::string::npos) << read.status();
    EXPECT_NE(read.status().message().find(what), std::string::npos) << read.status();
  };
  expect_error(bytes.substr(0, bytes.size() - 1), "truncated");
  expect_error(bytes.substr(0, 20), "shorter than the 32-byte header");
  std::string flipped = bytes;
  flipped[0] = 'X';
  expect_error(flipped, "bad magic");
  flipped = bytes;
  flipped[kShardHeaderBytes] ^= 1;
  expect_error(flipped, "checksum");
}

TEST_F(DataTest, PrepWritesAConsistentIndex) {
  auto written = Prepare(Options("prep"));
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_TRUE(written->documents.empty());  // Prepare does not keep the document list
  auto tokenizer = Tokenizer::Load((dir_ / "prep" / kTokenizerFile).string());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto index = ReadIndex((dir_ / "prep").string());
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->labels, (std::vector<std::string>{"de", "en", "it"}));
  EXPECT_EQ(index->documents.size(), 40u + 30u + 25u);
  EXPECT_GT(index->shards.size(), 2u);
  Index head = *index;
  head.documents.clear();
  EXPECT_EQ(IndexToJson(head), IndexToJson(*written));

  // Every document decodes back to its text, ends with </s>, and the documents of each
  // shard add up to the shard's size; split and label are as documented.
  std::vector<std::string> texts;
  for (const std::string& path : Options("prep").files) {
    for (std::string& text : SplitDocuments(ReadBytes(path))) texts.push_back(text);
  }
  std::vector<std::vector<int32_t>> shards;
  for (const ShardEntry& shard : index->shards) {
    auto tokens = ReadShard((dir_ / "prep" / shard.name).string());
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    EXPECT_EQ(tokens->size(), shard.tokens);
    shards.push_back(*tokens);
  }
  std::vector<uint64_t> sums(shards.size(), 0);
  int val = 0;
  for (size_t i = 0; i < index->documents.size(); ++i) {
    const DocumentEntry& doc = index->documents[i];
    const std::vector<int32_t>& shard = shards[doc.shard];
    std::vector<int32_t> ids(shard.begin() + doc.offset, shard.begin() + doc.offset + doc.tokens);
    EXPECT_EQ(ids.back(), tokenizer->eos_id());
    ids.pop_back();
    EXPECT_EQ(tokenizer->Decode(ids), texts[i]) << "document " << i;
    EXPECT_EQ(doc.split, IsValidation(7, i, 0.2) ? Split::kVal : Split::kTrain);
    EXPECT_EQ(index->labels[doc.label], fs::path(doc.source).stem().string());
    sums[doc.shard] += doc.tokens;
    val += doc.split == Split::kVal;
  }
  for (size_t s = 0; s < shards.size(); ++s) EXPECT_EQ(sums[s], shards[s].size());
  EXPECT_GT(val, 5);
  EXPECT_LT(val, 35);
  EXPECT_NE(SummaryTable(*index).find("all"), std::string::npos);
}

TEST_F(DataTest, PrepIsBitwiseReproducibleAndSeeded) {
  const std::string a = Prepped("a"), b = Prepped("b");
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(a)) names.insert(entry.path().filename());
  EXPECT_TRUE(names.count(kIndexFile) && names.count(kTokenizerFile) &&
              names.count("val-00000.bin"));
  for (const std::string& name : names) {
    EXPECT_EQ(ReadBytes(fs::path(a) / name), ReadBytes(fs::path(b) / name)) << name;
  }
  size_t count = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(b)) ++count;
  EXPECT_EQ(count, names.size());
  PrepOptions other = Options("c");
  other.seed = 8;
  ASSERT_TRUE(Prepare(other).ok());
  EXPECT_NE(ReadBytes(fs::path(a) / kIndexFile), ReadBytes(dir_ / "c" / kIndexFile));
  other = Options("d");
  other.max_docs_per_label = 10;
  auto capped = Prepare(other);
  ASSERT_TRUE(capped.ok()) << capped.status();
  for (const LabelTotals& t : capped->totals) EXPECT_EQ(t.documents[0] + t.documents[1], 10u);
}

TEST_F(DataTest, PrepRefusesToMixOutputsWithoutForce) {
  const std::string out = Prepped("out");
  const std::string before = ReadBytes(fs::path(out) / kIndexFile);
  PrepOptions options = Options("out");
  options.seed = 99;
  auto refused = Prepare(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--force"), std::string::npos) << refused.status();
  EXPECT_EQ(ReadBytes(fs::path(out) / kIndexFile), before);

  options.force = true;
  ASSERT_TRUE(Prepare(options).ok());
  EXPECT_NE(ReadBytes(fs::path(out) / kIndexFile), before);
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
    EXPECT_EQ(entry.path().filename().string().find(".old-"), std::string::npos) << entry.path();
  }
  // A folder with files prep did not write is never replaced, --force or not.
  WriteBytes(fs::path(out) / "notes.txt", "mine");
  auto foreign = Prepare(options);
  ASSERT_FALSE(foreign.ok());
  EXPECT_NE(foreign.status().message().find("notes.txt"), std::string::npos) << foreign.status();
  WriteBytes(dir_ / "other/notes.txt", "mine");
  options.out_dir = (dir_ / "other").string();
  auto unrelated = Prepare(options);
  ASSERT_FALSE(unrelated.ok());
  EXPECT_NE(unrelated.status().message().find("holds no prep output"), std::string::npos);
  EXPECT_EQ(ReadBytes(dir_ / "other/notes.txt"), "mine");
}

// A hand-made prep folder of u32 tokens (ids above 65535): the loader reads them exactly.
TEST_F(DataTest, LoaderReadsU32Tokens) {
  const fs::path out = dir_ / "wide";
  fs::create_directories(out);
  Index index;
  index.vocab_size = 100000;
  index.eos_id = 2;
  index.token_bytes = TokenBytesForVocab(index.vocab_size);
  ASSERT_EQ(index.token_bytes, 4u);
  index.labels = {"x"};
  std::vector<int32_t> train, val;
  for (int i = 0; i < 300; ++i) train.push_back((i * 7919 + 65000) % 100000);
  for (int i = 0; i < 60; ++i) val.push_back(99999 - i);
  ASSERT_TRUE(WriteShard((out / "train-00000.bin").string(), train, 4).ok());
  ASSERT_TRUE(WriteShard((out / "val-00000.bin").string(), val, 4).ok());
  index.shards = {{"train-00000.bin", Split::kTrain, 300}, {"val-00000.bin", Split::kVal, 60}};
  index.documents = {{Split::kTrain, 0, 0, 100, 0, "a"},
                     {Split::kTrain, 0, 100, 200, 0, "a"},
                     {Split::kVal, 1, 0, 60, 0, "a"}};
  ComputeTotals(&index);
  WriteBytes(out / kIndexFile, IndexToJson(index));
  LoaderOptions options;
  options.dir = out.string();
  options.seq_len = 16;
  options.global_batch_size = 2;
  options.micro_batch_size = 2;
  auto loader = DataLoader::Open(options);
  ASSERT_TRUE(loader.ok()) << loader.status();
  int above = 0;
  for (int64_t step = 0; step < 10; ++step) {
    const Batch batch = loader->GetBatch(step, 0);
    const auto inputs = batch.inputs.ToVector<int32_t>();
    for (int r = 0; r < 2; ++r) {
      for (int t = 0; t < 16; ++t) {
        EXPECT_EQ(inputs[r * 16 + t], train[batch.offsets[r] + t]);
        above += inputs[r * 16 + t] > 65535;
      }
    }
  }
  EXPECT_GT(above, 10);
  auto batches = loader->ValidationBatches(0);
  ASSERT_TRUE(batches.ok()) << batches.status();
  EXPECT_EQ(batches->at(0).inputs.ToVector<int32_t>()[0], 99999);
}

TEST(PermuteIndexTest, IsABijection) {
  for (uint64_t n : {1, 2, 3, 7, 64, 100, 1000}) {
    std::set<uint64_t> seen;
    for (uint64_t x = 0; x < n; ++x) seen.insert(PermuteIndex(x, n, 5, 9));
    EXPECT_EQ(seen.size(), n);
    EXPECT_LT(*seen.rbegin(), n);
  }
}

// Rows of a batch keyed by global sequence: (offset, inputs).
using Rows = std::map<int64_t, std::pair<int64_t, std::vector<int32_t>>>;
void AddRows(const Batch& batch, Rows* rows) {
  const std::vector<int32_t> inputs = batch.inputs.ToVector<int32_t>();
  const int64_t len = batch.inputs.dim(1);
  for (size_t r = 0; r < batch.sequences.size(); ++r) {
    std::vector<int32_t> row(inputs.begin() + r * len, inputs.begin() + (r + 1) * len);
    EXPECT_TRUE(rows->emplace(batch.sequences[r], std::make_pair(batch.offsets[r], row)).second);
  }
}

TEST_F(DataTest, LoaderBatchesAreDeterministicAndShifted) {
  auto loader = DataLoader::Open(Loader(0, 1, 2));
  ASSERT_TRUE(loader.ok()) << loader.status();
  EXPECT_EQ(loader->micro_batches_per_step(), 4);
  const Batch a = loader->GetBatch(5, 1), b = loader->GetBatch(5, 1), c = loader->GetBatch(6, 1);
  EXPECT_EQ(a.inputs.shape(), (Shape{2, 16}));
  EXPECT_EQ(a.inputs.dtype(), DType::kI32);
  EXPECT_EQ(a.inputs.ToVector<int32_t>(), b.inputs.ToVector<int32_t>());
  EXPECT_EQ(a.labels.ToVector<int32_t>(), b.labels.ToVector<int32_t>());
  EXPECT_EQ(a.sequences, (std::vector<int64_t>{42, 43}));
  EXPECT_NE(a.offsets, c.offsets);

  // Targets are the inputs shifted by one; labels follow the documents of the index.
  const Index& index = loader->index();
  std::vector<int32_t> stream_labels;
  for (const DocumentEntry& doc : index.documents) {
    if (doc.split == Split::kTrain)
      stream_labels.insert(stream_labels.end(), doc.tokens, doc.label);
  }
  for (int64_t step = 0; step < 20; ++step) {
    const Batch batch = loader->GetBatch(step, step % 4);
    const auto in = batch.inputs.ToVector<int32_t>(), out = batch.targets.ToVector<int32_t>();
    const auto labels = batch.labels.ToVector<int32_t>();
    for (int64_t r = 0; r < 2; ++r) {
      EXPECT_EQ(batch.offsets[r] % 16, 0);
      for (int64_t t = 0; t < 16; ++t) {
        if (t + 1 < 16) {
          EXPECT_EQ(out[r * 16 + t], in[r * 16 + t + 1]);
        }
        EXPECT_EQ(labels[r * 16 + t], stream_labels[batch.offsets[r] + t]);
      }
    }
  }
  // One epoch visits every window once.
  std::set<int64_t> offsets;
  const int64_t windows = loader->train_windows();
  for (int64_t g = 0; g < windows; ++g) {
    offsets.insert(loader->GetBatch(g / 8, (g % 8) / 2).offsets[g % 2]);
  }
  EXPECT_EQ(static_cast<int64_t>(offsets.size()), windows);
}

TEST_F(DataTest, UnionOfDpRanksIsTheDp1Batch) {
  for (int64_t mbs : {1, 2}) {
    for (int64_t step : {0, 3, 1000}) {
      Rows reference;
      auto one = DataLoader::Open(Loader(0, 1, mbs));
      ASSERT_TRUE(one.ok()) << one.status();
      for (int64_t m = 0; m < one->micro_batches_per_step(); ++m)
        AddRows(one->GetBatch(step, m), &reference);
      EXPECT_EQ(reference.size(), 8u);
      for (int dp : {2, 4}) {
        if (8 % (dp * mbs) != 0) continue;
        Rows rows;
        std::set<int64_t> all_offsets;
        for (int rank = 0; rank < dp; ++rank) {
          auto loader = DataLoader::Open(Loader(rank, dp, mbs));
          ASSERT_TRUE(loader.ok()) << loader.status();
          for (int64_t m = 0; m < loader->micro_batches_per_step(); ++m) {
            AddRows(loader->GetBatch(step, m), &rows);
          }
        }
        EXPECT_EQ(rows, reference) << "dp=" << dp << " mbs=" << mbs << " step=" << step;
      }
    }
  }
  // Validation: the ranks' batches together are the dp=1 batches.
  Rows reference, rows;
  auto one = DataLoader::Open(Loader(0, 1, 2));
  auto val = one->ValidationBatches(2);
  ASSERT_TRUE(val.ok()) << val.status();
  ASSERT_EQ(val->size(), 2u);
  for (const Batch& b : *val) AddRows(b, &reference);
  for (int rank = 0; rank < 2; ++rank) {
    auto batches = DataLoader::Open(Loader(rank, 2, 2))->ValidationBatches(1);
    ASSERT_TRUE(batches.ok()) << batches.status();
    for (const Batch& b : *batches) AddRows(b, &rows);
  }
  EXPECT_EQ(rows, reference);
}

TEST_F(DataTest, LoaderErrorsNameThePathAndTheProblem) {
  LoaderOptions options = Loader(0, 1, 1);
  const fs::path dir = options.dir;
  options.seq_len = 1 << 20;
  auto too_long = DataLoader::Open(options);
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("seq_len + 1 = 1048577"), std::string::npos)
      << too_long.status();
  options = Loader(0, 3, 1);
  EXPECT_EQ(DataLoader::Open(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = Loader(0, 1, 1);
  options.dir = (dir_ / "missing").string();
  EXPECT_NE(DataLoader::Open(options).status().message().find("missing/index.json"),
            std::string::npos);

  // A copy of the output, damaged in turn: a truncated shard, then a bad index.
  fs::copy(dir, dir_ / "damaged");
  options.dir = (dir_ / "damaged").string();
  const std::string shard = ReadBytes(dir / "train-00001.bin");
  WriteBytes(dir_ / "damaged/train-00001.bin", shard.substr(0, shard.size() - 3));
  auto truncated = DataLoader::Open(options);
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find("damaged/train-00001.bin: truncated"),
            std::string::npos)
      << truncated.status();
  fs::copy_file(dir / "train-00001.bin", dir_ / "damaged/train-00001.bin",
                fs::copy_options::overwrite_existing);
  ASSERT_TRUE(DataLoader::Open(options).ok());
  const std::string json = ReadBytes(dir / kIndexFile);
  WriteBytes(dir_ / "damaged" / kIndexFile, json.substr(0, json.size() / 2));
  // Cut in half: the parser says where it stopped and why.
  auto cut = DataLoader::Open(options);
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(cut.status().message().find("index.json: not JSON (line "), std::string::npos)
      << cut.status();
  std::string edited = json;
  edited.replace(edited.find("\"tokens\":"), 9, "\"tokens\":1");
  WriteBytes(dir_ / "damaged" / kIndexFile, edited);
  auto bad_count = DataLoader::Open(options);
  ASSERT_FALSE(bad_count.ok());
  EXPECT_NE(bad_count.status().message().find("index.json: "), std::string::npos)
      << bad_count.status();
}

}  // namespace
}  // namespace switchyard::data
