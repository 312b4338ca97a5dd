// `switchyard prep`'s inputs and streaming: JSONL and gzip/zstd inputs give the tokens of
// the same documents in plain text; bad JSONL lines are reported with file:line (an error
// under --strict); folders, globs and --label-key; thread counts 1, 2 and 4 give identical
// bytes; the tokenizer's sample is the documented prefix in draw order.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "engine/core/philox.h"
#include "engine/data/document_reader.h"
#include "engine/data/index.h"
#include "engine/data/prep.h"
#include "engine/data/tokenizer_sample.h"
#include "tests/testing/files.h"

namespace switchyard::data {
namespace {

namespace fs = std::filesystem;
using test_util::ReadBytes;
using test_util::WriteBytes;

// Documents of random words; fortune format ("%" lines) or paragraphs.
std::string MakeText(const std::vector<std::string>& words, int docs, int seed, bool fortune) {
  std::string text;
  uint32_t state = 777u + seed;
  const auto next = [&] { return (state = state * 1664525u + 1013904223u) >> 8; };
  for (int d = 0; d < docs; ++d) {
    const int n = 3 + next() % 15;
    for (int w = 0; w < n; ++w) {
      text += words[next() % words.size()];
      text += (w + 1 == n) ? "\n" : (next() % 6 == 0 ? "\n" : " ");
    }
    text += fortune ? "%\n" : "\n";
  }
  return text;
}

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The shards and the tokenizer of a prep output, and its index without the sources.
std::map<std::string, std::string> Outputs(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name != kIndexFile) files[name] = ReadBytes(entry.path());
  }
  auto index = ReadIndex(dir.string());
  EXPECT_TRUE(index.ok()) << index.status();
  if (index.ok()) {
    for (DocumentEntry& doc : index->documents) doc.source = "";
    files[kIndexFile] = IndexToJson(*index);
  }
  return files;
}

class PrepInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sy_prep_input_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    en_ = MakeText({"the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far"}, 60, 1, true);
    de_ = MakeText({"der", "hund", "lief", "weit", "weg", "und", "katze", "\xC3\xBC" "ber"}, 50,
                   2, false);
    WriteBytes(dir_ / "plain/en.txt", en_);
    WriteBytes(dir_ / "plain/de.txt", de_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  PrepOptions Options(const std::string& out, std::vector<std::string> files) const {
    PrepOptions options;
    options.out_dir = (dir_ / out).string();
    options.files = std::move(files);
    options.vocab_size = 120;
    options.val_fraction = 0.2;
    options.seed = 5;
    options.shard_tokens = 500;
    return options;
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  // The documents of `text` as JSONL lines, with other fields around the text.
  static std::string Jsonl(const std::string& text) {
    std::string out;
    int n = 0;
    for (const std::string& doc : SplitDocuments(text)) {
      out += "{\"id\": " + std::to_string(n++) + ", \"text\": " + JsonString(doc) +
             ", \"meta\": {\"text\": 1}}\n";
    }
    return out;
  }
  void Run(const std::string& command) { ASSERT_EQ(std::system(command.c_str()), 0) << command; }

  fs::path dir_;
  std::string en_, de_;
};

TEST_F(PrepInputTest, JsonlAndCompressedInputsGiveTheTokensOfPlainText) {
  ASSERT_TRUE(Prepare(Options("out-plain", {Path("plain/en.txt"), Path("plain/de.txt")})).ok());
  const auto want = Outputs(dir_ / "out-plain");
  ASSERT_GE(want.size(), 4u);

  // JSONL with bad lines among the documents: skipped and reported with file:line.
  std::string en_jsonl = Jsonl(en_);
  en_jsonl.insert(en_jsonl.find('\n') + 1, "{\"text\": \"broken\"\n\n{\"body\": \"x\"}\n[1]\n");
  WriteBytes(dir_ / "jsonl/en.jsonl", en_jsonl);
  WriteBytes(dir_ / "jsonl/de.jsonl", Jsonl(de_));
  std::vector<std::string> warnings;
  PrepCallbacks callbacks;
  callbacks.warning = [&](const std::string& line) { warnings.push_back(line); };
  auto jsonl = Prepare(Options("out-jsonl", {Path("jsonl/en.jsonl"), Path("jsonl/de.jsonl")}),
                       callbacks);
  ASSERT_TRUE(jsonl.ok()) << jsonl.status();
  EXPECT_EQ(Outputs(dir_ / "out-jsonl"), want);
  ASSERT_EQ(warnings.size(), 4u);
  EXPECT_EQ(warnings[0], Path("jsonl/en.jsonl") + ":2: not valid JSON (line skipped)");
  EXPECT_EQ(warnings[1], Path("jsonl/en.jsonl") + ":4: no \"text\" key (line skipped)");
  EXPECT_EQ(warnings[2], Path("jsonl/en.jsonl") + ":5: not a JSON object (line skipped)");
  EXPECT_EQ(warnings[3], "skipped 3 bad JSONL lines (--strict makes them an error)");

  // --strict: the first bad line is the error.
  PrepOptions strict = Options("out-strict", {Path("jsonl/en.jsonl")});
  strict.read.strict = true;
  auto refused = Prepare(strict);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(),
            Path("jsonl/en.jsonl") + ":2: not valid JSON (without --strict, bad lines are skipped)");
  EXPECT_FALSE(fs::exists(dir_ / "out-strict"));

  // gzip and zstd, of text and of JSONL.
  fs::create_directories(dir_ / "gz");
  Run("gzip -k -c " + Path("plain/en.txt") + " > " + Path("gz/en.txt.gz"));
  Run("zstd -q -c " + Path("plain/de.txt") + " > " + Path("gz/de.txt.zst"));
  Run("zstd -q -c " + Path("jsonl/en.jsonl") + " > " + Path("gz/en.jsonl.zst"));
  // Two gzip members, one after the other, are one file.
  const std::string de_jsonl = Jsonl(de_);
  const size_t half = de_jsonl.find('\n', de_jsonl.size() / 2) + 1;
  WriteBytes(dir_ / "parts/a", de_jsonl.substr(0, half));
  WriteBytes(dir_ / "parts/b", de_jsonl.substr(half));
  Run("gzip -c " + Path("parts/a") + " > " + Path("gz/de.jsonl.gz") + " && gzip -c " +
      Path("parts/b") + " >> " + Path("gz/de.jsonl.gz"));
  auto text_gz = Prepare(Options("out-gz", {Path("gz/en.txt.gz"), Path("gz/de.txt.zst")}));
  ASSERT_TRUE(text_gz.ok()) << text_gz.status();
  EXPECT_EQ(Outputs(dir_ / "out-gz"), want);
  auto jsonl_gz = Prepare(Options("out-jgz", {Path("gz/en.jsonl.zst"), Path("gz/de.jsonl.gz")}));
  ASSERT_TRUE(jsonl_gz.ok()) << jsonl_gz.status();
  EXPECT_EQ(Outputs(dir_ / "out-jgz"), want);
}

TEST_F(PrepInputTest, FoldersGlobsAndLabelKeys) {
  // A folder is every file below it, sorted; a quoted glob is expanded by prep.
  WriteBytes(dir_ / "tree/b/en.txt", en_);
  WriteBytes(dir_ / "tree/a/de.txt", de_);
  WriteBytes(dir_ / "tree/.hidden", "not read\n");
  auto files = UserCorpusFiles({Path("tree"), Path("plain/*.txt")}, "");
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 4u);
  EXPECT_EQ((*files)[0].path, Path("tree/a/de.txt"));
  EXPECT_EQ((*files)[1].path, Path("tree/b/en.txt"));
  EXPECT_EQ((*files)[2].path, Path("plain/de.txt"));
  EXPECT_EQ((*files)[3].label, "en");
  EXPECT_EQ(FileStem("x/de.jsonl.gz"), "de");
  EXPECT_EQ(UserCorpusFiles({Path("plain/*.md")}, "").status().message(),
            Path("plain/*.md") + ": the pattern matches no file");
  fs::create_directories(dir_ / "empty");
  EXPECT_EQ(UserCorpusFiles({Path("empty")}, "").status().message(),
            Path("empty") + ": the folder holds no file");

  // --label-key: each line's label.
  WriteBytes(dir_ / "mixed.jsonl",
             "{\"text\": \"bonjour le chat\", \"lang\": \"fr\"}\n"
             "{\"text\": \"hallo de kat\", \"lang\": \"nl\"}\n"
             "{\"text\": \"le chien\", \"lang\": \"fr\"}\n"
             "{\"text\": \"no label\"}\n"
             "{\"text\": \"bad label\", \"lang\": \"f r\"}\n");
  PrepOptions options = Options("out-labels", {Path("mixed.jsonl")});
  options.val_fraction = 0;
  options.vocab_size = 40;
  options.read.label_key = "lang";
  std::vector<std::string> warnings;
  PrepCallbacks callbacks;
  callbacks.warning = [&](const std::string& line) { warnings.push_back(line); };
  auto index = Prepare(options, callbacks);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->labels, (std::vector<std::string>{"fr", "nl"}));
  EXPECT_EQ(index->totals[0].documents[0], 2u);
  EXPECT_EQ(index->totals[1].documents[0], 1u);
  ASSERT_EQ(warnings.size(), 3u);
  EXPECT_EQ(warnings[0], Path("mixed.jsonl") + ":4: no \"lang\" key (line skipped)");
  EXPECT_NE(warnings[1].find(":5: \"lang\" is \"f r\", not a label"), std::string::npos);
}

