// Bad inputs give one clear error naming the file, and nothing half-written:
//   - prep: truncated and corrupt gzip/zstd files, binary files, a folder read as a file,
//     an empty corpus; a failed run leaves no output folder;
//   - the loader: a table of damaged shards and index.json files, each with its message,
//     and a seeded run of random byte flips and truncations that must end in an error
//     naming the file or a loader that still reads only valid tokens (never a crash);
//     without data.verify, a token id outside the vocabulary is a Status naming the
//     shard, the token's index and the id.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>

#include "engine/data/input_file.h"
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

class DataErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sy_data_errors_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    std::string text;
    for (int i = 0; i < 120; ++i) {
      text += "document " + std::to_string(i) + " says hello to the " +
              std::string(i % 3 == 0 ? "cat" : "dog") + "\nand then stops\n\n";
    }
    WriteBytes(dir_ / "good/en.txt", text);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  void Run(const std::string& command) { ASSERT_EQ(std::system(command.c_str()), 0) << command; }
  // Prep of `file` into "out"; returns the error message ("" on success) and checks that
  // a failed run left no output folder and no staging folder behind.
  std::string PrepError(const std::string& file) {
    PrepOptions options;
    options.out_dir = Path("out");
    options.files = {file};
    options.vocab_size = 60;
    options.val_fraction = 0.1;
    auto index = Prepare(options);
    if (index.ok()) return "";
    for (const auto& entry : fs::directory_iterator(dir_)) {
      EXPECT_NE(entry.path().filename().string().rfind("out", 0), 0u) << entry.path();
    }
    return std::string(index.status().message());
  }
  // A small prep output, with several shards, to damage.
  std::string Prepped() {
    const std::string out = Path("prep");
    if (!fs::exists(out)) {
      PrepOptions options;
      options.out_dir = out;
      options.files = {Path("good/en.txt")};
      options.vocab_size = 60;
      options.val_fraction = 0.2;
      options.shard_tokens = 400;
      auto index = Prepare(options);
      EXPECT_TRUE(index.ok()) << index.status();
    }
    return out;
  }
  LoaderOptions Loader(const std::string& dir) const {
    LoaderOptions options;
    options.dir = dir;
    options.seq_len = 8;
    options.micro_batch_size = 2;
    options.global_batch_size = 4;
    return options;
  }

  fs::path dir_;
};

TEST_F(DataErrorsTest, PrepNamesBadInputFiles) {
  ASSERT_EQ(PrepError(Path("good/en.txt")), "");
  fs::remove_all(Path("out"));
  Run("gzip -c " + Path("good/en.txt") + " > " + Path("en.txt.gz"));
  Run("zstd -q -c " + Path("good/en.txt") + " > " + Path("en.txt.zst"));
  const std::string gz = ReadBytes(Path("en.txt.gz")), zst = ReadBytes(Path("en.txt.zst"));

  WriteBytes(Path("cut.txt.gz"), gz.substr(0, gz.size() - 12));
  EXPECT_EQ(PrepError(Path("cut.txt.gz")).rfind(Path("cut.txt.gz") + ": truncated gzip data (the "
                                                "file ends inside a compressed stream, after ", 0),
            0u);
  std::string bad = gz;
  bad[bad.size() - 6] ^= 0x55;  // the CRC-32 of the trailer
  WriteBytes(Path("crc.txt.gz"), bad);
  // The trailer's CRC-32 is checked once read: by byte size - 4, with all the text decoded.
  EXPECT_EQ(PrepError(Path("crc.txt.gz")),
            Path("crc.txt.gz") + ": corrupt gzip data (incorrect data check, found by byte " +
                std::to_string(gz.size() - 4) + " of the file, after " +
                std::to_string(ReadBytes(Path("good/en.txt")).size()) + " uncompressed bytes)");
  bad = gz;
  bad[2] = 9;  // compression method: not deflate
  WriteBytes(Path("method.gz"), bad);
  EXPECT_EQ(PrepError(Path("method.gz")),
            Path("method.gz") + ": corrupt gzip data (unknown compression method, found by "
                                "byte 4 of the file, after 0 uncompressed bytes)");
  WriteBytes(Path("cut.txt.zst"), zst.substr(0, zst.size() / 2));
  EXPECT_EQ(PrepError(Path("cut.txt.zst")).rfind(Path("cut.txt.zst") + ": truncated zstd data", 0),
            0u);
  bad = zst;
  bad[bad.size() - 2] ^= 0x55;  // the content checksum
  WriteBytes(Path("sum.txt.zst"), bad);
  EXPECT_EQ(PrepError(Path("sum.txt.zst")).rfind(Path("sum.txt.zst") + ": corrupt zstd data (", 0),
            0u);

  // Binary data: a NUL byte, plain or compressed; UTF-16 text has them too.
  std::string binary = "ELF header";
  binary += '\0';
  binary += "more";
  WriteBytes(Path("a.out"), binary);
  EXPECT_EQ(PrepError(Path("a.out")),
            Path("a.out") + ": binary data (a NUL byte at uncompressed offset 10); prep reads "
                            "UTF-8 text or JSONL files, plain, gzip- or zstd-compressed");
  Run("gzip -c " + Path("a.out") + " > " + Path("a.out.gz"));
  EXPECT_NE(PrepError(Path("a.out.gz")).find("a.out.gz: binary data"), std::string::npos);

  // Nothing to read.
  WriteBytes(Path("empty.txt"), "");
  EXPECT_EQ(PrepError(Path("empty.txt")), "the corpus holds no documents (1 files read)");
  WriteBytes(Path("blank.txt"), "\n\n  \n");
  EXPECT_EQ(PrepError(Path("blank.txt")), "the corpus holds no documents (1 files read)");
  WriteBytes(Path("bad.jsonl"), "nope\n");
  EXPECT_EQ(PrepError(Path("bad.jsonl")),
            "the corpus holds no documents (1 files read, 1 bad lines)");

  // A folder opened as a file (prep expands folders; InputFile names the failure).
  fs::create_directories(Path("folder"));
  auto folder = InputFile::Open(Path("folder"));
  std::string message;
  if (!folder.ok()) {
    message = std::string(folder.status().message());
  } else {
    std::string line;
    auto read = (*folder)->ReadLine(&line);
    ASSERT_FALSE(read.ok());
    message = std::string(read.status().message());
  }
  EXPECT_EQ(message.rfind(Path("folder") + ": ", 0), 0u) << message;
}

