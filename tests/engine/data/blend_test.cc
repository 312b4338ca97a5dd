// Dataset blends (data.paths) and the loader at scale: a 0.7/0.3 blend takes its sequences
// in that ratio (within one per block prefix), every row holds the tokens and labels of its
// dataset, a fresh loader resumes at any step with the same batches, the dp ranks' batches
// together are the dp=1 batch, each dataset's windows are each read once per epoch; the
// datasets must share a tokenizer; the config's data.paths parses, prints and validates.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "engine/config/config.h"
#include "engine/data/blend.h"
#include "engine/data/loader.h"
#include "engine/data/prep.h"
#include "engine/data/shards.h"
#include "tests/testing/files.h"

namespace switchyard::data {
namespace {

namespace fs = std::filesystem;
using test_util::WriteBytes;

std::string Text(const std::vector<std::string>& words, int docs, uint32_t seed) {
  std::string text;
  uint32_t state = seed;
  const auto next = [&] { return (state = state * 1664525u + 1013904223u) >> 8; };
  for (int d = 0; d < docs; ++d) {
    for (int w = 0, n = 5 + next() % 20; w < n; ++w) text += words[next() % words.size()] + " ";
    text += "\n\n";
  }
  return text;
}

class BlendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sy_blend_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    WriteBytes(dir_ / "en.txt", Text({"the", "cat", "sat", "on", "mat", "dog"}, 150, 1));
    WriteBytes(dir_ / "de.txt", Text({"der", "hund", "lief", "weg", "und", "katze"}, 60, 2));
    WriteBytes(dir_ / "fr.txt", Text({"le", "chat", "chien", "et", "puis"}, 60, 3));
    PrepOptions a;
    a.out_dir = (dir_ / "a").string();
    a.files = {(dir_ / "en.txt").string()};
    a.vocab_size = 60;
    a.val_fraction = 0.1;
    a.shard_tokens = 700;
    ASSERT_TRUE(Prepare(a).ok());
    PrepOptions b = a;  // the same tokenizer, two labels
    b.out_dir = (dir_ / "b").string();
    b.files = {(dir_ / "de.txt").string(), (dir_ / "fr.txt").string()};
    b.tokenizer_path = (dir_ / "a" / kTokenizerFile).string();
    ASSERT_TRUE(Prepare(b).ok());
  }
  void TearDown() override { fs::remove_all(dir_); }

  LoaderOptions Blend(int rank = 0, int dp = 1, int64_t mbs = 4) const {
    LoaderOptions options;
    options.paths = {{(dir_ / "a").string(), 0.7}, {(dir_ / "b").string(), 0.3}};
    options.seq_len = 8;
    options.micro_batch_size = mbs;
    options.global_batch_size = 16;
    options.dp_rank = rank;
    options.dp_size = dp;
    options.seed = 9;
    return options;
  }
  // A dataset's training stream and per-token label names, read directly.
  std::pair<std::vector<int32_t>, std::vector<std::string>> Stream(const std::string& name) {
    auto index = ReadIndex((dir_ / name).string());
    EXPECT_TRUE(index.ok());
    std::vector<int32_t> tokens;
    for (const ShardEntry& shard : index->shards) {
      if (shard.split != Split::kTrain) continue;
      auto read = ReadShard((dir_ / name / shard.name).string());
      tokens.insert(tokens.end(), read->begin(), read->end());
    }
    std::vector<std::string> labels;
    for (const DocumentEntry& doc : index->documents) {
      if (doc.split == Split::kTrain) labels.insert(labels.end(), doc.tokens, index->labels[doc.label]);
    }
    return {tokens, labels};
  }

  fs::path dir_;
};

