// Checkpoints across layouts (run with 1, 2 and 4 ranks): a model saved under one mesh loads
// bit-exactly under another. The model is built by hand from parameter descriptions
// (engine/parallel/parameter.h): replicated dense parameters, experts (E, d, f) whose box
// is split over ep along dim 0 and over etp along the hidden dim at once, a
// "column-parallel" weight split over the ep group along dim 1, a non-trainable expert
// bias, two layers that pipeline stages can divide, and a fake Adam state (exp_avg,
// exp_avg_sq in the boxes of their parameter, an i64 step scalar). Every element's bits are
// a hash of (name, global index, salt), so a box in the wrong place, a stale value or a
// rounding shows up as a wrong bit pattern.
//
// ZeRO is simulated on top of any layout: the replicas of each box split its elements into
// near-equal ranges, held flat (flat_value: 1-D values of just that range) or owned
// (flat_begin/flat_end on whole-box values); saved at one sharding and loaded at others,
// under one process too, bit for bit.
//
// Also: every rank writes its own files and only its own pieces; trainer state and config
// round trip; `latest` names the newest step; the index lists every tensor with its pieces
// and total size. The failure cases are in checkpoint_failure_test.cc; the model and the
// fixture in checkpoint_fixture.h.
#include "tests/dist/checkpoint_fixture.h"