// One damaged copy of a prep output and the error the loader must give.
struct Damage {
  const char* name;
  std::function<void(const fs::path& dir)> apply;
  std::string want;  // a substring of the message, after "<dir>/"
};

// Rewrites a field of index.json: the first occurrence of `from` becomes `to`.
void EditIndex(const fs::path& dir, const std::string& from, const std::string& to) {
  std::string json = ReadBytes(dir / kIndexFile);
  const size_t at = json.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  json.replace(at, from.size(), to);
  WriteBytes(dir / kIndexFile, json);
}

void EditShard(const fs::path& path, size_t offset, const std::string& bytes) {
  std::string shard = ReadBytes(path);
  shard.replace(offset, bytes.size(), bytes);
  WriteBytes(path, shard);
}

std::string U64(uint64_t v) {
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
  return out;
}

TEST_F(DataErrorsTest, LoaderNamesEachDamagedFile) {
  const fs::path good = Prepped();
  auto index = ReadIndex(good.string());
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_GE(index->shards.size(), 3u);
  const std::string shard0 = index->shards[0].name;
  const uint64_t tokens0 = index->shards[0].tokens;
  const std::vector<Damage> table = {
      {"truncated shard",
       [&](const fs::path& d) {
         const std::string s = ReadBytes(d / shard0);
         WriteBytes(d / shard0, s.substr(0, s.size() - 1));
       },
       shard0 + ": truncated or padded: its header promises " + std::to_string(tokens0) +
           " tokens of 2 bytes"},
      {"padded shard", [&](const fs::path& d) { WriteBytes(d / shard0, ReadBytes(d / shard0) + "xx"); },
       shard0 + ": truncated or padded"},
      {"shorter than a header", [&](const fs::path& d) { WriteBytes(d / shard0, "SYTOK"); },
       shard0 + ": not a token shard (5 bytes, shorter than the 32-byte header)"},
      {"bad magic", [&](const fs::path& d) { EditShard(d / shard0, 0, "XY"); },
       shard0 + ": not a token shard (bad magic"},
      {"version", [&](const fs::path& d) { EditShard(d / shard0, 8, std::string("\x02", 1)); },
       shard0 + ": token shard version 2 (this build reads 1)"},
      {"width 3", [&](const fs::path& d) { EditShard(d / shard0, 12, std::string("\x03", 1)); },
       shard0 + ": bad token width 3 bytes (expected 2 or 4)"},
      {"count near 2^64", [&](const fs::path& d) { EditShard(d / shard0, 16, U64(~uint64_t{0})); },
       shard0 + ": truncated or padded: its header promises 18446744073709551615 tokens of 2 "
                "bytes (more than 2^64 bytes in all)"},
      {"checksum", [&](const fs::path& d) { EditShard(d / shard0, 40, "\x7f"); },
       shard0 + ": checksum mismatch"},
      {"token above the vocabulary",
       [&](const fs::path& d) {
         std::vector<int32_t> tokens(tokens0, 5);
         tokens[3] = 9999;
         ASSERT_TRUE(WriteShard((d / shard0).string(), tokens, 2).ok());
       },
       shard0 + ": token 3 is 9999, not below the vocabulary size"},
      {"u32 shard, u16 index",
       [&](const fs::path& d) {
         ASSERT_TRUE(WriteShard((d / shard0).string(), std::vector<int32_t>(tokens0, 5), 4).ok());
       },
       shard0 + ": holds 32-bit tokens but the index says u16"},
      {"missing shard", [&](const fs::path& d) { fs::remove(d / shard0); },
       shard0 + ": cannot open the token shard"},
      {"not JSON", [&](const fs::path& d) { WriteBytes(d / kIndexFile, "{\"format\": "); },
       "index.json: not JSON (line 1, column 12: syntax error while parsing value - unexpected "
       "end of input; expected '[', '{', or a literal)"},
      {"format", [&](const fs::path& d) { EditIndex(d, "switchyard-tokens", "other"); },
       "index.json: format: expected \"switchyard-tokens\", got \"other\""},
      {"version 2", [&](const fs::path& d) { EditIndex(d, "\"version\": 1", "\"version\": 2"); },
       "index.json: version: 2 (this build reads 1)"},
      {"vocab 0", [&](const fs::path& d) { EditIndex(d, "\"vocab_size\": ", "\"vocab_size\": 0, \"x\": "); },
       "index.json: vocab_size: out of range: 0"},
      {"negative vocab", [&](const fs::path& d) { EditIndex(d, "\"vocab_size\": ", "\"vocab_size\": -1, \"x\": "); },
       "index.json: vocab_size: expected an unsigned integer, got -1"},
      {"eos", [&](const fs::path& d) { EditIndex(d, "\"eos_id\": 2", "\"eos_id\": 100000"); },
       "index.json: eos_id: 100000 is not below vocab_size"},
      {"dtype", [&](const fs::path& d) { EditIndex(d, "\"u16\"", "\"u8\""); },
       "index.json: dtype: expected \"u16\" or \"u32\", got \"u8\""},
      {"u16 too narrow",
       [&](const fs::path& d) { EditIndex(d, "\"vocab_size\": ", "\"vocab_size\": 70000, \"x\": "); },
       "index.json: dtype: u16 cannot hold vocab_size 70000"},
      {"shard name", [&](const fs::path& d) { EditIndex(d, "\"name\":\"" + shard0, "\"name\":\"../" + shard0); },
       "index.json: shards[0].name: expected a plain file name, got \"../" + shard0 + "\""},
      {"offset gap", [&](const fs::path& d) { EditIndex(d, "\"offset\":0,", "\"offset\":1,"); },
       "index.json: documents[0].offset: 1, expected 0 (documents are contiguous in their shard)"},
      {"tokens 0", [&](const fs::path& d) { EditIndex(d, "\"offset\":0,\"tokens\":", "\"offset\":0,\"tokens\":0,\"x\":"); },
       "index.json: documents[0].tokens: 0 (every document ends with </s>)"},
      {"tokens near 2^64",
       [&](const fs::path& d) {
         EditIndex(d, "\"offset\":0,\"tokens\":", "\"offset\":0,\"tokens\":18446744073709551615,\"x\":");
       },
       "index.json: documents[0].tokens: 18446744073709551615 runs past the end of shard"},
      {"shard out of range", [&](const fs::path& d) { EditIndex(d, "\"shard\":0,", "\"shard\":77,"); },
       "index.json: documents[0].shard: 77 is not below the"},
      {"documents not objects",
       [&](const fs::path& d) { EditIndex(d, "\"documents\": [", "\"documents\": [7, "); },
       "index.json: documents: expected objects"},
      {"split name", [&](const fs::path& d) { EditIndex(d, "{\"split\":\"train\",\"shard\"", "{\"split\":\"trian\",\"shard\""); },
       "index.json: documents[0].split: expected \"train\" or \"val\", got \"trian\""},
      {"source type", [&](const fs::path& d) { EditIndex(d, "\"source\":", "\"source\":1,\"x\":"); },
       "index.json: documents[0].source: expected a string, got 1"},
      {"label", [&](const fs::path& d) { EditIndex(d, "\"label\":\"en\"", "\"label\":\"xx\""); },
       "index.json: documents[0].label: \"xx\" is not in labels"},
      {"totals", [&](const fs::path& d) { EditIndex(d, "{\"train\":{\"documents\":", "{\"train\":{\"documents\":1"); },
       "index.json: totals.en.train: says 1"},
      {"shard tokens", [&](const fs::path& d) { EditIndex(d, "\"split\":\"train\",\"tokens\":", "\"split\":\"train\",\"tokens\":1"); },
       "index.json: "},
  };
  for (const Damage& damage : table) {
    SCOPED_TRACE(damage.name);
    const fs::path copy = dir_ / "damaged";
    fs::remove_all(copy);
    fs::copy(good, copy);
    damage.apply(copy);
    auto loader = DataLoader::Open(Loader(copy.string()));
    ASSERT_FALSE(loader.ok());
    const std::string message(loader.status().message());
    EXPECT_NE(message.find(copy.string() + "/" + damage.want), std::string::npos)
        << message << "\nwant: " << damage.want;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

// verify=false: Open reads headers only (a payload whose checksum no longer matches opens),
// and the batches read the mapped tokens, the changed one included.
TEST_F(DataErrorsTest, UnverifiedLoaderReadsOnlyHeadersAtOpen) {
  const fs::path good = Prepped();
  auto index = ReadIndex(good.string());
  ASSERT_TRUE(index.ok());
  const fs::path copy = dir_ / "unverified";
  fs::copy(good, copy);
  const std::string shard0 = index->shards[0].name;
  EditShard(copy / shard0, kShardHeaderBytes, std::string("\x02\x00", 2));  // token 0 := 2
  LoaderOptions options = Loader(copy.string());
  auto verified = DataLoader::Open(options);
  ASSERT_FALSE(verified.ok());
  EXPECT_NE(verified.status().message().find(shard0 + ": checksum mismatch"), std::string::npos);
  options.verify = false;
  auto lazy = DataLoader::Open(options);
  ASSERT_TRUE(lazy.ok()) << lazy.status();
  auto reference = DataLoader::Open(Loader(good.string()));
  ASSERT_TRUE(reference.ok());
  int differing = 0;
  for (int64_t step = 0; step < 200; ++step) {
    const Batch a = lazy->GetBatch(step, 0), b = reference->GetBatch(step, 0);
    const auto x = a.inputs.ToVector<int32_t>(), y = b.inputs.ToVector<int32_t>();
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i] != y[i]) {
        EXPECT_EQ(a.offsets[i / 8] + static_cast<int64_t>(i % 8), 0);  // only token 0 changed
        EXPECT_EQ(x[i], 2);
        ++differing;
      }
    }
  }
  EXPECT_GT(differing, 0);
}