TEST_F(BlendTest, SamplesInTheRatioWithEachDatasetsTokensAndLabels) {
  auto loader = DataLoader::Open(Blend());
  ASSERT_TRUE(loader.ok()) << loader.status();
  EXPECT_EQ(loader->datasets(), 2);
  EXPECT_EQ(loader->labels(), (std::vector<std::string>{"de", "en", "fr"}));
  const auto streams = std::vector{Stream("a"), Stream("b")};
  int64_t from_a = 0, rows = 0;
  std::set<std::string> seen_labels;
  for (int64_t step = 0; step < 250; ++step) {
    for (int64_t micro = 0; micro < 4; ++micro) {
      const Batch batch = loader->GetBatch(step, micro);
      const auto inputs = batch.inputs.ToVector<int32_t>();
      const auto labels = batch.labels.ToVector<int32_t>();
      for (int r = 0; r < 4; ++r) {
        const int d = batch.datasets[r];
        from_a += d == 0;
        ++rows;
        const auto& [tokens, names] = streams[d];
        for (int t = 0; t < 8; ++t) {
          ASSERT_EQ(inputs[r * 8 + t], tokens[batch.offsets[r] + t]);
          ASSERT_EQ(loader->labels()[labels[r * 8 + t]], names[batch.offsets[r] + t]);
          seen_labels.insert(names[batch.offsets[r] + t]);
        }
      }
      // Every prefix of the blend is within one sequence of the weights.
      EXPECT_LE(std::abs(static_cast<double>(from_a) - 0.7 * rows), 1.0) << rows;
    }
  }
  EXPECT_EQ(rows, 4000);
  EXPECT_EQ(seen_labels.size(), 3u);

  // Dataset b's first W_b sequences are each of its windows once.
  const int64_t windows = loader->train_windows(1);
  std::set<int64_t> offsets;
  int64_t g = 0, taken = 0;
  for (; taken < windows; ++g) {
    const Batch batch = loader->GetBatch(g / 16, (g % 16) / 4);
    if (batch.datasets[g % 4] != 1) continue;
    offsets.insert(batch.offsets[g % 4]);
    ++taken;
  }
  EXPECT_EQ(static_cast<int64_t>(offsets.size()), windows);
}

TEST_F(BlendTest, ResumesAtAnyStepAndIsLayoutIndependent) {
  auto one = DataLoader::Open(Blend());
  ASSERT_TRUE(one.ok()) << one.status();
  // A loader opened "after a checkpoint" gives the same next batches: the step is the
  // whole data position.
  auto resumed = DataLoader::Open(Blend());
  ASSERT_TRUE(resumed.ok());
  for (int64_t step : {0, 17, 123, 4096, 70000}) {
    for (int64_t micro = 0; micro < 4; ++micro) {
      const Batch a = one->GetBatch(step, micro), b = resumed->GetBatch(step, micro);
      EXPECT_EQ(a.inputs.ToVector<int32_t>(), b.inputs.ToVector<int32_t>());
      EXPECT_EQ(a.labels.ToVector<int32_t>(), b.labels.ToVector<int32_t>());
      EXPECT_EQ(a.datasets, b.datasets);
    }
  }
  // Without the up-front verification (each rank reads only its windows): the same batches.
  LoaderOptions lazy = Blend();
  lazy.verify = false;
  auto unverified = DataLoader::Open(lazy);
  ASSERT_TRUE(unverified.ok()) << unverified.status();
  for (int64_t step : {0, 5, 999}) {
    EXPECT_EQ(unverified->GetBatch(step, 1).inputs.ToVector<int32_t>(),
              one->GetBatch(step, 1).inputs.ToVector<int32_t>());
  }
  // dp 2 and dp 4 with other micro-batch sizes: the same rows per global sequence.
  for (auto [dp, mbs] : {std::pair{2, 2}, std::pair{4, 4}}) {
    for (int64_t step = 0; step < 6; ++step) {
      std::map<int64_t, std::vector<int32_t>> want, got;
      for (int64_t m = 0; m < 4; ++m) {
        const Batch b = one->GetBatch(step, m);
        const auto in = b.inputs.ToVector<int32_t>();
        for (int r = 0; r < 4; ++r) want[b.sequences[r]] = {in.begin() + r * 8, in.begin() + r * 8 + 8};
      }
      for (int rank = 0; rank < dp; ++rank) {
        auto loader = DataLoader::Open(Blend(rank, dp, mbs));
        ASSERT_TRUE(loader.ok()) << loader.status();
        for (int64_t m = 0; m < loader->micro_batches_per_step(); ++m) {
          const Batch b = loader->GetBatch(step, m);
          const auto in = b.inputs.ToVector<int32_t>();
          for (int64_t r = 0; r < mbs; ++r) {
            got[b.sequences[r]] = {in.begin() + r * 8, in.begin() + r * 8 + 8};
          }
        }
      }
      EXPECT_EQ(got, want) << "dp " << dp << " step " << step;
    }
  }
  // Validation: a's windows, then b's.
  auto val = one->ValidationBatches(0);
  ASSERT_TRUE(val.ok()) << val.status();
  EXPECT_EQ(val->front().datasets.front(), 0);
  EXPECT_EQ(val->back().datasets.back(), 1);
}

