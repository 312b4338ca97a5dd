// Checkpoints that fail (run with 1, 2 and 4 ranks; the model and fixture of
// checkpoint_fixture.h): each broken checkpoint (missing, no latest, partial, truncated,
// mismatched) gives its own error, the same on every rank, changes no value and leaves the
// good checkpoint loadable; a failed save (an error on any rank) leaves the previous step
// and `latest` as they were; saving a step again replaces it; ranks that disagree on a
// tensor's shape are refused.
#include "tests/dist/checkpoint_fixture.h"

namespace switchyard::train::checkpoint_testing {
namespace {

TEST_F(CheckpointTest, BrokenCheckpointsGiveTheirErrorAndTheGoodOneStillLoads) {
  const Model m = MakeModel(HoldingFor({.ep = R_}), 6);
  const std::string out = (fs::path(dir_) / "out").string();
  ASSERT_TRUE(Save(out, 7, m, {.ep = R_}).ok());
  const std::string good = (fs::path(out) / "step-00000007").string();
  const std::string rank0_file = FileOf(checkpoint::kModelTensors, 0);
  const std::string good_bytes = ReadText((fs::path(good) / rank0_file).string());
  auto path = [&](const std::string& name) { return (fs::path(dir_) / name).string(); };
  if (me_ == 0) {
    // An out dir with a step directory but no `latest`.
    fs::create_directories(path("no_latest"));
    fs::copy(good, path("no_latest/step-00000007"));
    // The temporary directory of an interrupted save, and a step dir without its index.
    fs::copy(good, path(".step-00000008.tmp-123"));
    fs::copy(good, path("step-00000009"));
    fs::remove(path("step-00000009/") + checkpoint::kModelIndexFile);
    // A truncated model file (its data, not its header).
    fs::copy(good, path("cut"));
    fs::resize_file(path("cut/") + rank0_file, good_bytes.size() - 12);
    // The last rank's model file lost.
    fs::copy(good, path("missing_file"));
    fs::remove(path("missing_file/") + FileOf(checkpoint::kModelTensors, R_ - 1));
    // `latest` naming a step that is not there.
    fs::create_directories(path("dangling"));
    WriteText(path("dangling/latest"), "step-00000042\n");
  }
  world_->Barrier();

  using C = absl::StatusCode;
  const Holding whole = HoldingFor({.ep = 1});
  {
    Model t = MakeModel(whole, 0, true);
    ExpectLoadError(path("nowhere"), t, C::kNotFound, "does not exist");
    ExpectLoadError(path("no_latest"), t, C::kNotFound, "no latest file");
    ExpectLoadError(path("dangling"), t, C::kNotFound, "names step-00000042, which does not exist");
    ExpectLoadError(path(".step-00000008.tmp-123"), t, C::kFailedPrecondition,
                    "incomplete checkpoint");
    ExpectLoadError(path("step-00000009"), t, C::kFailedPrecondition,
                    "incomplete checkpoint (no model.safetensors.index.json)");
    // Caught by the index's size of the file (on the rank that verifies it) or by its
    // header (on a rank that reads it first): the message names the file either way.
    ExpectLoadError(path("cut"), t, C::kDataLoss, "cut/" + rank0_file + ": ");
    ExpectLoadError(path("missing_file"), t, C::kFailedPrecondition,
                    FileOf(checkpoint::kModelTensors, R_ - 1) + ", which is missing");
  }
  {
    Model t = MakeModel(whole, 0, true, [](std::vector<Spec>& s) {
      s.push_back({"layers.9.norm.weight", {kD}});
    });
    ExpectLoadError(out, t, C::kNotFound, "no tensor 'layers.9.norm.weight'");
  }
  {
    Model t = MakeModel(whole, 0, true, [](std::vector<Spec>& s) {
      std::erase_if(s, [](const Spec& x) { return x.name == "embed.weight"; });
    });
    ExpectLoadError(out, t, C::kInvalidArgument,
                    "'embed.weight' f32 (16, 4), which no rank registered");
  }
  {
    Model t = MakeModel(whole, 0, true, [](std::vector<Spec>& s) {
      for (Spec& x : s)
        if (x.name == "layers.1.moe.experts.w2") x.global = {kExperts, kF + 1, kD};
    });
    ExpectLoadError(
        out, t, C::kInvalidArgument,
        "'layers.1.moe.experts.w2': the model has f32 (8, 7, 4), the checkpoint f32 (8, 6, 4)");
  }
  {
    Model t = MakeModel(whole, 0, true, [](std::vector<Spec>& s) {
      for (Spec& x : s)
        if (x.name == "optimizer.step") x.dtype = DType::kF32;
    });
    ExpectLoadError(out, t, C::kInvalidArgument,
                    "'optimizer.step': the model has f32 (), the checkpoint i64 ()");
  }
  // Nothing was touched: the good checkpoint loads, byte for byte as written.
  EXPECT_EQ(ReadText((fs::path(good) / rank0_file).string()), good_bytes);
  Model t = MakeModel(whole, 0, true);
  auto loaded = Load(out, t);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectModel(t, 6, "the good checkpoint after the failures");
}

TEST_F(CheckpointTest, AFailedSaveLeavesThePreviousCheckpoint) {
  const Model first = MakeModel(HoldingFor({.ep = R_}), 7);
  const Model second = MakeModel(HoldingFor({.ep = R_}), 8);
  ASSERT_TRUE(Save(dir_, 1, first, {.ep = R_}).ok());
  // Step 2's directory name is taken by a file: the save fails after writing everything.
  if (me_ == 0) WriteText((fs::path(dir_) / "step-00000002").string(), "in the way");
  world_->Barrier();
  Status s = Save(dir_, 2, second, {.ep = R_});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("exists and is not a directory"), std::string::npos) << s;
  EXPECT_EQ(std::string(s.message()), FromRank0(std::string(s.message())));
  // Bad trainer state, and an out dir that is a file: refused before anything is written.
  s = Save(dir_, 3, second, {.ep = R_}, "[1, 2]");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = Save(dir_, 3, second, {.ep = R_}, R"({"layout": 1})");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = Save((fs::path(dir_) / "step-00000002").string(), 3, second, {.ep = R_});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  // The last rank cannot write its file (a file size limit: EFBIG) after the others wrote
  // theirs: every rank returns that rank's error, and the temporary directory goes.
  {
    struct rlimit old_limit;
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
    void (*old_handler)(int) = SIG_DFL;
    if (me_ == R_ - 1) {
      old_handler = std::signal(SIGXFSZ, SIG_IGN);
      struct rlimit small = old_limit;
      small.rlim_cur = 64;
      ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    }
    s = Save(dir_, 3, second, {.ep = R_});
    if (me_ == R_ - 1) {
      ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old_limit), 0);
      std::signal(SIGXFSZ, old_handler);
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find(FileOf(checkpoint::kModelTensors, R_ - 1) + ": write failed"),
              std::string::npos) << s;
    EXPECT_EQ(s.message().find(".tmp."), std::string::npos) << s;  // the file, not its temporary
    EXPECT_EQ(std::string(s.message()), FromRank0(std::string(s.message())));
  }

  EXPECT_EQ(Listing(dir_), (std::vector<std::string>{"latest", "step-00000001", "step-00000002"}))
      << "no temporary directory is left behind";
  EXPECT_EQ(ReadText((fs::path(dir_) / checkpoint::kLatestFile).string()), "step-00000001\n");
  Model m = MakeModel(HoldingFor({.ep = 1}), 0, true);
  auto loaded = Load(dir_, m);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 1);
  ExpectModel(m, 7, "step 1 after the failed saves");
}