TEST_F(DataErrorsTest, UnverifiedLoaderNamesABadTokenIdAsAStatus) {
  const fs::path good = Prepped();
  auto index = ReadIndex(good.string());
  ASSERT_TRUE(index.ok());
  const fs::path copy = dir_ / "bad_token";
  fs::copy(good, copy);
  // Token 5 of the first training shard and of the first validation shard := 65535 (the
  // vocabulary has 60 ids), as a writer bug would leave them.
  std::string train_shard, val_shard;
  for (const ShardEntry& shard : index->shards) {
    std::string& name = shard.split == Split::kTrain ? train_shard : val_shard;
    if (name.empty()) name = shard.name;
  }
  ASSERT_FALSE(train_shard.empty() || val_shard.empty());
  for (const std::string& name : {train_shard, val_shard}) {
    EditShard(copy / name, kShardHeaderBytes + 5 * 2, std::string("\xff\xff", 2));
  }
  LoaderOptions options = Loader(copy.string());
  options.verify = false;
  auto loader = DataLoader::Open(options);
  ASSERT_TRUE(loader.ok()) << loader.status();  // only headers are read at Open
  const std::string want_train = (copy / train_shard).string() +
                                 ": token 5 is 65535, not below the vocabulary size 60";
  // Some step reads the window holding it: CheckStep and ReadBatch say so; the steps
  // before it are fine.
  int64_t bad_step = -1;
  for (int64_t step = 0; step < 500 && bad_step < 0; ++step) {
    if (!loader->CheckStep(step).ok()) bad_step = step;
  }
  ASSERT_GE(bad_step, 0) << "no step read the damaged token";
  const Status s = loader->CheckStep(bad_step);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(s.message().rfind(want_train, 0), 0u) << s;
  EXPECT_NE(s.message().find("data.verify"), std::string::npos) << s;
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s;
  bool batch_failed = false;
  for (int64_t micro = 0; micro < loader->micro_batches_per_step(); ++micro) {
    auto batch = loader->ReadBatch(bad_step, micro);
    if (!batch.ok()) {
      batch_failed = true;
      EXPECT_EQ(batch.status(), s);
    }
  }
  EXPECT_TRUE(batch_failed);
  // The whole validation split holds the other bad token.
  auto val = loader->ValidationBatches(0);
  ASSERT_FALSE(val.ok());
  EXPECT_EQ(val.status().code(), absl::StatusCode::kDataLoss) << val.status();
  EXPECT_EQ(val.status().message().rfind((copy / val_shard).string() +
                                         ": token 5 is 65535, not below the vocabulary size 60", 0),
            0u) << val.status();
  // With verify (the default) Open itself refuses the shards.
  options.verify = true;
  EXPECT_FALSE(DataLoader::Open(options).ok());
}