TEST_F(BlendTest, ScheduleAndErrors) {
  auto schedule = BlendSchedule::Create({0.7, 0.3});
  ASSERT_TRUE(schedule.ok());
  EXPECT_EQ(schedule->per_block(), (std::vector<int64_t>{45875, 19661}));
  EXPECT_EQ(schedule->Locate(0), (std::pair<int, int64_t>{0, 0}));
  EXPECT_EQ(schedule->Locate(BlendSchedule::kBlock), (std::pair<int, int64_t>{0, 45875}));
  EXPECT_EQ(BlendSchedule::Create({1.0, 0.0}).status().message(),
            "data.paths[1].weight must be a positive number, got 0");

  // Another tokenizer: refused with both folders named.
  PrepOptions c;
  c.out_dir = (dir_ / "c").string();
  c.files = {(dir_ / "fr.txt").string()};
  c.vocab_size = 50;
  ASSERT_TRUE(Prepare(c).ok());
  LoaderOptions options = Blend();
  options.paths[1].dir = c.out_dir;
  auto mixed = DataLoader::Open(options);
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find(c.out_dir + ": its tokenizer differs from " +
                                          (dir_ / "a").string()),
            std::string::npos)
      << mixed.status();
  options = Blend();
  options.dir = "x";
  EXPECT_EQ(DataLoader::Open(options).status().message(),
            "data.dir (x) and data.paths are both set; use one");

  // The config: parse, print, parse again; bad entries name the key.
  auto config = config::ParseConfig(
      "data: {paths: [{dir: a, weight: 0.7}, {dir: \"b c\", weight: 0.3}], verify: false}\n",
      "<string>");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->data.paths.size(), 2u);
  EXPECT_EQ(config->data.paths[1].dir, "b c");
  EXPECT_EQ(config->data.paths[0].weight, 0.7);
  EXPECT_FALSE(config->data.verify);
  EXPECT_EQ(config->data.FirstDir(), "a");
  auto again = config::ParseConfig(config->ToYaml(), "<resolved>");
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << config->ToYaml();
  EXPECT_EQ(again->data.paths[1].dir, "b c");
  EXPECT_EQ(again->data.paths[1].weight, 0.3);
  auto bad = config::ParseConfig("data: {paths: [{dir: a, weight: -1}]}\n", "<string>");
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->data.Validate().message(), "data.paths[0].weight=-1 must be a positive number");
  auto unknown = config::ParseConfig("data: {paths: [{folder: a}]}\n", "<string>");
  EXPECT_EQ(unknown.status().message(),
            "<string>: data.paths[0]: unknown key 'folder' (expected dir and weight)");
}

}  // namespace
}  // namespace switchyard::data