TEST_F(PrepInputTest, ThreadCountsGiveIdenticalBytes) {
  // Enough short documents for several encoding batches (8192 documents or 1 MiB each).
  std::string big;
  for (int part = 0; part < 6; ++part) {
    big += MakeText({"one", "two", "three", "four", "five", "six", "seven"}, 4000, part, true);
  }
  WriteBytes(dir_ / "big/en.txt", big);
  std::map<std::string, std::string> first;
  for (int threads : {1, 2, 4}) {
    PrepOptions options = Options("out-t" + std::to_string(threads), {Path("big/en.txt")});
    options.threads = threads;
    options.shard_tokens = 50000;
    options.tokenizer_sample_bytes = 20000;
    auto index = Prepare(options);
    ASSERT_TRUE(index.ok()) << index.status();
    EXPECT_EQ(index->totals[0].documents[0] + index->totals[0].documents[1], 24000u);
    std::map<std::string, std::string> files;
    for (const auto& entry : fs::directory_iterator(options.out_dir)) {
      files[entry.path().filename().string()] = ReadBytes(entry.path());
    }
    EXPECT_GT(files.size(), 4u);
    if (threads == 1) {
      first = files;
    } else {
      EXPECT_TRUE(files == first) << threads << " threads differ from 1";
    }
  }
}

TEST(TokenizerSampleTest, KeepsThePrefixInDrawOrderThatFitsTheBudget) {
  const uint64_t seed = 11, budget = 1000;
  std::vector<std::string> texts;
  for (int i = 0; i < 300; ++i) texts.push_back(std::string(1 + (i * 37) % 29, 'a' + i % 26));
  TokenizerSample sample(budget, seed);
  for (size_t i = 0; i < texts.size(); ++i) sample.Offer(i, texts[i]);
  EXPECT_LE(sample.kept_bytes(), budget);
  const uint64_t kept_bytes = sample.kept_bytes();
  const std::vector<std::string> kept = sample.TakeTexts();

  // Reference: sort by (draw, index), take while the sum stays within the budget.
  std::vector<std::pair<uint32_t, size_t>> order;
  for (size_t i = 0; i < texts.size(); ++i) {
    order.push_back({RandomBitsAt({seed, StreamId("data.prep.tokenizer_sample")}, i), i});
  }
  std::sort(order.begin(), order.end());
  std::vector<size_t> chosen;
  uint64_t sum = 0;
  for (const auto& [draw, i] : order) {
    if (sum + texts[i].size() > budget) break;
    sum += texts[i].size();
    chosen.push_back(i);
  }
  std::sort(chosen.begin(), chosen.end());
  ASSERT_EQ(kept.size(), chosen.size());
  EXPECT_EQ(kept_bytes, sum);
  for (size_t k = 0; k < chosen.size(); ++k) EXPECT_EQ(kept[k], texts[chosen[k]]);
  EXPECT_GT(sum, budget - 29);  // the next document in draw order would not have fit

  // A budget above the corpus keeps everything, in corpus order.
  TokenizerSample all(1 << 20, seed);
  for (size_t i = 0; i < texts.size(); ++i) all.Offer(i, texts[i]);
  EXPECT_EQ(all.TakeTexts(), texts);
}

}  // namespace
}  // namespace switchyard::data