TEST_F(DataErrorsTest, RandomDamageNeverCrashesTheLoader) {
  const fs::path good = Prepped();
  auto index = ReadIndex(good.string());
  ASSERT_TRUE(index.ok());
  std::vector<std::string> names = {kIndexFile};
  for (const ShardEntry& shard : index->shards) names.push_back(shard.name);
  std::mt19937_64 rng(2024);
  const fs::path copy = dir_ / "fuzzed";
  int rejected = 0, runs = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const std::string name = names[trial % 2 == 0 ? 0 : 1 + rng() % (names.size() - 1)];
    std::string bytes = ReadBytes(good / name);
    const int kind = static_cast<int>(rng() % 3);
    if (kind == 0) {
      bytes.resize(rng() % bytes.size());  // truncate
    } else {
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] ^= static_cast<char>(1 + rng() % 255);
    }
    fs::remove_all(copy);
    fs::copy(good, copy);
    WriteBytes(copy / name, bytes);
    auto loader = DataLoader::Open(Loader(copy.string()));
    ++runs;
    if (!loader.ok()) {
      ++rejected;
      const std::string message(loader.status().message());
      EXPECT_EQ(message.rfind(copy.string(), 0), 0u) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
      continue;
    }
    // Accepted (e.g. a flip inside a "source" string): batches hold valid tokens.
    for (int64_t step = 0; step < 3; ++step) {
      for (int32_t token : loader->GetBatch(step, 0).inputs.ToVector<int32_t>()) {
        ASSERT_GE(token, 0);
        ASSERT_LT(token, loader->vocab_size());
      }
    }
  }
  EXPECT_GT(rejected, runs * 3 / 4) << rejected << " of " << runs;
}