TEST_F(CheckpointTest, SavingAStepAgainReplacesIt) {
  ASSERT_TRUE(Save(dir_, 3, MakeModel(HoldingFor({.ep = R_}), 9), {.ep = R_}).ok());
  ASSERT_TRUE(Save(dir_, 3, MakeModel(HoldingFor({.ep = 1}), 10), {.ep = 1}, "{\"step\": 3}").ok());
  EXPECT_EQ(Listing(dir_), (std::vector<std::string>{"latest", "step-00000003"}));
  Model m = MakeModel(HoldingFor({.ep = R_}), 0, true);
  auto loaded = Load(dir_, m);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectModel(m, 10, "the second save of step 3");
  EXPECT_EQ(loaded->layout.ep, 1);
  // A trainer step that disagrees is refused.
  Status s = Save(dir_, 4, m, {.ep = R_}, "{\"step\": 3}");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST_F(CheckpointTest, RanksThatDisagreeOnAShapeAreRefused) {
  if (R_ < 2) GTEST_SKIP() << "needs two ranks to disagree";
  const Model m = MakeModel(HoldingFor({.ep = R_}), 11, false, [&](std::vector<Spec>& s) {
    for (Spec& x : s)
      if (x.name == "embed.weight" && me_ == R_ - 1) x.global = {kVocab + 1, kD};
  });
  Status s = Save(dir_, 1, m, {.ep = R_});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("'embed.weight' is f32 (16, 4) on rank 0 but f32 (17, 4) on rank " +
                             std::to_string(R_ - 1)),
            std::string::npos)
      << s;
  EXPECT_FALSE(fs::exists(dir_)) << "nothing is written";
}

// ZeRO, flat: each box's replicas hold near-equal element ranges of it as 1-D values. Saved
// with the ranges over all replicas (ep 1: a dense tensor in R ranges; ep R/2: experts in
// 2 ranges of each ep box), then loaded whole on every rank, whole under one process, as
// other shardings (ranges 2 ways with replicas holding identical ones, ep R with experts
// unsplit by ZeRO, owned ranges of whole boxes) and back as the saved one, bit for bit.

}  // namespace
}  // namespace switchyard::train::checkpoint_testing