namespace switchyard::train::checkpoint_testing {
namespace {

TEST_F(CheckpointTest, SavedUnderEpWorldLoadsWholeOnEveryRank) {
  const Model saved = MakeModel(HoldingFor({.ep = R_}), /*salt=*/1);
  ASSERT_TRUE(Save(dir_, 10, saved, {.ep = R_}).ok());

  Model whole = MakeModel(HoldingFor({.ep = 1}), 0, /*zero=*/true);
  auto loaded = Load(dir_, whole);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectModel(whole, 1, "ep=1 from ep=" + std::to_string(R_));
  EXPECT_EQ(loaded->step, 10);
  EXPECT_EQ(loaded->dir, (fs::path(dir_) / "step-00000010").string());
  EXPECT_EQ(loaded->config_yaml, "model:\n  d_model: 4\n");
  EXPECT_EQ(loaded->layout.world, R_);
  EXPECT_EQ(loaded->layout.ep, R_);
  EXPECT_EQ(loaded->layout.edp, 1);
  EXPECT_EQ(loaded->layout.order, "tp-cp-ep-dp-pp");
  json state = json::parse(loaded->trainer_state_json);
  EXPECT_EQ(state["tokens_seen"], 4096);
  EXPECT_EQ(state["step"], 10);
  EXPECT_EQ(state["format"], "switchyard-checkpoint");
  EXPECT_EQ(state["format_version"], checkpoint::kCheckpointFormatVersion);
  EXPECT_TRUE(state.contains("switchyard_version"));
  EXPECT_EQ(state["layout"]["ep"], R_);

  // The pieces assemble into whole tensors: what a one-rank reader sees.
  if (me_ == 0) {
    const auto tensors = Assemble(loaded->dir, "model");
    EXPECT_EQ(tensors.at("layers.0.moe.experts.w1").shape(), (Shape{kExperts, kD, kF}));
    EXPECT_EQ(tensors.at("lm_head.weight").shape(), (Shape{kD, kVocab}));
    auto file = ReadSafetensors((fs::path(loaded->dir) / FileOf(checkpoint::kModelTensors, 0)).string());
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ(file->metadata.at("format"), "pt");
  }
}

TEST_F(CheckpointTest, SavedUnderEp1LoadsUnderEpHalfAndEpWorld) {
  const Model saved = MakeModel(HoldingFor({.ep = 1}), 2);
  ASSERT_TRUE(Save(dir_, 20, saved, {.ep = 1}).ok());
  for (int ep : {std::max(1, R_ / 2), R_}) {
    Model m = MakeModel(HoldingFor({.ep = ep}), 0, true);
    auto loaded = Load(dir_, m);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ExpectModel(m, 2, "ep=" + std::to_string(ep) + " from ep=1");
    EXPECT_EQ(loaded->layout.ep, 1);
  }
}

// Experts split on two dims at once (ep on dim 0, etp on the hidden dim: with 4 ranks
// ep 2 x etp 2) save as pieces that assemble into the tensors a whole model writes, and load under
// ep-only (ep 4, etp 1), etp-only and whole layouts, bit for bit; a whole save loads back
// into the two-dim split.
TEST_F(CheckpointTest, ExpertsSplitOverEpAndEtpMoveAcrossLayouts) {
  if (R_ < 2) GTEST_SKIP() << "an etp 2 split needs 2 or more ranks (" << R_ << " here)";
  const dist::MeshSizes two_dims{.tp = 1, .ep = R_ / 2, .etp = 2};
  const std::string name = "ep " + std::to_string(R_ / 2) + " x etp 2";
  const Model saved = MakeModel(HoldingFor(two_dims), 11);
  ASSERT_TRUE(Save(dir_, 7, saved, two_dims).ok());
  for (dist::MeshSizes sizes : {dist::MeshSizes{.ep = 1}, dist::MeshSizes{.ep = R_},
                                dist::MeshSizes{.tp = 1, .ep = 1, .etp = R_}, two_dims}) {
    const dist::Mesh mesh = MakeMesh(sizes);
    Model m = MakeModel(HoldingOf(mesh, me_), 0, true);
    auto loaded = Load(dir_, m);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ExpectModel(m, 11, "ep " + std::to_string(mesh.ep()) + " x etp " + std::to_string(mesh.etp()) +
                           " from " + name);
  }

  // The tensors are those a save of the whole model writes, bit for bit.
  const std::string whole_dir = (fs::path(dir_) / "whole").string();
  ASSERT_TRUE(Save(whole_dir, 7, MakeModel(HoldingFor({.ep = 1}), 11), {.ep = 1}).ok());
  if (me_ == 0) {
    ExpectSameTensors(StepPath(7), (fs::path(whole_dir) / "step-00000007").string(),
                      "saved under " + name + " vs the whole model");
  }
  // And the whole save loads into the two-dim split.
  Model m = MakeModel(HoldingFor(two_dims), 0, true);
  ASSERT_TRUE(Load(whole_dir, m).ok());
  ExpectModel(m, 11, name + " from ep 1");
}

TEST_F(CheckpointTest, RoundTripIsBitExactAndSavesAgainIdentically) {
  const Model saved = MakeModel(HoldingFor({.ep = R_}), 3);
  ASSERT_TRUE(Save(dir_, 1, saved, {.ep = R_}).ok());
  Model m = MakeModel(HoldingFor({.ep = R_}), 0, true);
  ASSERT_TRUE(Load(dir_, m).ok());
  ExpectModel(m, 3, "ep=R round trip");
  // Saving what was loaded, under another layout, writes the same tensors.
  Model half = MakeModel(HoldingFor({.ep = std::max(1, R_ / 2)}), 0, true);
  ASSERT_TRUE(Load(dir_, half).ok());
  const std::string again = (fs::path(dir_) / "again").string();
  ASSERT_TRUE(Save(again, 1, half, {.ep = std::max(1, R_ / 2)}).ok());
  if (me_ == 0) {
    ExpectSameTensors(StepPath(1), (fs::path(again) / "step-00000001").string(),
                      "saved again under ep " + std::to_string(std::max(1, R_ / 2)));
  }
}

TEST_F(CheckpointTest, PipelineStagesSaveOneWholeModel) {
  if (R_ % 2 != 0) GTEST_SKIP() << "pp=2 needs an even world (" << R_ << " ranks)";
  const dist::MeshSizes pp2{.ep = R_ / 2, .pp = 2};
  const Model saved = MakeModel(HoldingFor(pp2), 4);
  ASSERT_TRUE(Save(dir_, 5, saved, pp2).ok());
  Model whole = MakeModel(HoldingFor({.ep = 1}), 0, true);
  ASSERT_TRUE(Load(dir_, whole).ok());
  ExpectModel(whole, 4, "pp=1 ep=1 from pp=2");
  // Back into the pipeline layout: each stage finds its tensors, and no tensor is "unknown"
  // because some rank registers it.
  Model stage = MakeModel(HoldingFor(pp2), 0, true);
  auto loaded = Load(dir_, stage);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectModel(stage, 4, "pp=2 from pp=2");
  EXPECT_EQ(loaded->layout.pp, 2);
}

TEST_F(CheckpointTest, LatestNamesTheNewestAndTheIndexListsEveryTensor) {
  const Model m = MakeModel(HoldingFor({.ep = R_}), 5);
  auto none = checkpoint::LatestCheckpoint(dir_);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  world_->Barrier();
  ASSERT_TRUE(Save(dir_, 1, m, {.ep = R_}).ok());
  ASSERT_TRUE(Save(dir_, 2, m, {.ep = R_}).ok());
  auto latest = checkpoint::LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_TRUE(latest->has_value());
  EXPECT_EQ(**latest, (fs::path(dir_) / "step-00000002").string());
  EXPECT_EQ(ReadText((fs::path(dir_) / checkpoint::kLatestFile).string()), "step-00000002\n");
  EXPECT_EQ(Listing(dir_), (std::vector<std::string>{"latest", "step-00000001", "step-00000002"}));
  // Under ep = world every rank holds a piece of the experts and of lm_head: each writes a
  // model and an optimizer file.
  std::vector<std::string> files = {checkpoint::kConfigFile, checkpoint::kModelIndexFile, checkpoint::kTrainerStateFile};
  for (int r = 0; r < R_; ++r) {
    files.push_back(FileOf(checkpoint::kModelTensors, r));
    files.push_back(FileOf(checkpoint::kOptimizerTensors, r));
  }
  std::sort(files.begin(), files.end());
  EXPECT_EQ(Listing(**latest), files);

  // The index: every tensor with its kind and pieces; weight_map for the tensors stored
  // whole in one file (the replicated ones, written by rank 0); total_size of the model.
  json index = json::parse(ReadText((fs::path(**latest) / checkpoint::kModelIndexFile).string()));
  EXPECT_EQ(index["metadata"]["format_version"], checkpoint::kCheckpointFormatVersion);
  const Model whole = MakeModel(HoldingFor({.ep = 1}), 0, true);
  const Model mine = MakeModel(HoldingFor({.ep = R_}), 0, true);
  uint64_t total = 0;
  for (const Parameter& p : whole.params.params()) {
    const Parameter& held = *mine.params.Find(p.name);
    const json& t = index["tensors"][p.name];
    EXPECT_EQ(t["kind"], "model") << p.name;
    EXPECT_EQ(t["shape"], json(p.global_shape)) << p.name;
    EXPECT_EQ(t["dtype"], "F32") << p.name;
    EXPECT_EQ(t["pieces"].size(), held.is_whole() ? 1u : static_cast<size_t>(R_)) << p.name;
    if (held.is_whole()) {
      EXPECT_EQ(index["weight_map"].value(p.name, ""), FileOf(checkpoint::kModelTensors, 0)) << p.name;
    } else {
      EXPECT_FALSE(index["weight_map"].contains(p.name)) << p.name << " is not whole in a file";
    }
    total += NumElements(p.global_shape) * SizeOf(p.value.dtype());
  }
  EXPECT_EQ(index["metadata"]["total_size"], total);
  for (const Parameter& p : whole.optimizer) {
    EXPECT_EQ(index["tensors"][p.name]["kind"], "optimizer") << p.name;
  }
  EXPECT_EQ(index["tensors"].size(), whole.params.params().size() + whole.optimizer.size());
  auto optim = ReadSafetensors((fs::path(**latest) / FileOf(checkpoint::kOptimizerTensors, 0)).string());
  ASSERT_TRUE(optim.ok()) << optim.status();
  EXPECT_EQ(optim->tensors.at("optimizer.step").shape(), Shape{});
  EXPECT_EQ(index["tensors"]["optimizer.step"]["pieces"][0]["file"], FileOf(checkpoint::kOptimizerTensors, 0));
}

TEST_F(CheckpointTest, FlatRangesSaveAndLoadAcrossShardings) {
  struct Layout {
    dist::MeshSizes sizes;
    Zero zero;
    std::string name;
  };
  const int half = std::max(1, R_ / 2);
  const std::vector<Layout> saves = {{{.ep = 1}, {-1, true}, "ep 1, ranges over all replicas"},
                                     {{.ep = half}, {-1, true}, "ep R/2, ranges over replicas"}};
  std::vector<Layout> loads = {{{.ep = 1}, {}, "ep 1 whole"},
                               {{.ep = R_}, {-1, true}, "ep R, ranges over replicas"},
                               {{.ep = half}, {-1, false}, "ep R/2, owned ranges"}};
  if (R_ % 2 == 0) loads.push_back({{.ep = 1}, {2, true}, "ep 1, ranges 2 ways"});
  for (size_t i = 0; i < saves.size(); ++i) {
    const Layout& save = saves[i];
    SCOPED_TRACE("saved under " + save.name);
    const std::string out = (fs::path(dir_) / ("save" + std::to_string(i))).string();
    const Model saved = ZeroModel(save.sizes, 20 + i, false, save.zero);
    ASSERT_TRUE(Save(out, 3, saved, save.sizes).ok());
    for (const Layout& load : loads) {
      Model m = ZeroModel(load.sizes, 0, true, load.zero);
      auto loaded = Load(out, m);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      ExpectModel(m, 20 + i, load.name + " from " + save.name);
    }
    Model back = ZeroModel(save.sizes, 0, true, save.zero);
    ASSERT_TRUE(Load(out, back).ok());
    ExpectModel(back, 20 + i, "the saved sharding back");
    // One process alone loads the whole model (a local world: no other rank takes part).
    if (me_ == 0) {
      auto local = dist::MakeLocalCommunicator();
      Model one = MakeModel(Holding{}, 0, true);
      auto loaded = checkpoint::LoadCheckpoint(out, one.params, &one.optimizer, *local);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      ExpectModel(one, 20 + i, "one process from " + save.name);
    }
    world_->Barrier();
  }
}

// Every rank writes its own files, holding only its own pieces: with ranges over all R
// replicas every rank owns part of every tensor; rank r's files hold exactly the ranges
// rank r owns, and together the files hold each element once.
TEST_F(CheckpointTest, EveryRankWritesItsOwnPiecesInItsOwnFiles) {
  const Model saved = ZeroModel({.ep = 1}, 30, false, {-1, true});
  ASSERT_TRUE(Save(dir_, 1, saved, {.ep = 1}).ok());
  std::vector<std::string> want = {checkpoint::kConfigFile, checkpoint::kModelIndexFile, checkpoint::kTrainerStateFile};
  for (int r = 0; r < R_; ++r) {
    want.push_back(FileOf(checkpoint::kModelTensors, r));
    want.push_back(FileOf(checkpoint::kOptimizerTensors, r));
  }
  std::sort(want.begin(), want.end());
  // Every rank owns a range of every tensor but the scalar optimizer.step (one rank has it).
  EXPECT_EQ(Listing(StepPath(1)), want);
  // Each rank checks its own files: the tensors are its own ranges, bit for bit.
  int64_t mine = 0, owned = 0;
  for (int file : {checkpoint::kModelTensors, checkpoint::kOptimizerTensors}) {
    auto read = ReadSafetensors((fs::path(StepPath(1)) / FileOf(file, me_)).string());
    ASSERT_TRUE(read.ok()) << read.status();
    const std::vector<Parameter>& list =
        file == checkpoint::kModelTensors ? saved.params.params() : saved.optimizer;
    for (const Parameter& p : list) {
      const int64_t n = p.FlatEnd() - p.flat_begin;
      owned += n;
      auto it = read->tensors.find(p.name);
      if (n == 0) {
        EXPECT_EQ(it, read->tensors.end()) << p.name << ": an empty range is not written";
        continue;
      }
      ASSERT_NE(it, read->tensors.end()) << p.name << " is not in rank " << me_ << "'s file";
      mine += it->second.numel();
      ASSERT_EQ(it->second.nbytes(), p.value.nbytes()) << p.name;
      EXPECT_EQ(std::memcmp(it->second.raw_data(), p.value.raw_data(), p.value.nbytes()), 0)
          << p.name << ": rank " << me_ << "'s file holds another rank's elements";
    }
    EXPECT_EQ(read->tensors.size(),
              static_cast<size_t>(std::count_if(list.begin(), list.end(), [](const Parameter& p) {
                return p.FlatEnd() > p.flat_begin;
              })))
        << "rank " << me_ << "'s file holds tensors it does not own";
  }
  EXPECT_EQ(mine, owned);
  // Together: every element once (R ranks own R disjoint ranges of each box).
  Tensor counts = Tensor::FromVector<int64_t>({mine}, {1});
  world_->AllReduce(counts, dist::ReduceOp::kSum);
  const Model whole = MakeModel(HoldingFor({.ep = 1}), 0, true);
  int64_t elements = 0;
  for (const Parameter& p : whole.params.params()) elements += p.value.numel();
  for (const Parameter& p : whole.optimizer) elements += p.value.numel();
  EXPECT_EQ(counts.ToVector<int64_t>()[0], elements);

  // Replicas without ranges: the lowest rank writes; the others have nothing to write and
  // write no file.
  const std::string plain = (fs::path(dir_) / "plain").string();
  ASSERT_TRUE(Save(plain, 1, MakeModel(HoldingFor({.ep = 1}), 31), {.ep = 1}).ok());
  EXPECT_EQ(Listing((fs::path(plain) / "step-00000001").string()),
            (std::vector<std::string>{checkpoint::kConfigFile, FileOf(checkpoint::kModelTensors, 0), checkpoint::kModelIndexFile,
                                      FileOf(checkpoint::kOptimizerTensors, 0), checkpoint::kTrainerStateFile}));
}

// The checkpoint goes under rank 0's out_dir whatever the others pass (a benchmark gives
// each rank its own scratch directory): they write their files into rank 0's.
TEST_F(CheckpointTest, EveryRankWritesIntoRankZerosOutDir) {
  const std::string mine = (fs::path(dir_) / ("rank" + std::to_string(me_))).string();
  const Model saved = MakeModel(HoldingFor({.ep = R_}), 50);
  ASSERT_TRUE(Save(mine, 4, saved, {.ep = R_}).ok());
  const std::string step = (fs::path(dir_) / "rank0" / "step-00000004").string();
  for (int r = 0; r < R_; ++r) {
    EXPECT_TRUE(fs::exists(fs::path(step) / FileOf(checkpoint::kModelTensors, r))) << r;
    if (r > 0) {
      EXPECT_FALSE(fs::exists(fs::path(dir_) / ("rank" + std::to_string(r)))) << r;
    }
  }
  Model whole = MakeModel(HoldingFor({.ep = 1}), 0, true);
  auto loaded = Load(step, whole);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectModel(whole, 50, "saved into rank 0's out_dir");
}

// ZeRO, owned: replicas hold the whole box but own disjoint ranges of it (flat_end set,
// flat_value false); each range is written once, by its owner, and every rank loads the
// whole box back.
TEST_F(CheckpointTest, OwnedRangesOfReplicasAreWrittenOnceAndLoadWhole) {
  const Model saved = ZeroModel({.ep = 1}, 40, false, {-1, false});
  ASSERT_TRUE(Save(dir_, 2, saved, {.ep = 1}).ok());
  const json index = json::parse(ReadText((fs::path(StepPath(2)) / checkpoint::kModelIndexFile).string()));
  const json& pieces = index["tensors"]["embed.weight"]["pieces"];
  ASSERT_EQ(pieces.size(), static_cast<size_t>(R_));
  const int64_t n = kVocab * kD;
  for (int r = 0; r < R_; ++r) {
    EXPECT_EQ(pieces[r]["file"], FileOf(checkpoint::kModelTensors, r));
    EXPECT_EQ(pieces[r]["box"], json({kVocab, kD}));
    EXPECT_EQ(pieces[r]["elements"], json({r * n / R_, (r + 1) * n / R_}));
  }
  EXPECT_EQ(index["weight_map"].contains("embed.weight"), R_ == 1);
  Model whole = MakeModel(HoldingFor({.ep = 1}), 0, true);
  ASSERT_TRUE(Load(dir_, whole).ok());
  ExpectModel(whole, 40, "whole from owned ranges");
  // Into owned ranges again: a value of the whole box receives the whole box.
  Model again = ZeroModel({.ep = 1}, 0, true, {-1, false});
  ASSERT_TRUE(Load(dir_, again).ok());
  ExpectModel(again, 40, "owned ranges from owned ranges");
}

}  // namespace
}  // namespace switchyard::train::checkpoint_testing