TEST_F(DataErrorsTest, DamagedTokenizerModelsAreOneErrorLine) {
  const fs::path good = fs::path(Prepped()) / kTokenizerFile;
  const std::string model = ReadBytes(good);
  std::mt19937_64 rng(7);
  int rejected = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::string bytes = model;
    if (trial % 3 == 0) {
      bytes.resize(rng() % bytes.size());
    } else {
      for (int f = 0; f < 3; ++f) bytes[rng() % bytes.size()] ^= static_cast<char>(1 + rng() % 255);
    }
    WriteBytes(dir_ / "bad.model", bytes);
    auto tokenizer = Tokenizer::Load(Path("bad.model"));
    if (tokenizer.ok()) continue;
    ++rejected;
    const std::string message(tokenizer.status().message());
    EXPECT_EQ(message.rfind(Path("bad.model") + ": ", 0), 0u) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_GT(rejected, 20);
  // A file far too large to be a model (sparse: no disk used) is refused before reading.
  WriteBytes(dir_ / "huge.model", "");
  fs::resize_file(dir_ / "huge.model", kMaxTokenizerModelBytes + 1);
  EXPECT_EQ(Tokenizer::Load(Path("huge.model")).status().message(),
            Path("huge.model") + ": 268435457 bytes is too large for a SentencePiece model (at "
                                 "most 268435456); is it the model?");
}

}  // namespace
}  // namespace switchyard::data
