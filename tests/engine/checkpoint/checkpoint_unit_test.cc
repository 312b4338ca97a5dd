// Checkpoints in one process (a local communicator; runs in builds without MPI too): step
// directory names, `latest`, a newer format (in trainer_state.json or the index), a
// corrupt trainer state, an index that disagrees with itself or its file (weight_map,
// total_size, pieces outside their tensor, overlapping or leaving a gap), corrupt files (a
// piece stored under another shape, an unlisted tensor, offsets past the end, a header
// length that does not fit or wraps), a format 1 checkpoint, a leftover temporary
// directory that nothing reads, flat values saved whole and loaded into any range, a whole
// saved tensor loaded into every box of a 2-dim split, and the index text of a plan parsed
// back with its refusals. Pieces and plans alone: checkpoint_plan_test.cc; the layout cases
// run under mpirun in tests/dist/checkpoint_test.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/safetensors.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/index.h"
#include "engine/checkpoint/save_plan.h"
#include "tests/engine/checkpoint/checkpoint_test_util.h"
#include "tests/testing/files.h"

namespace switchyard::train {
namespace {

using testing::GlobalFlat;
using testing::Pattern;
using testing::SameElement;

namespace fs = std::filesystem;
using test_util::ReadBytes;
using test_util::WriteBytes;
using json = nlohmann::json;

class CheckpointUnitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sy_ckpt_unit_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    world_ = dist::MakeLocalCommunicator();
    parallel::Parameter w;
    w.name = "w";
    w.global_shape = {2, 3};
    w.value = Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
    w.grad = Tensor::Zeros({2, 3}, DType::kF32);
    params_.Add(w);
    parallel::Parameter b;
    b.name = "b";
    b.global_shape = {3};
    b.value = Tensor::FromVector<float>({7, 8, 9}, {3});
    b.grad = Tensor::Zeros({3}, DType::kF32);
    params_.Add(b);
    parallel::Parameter step;
    step.name = "optimizer.step";
    step.trainable = false;
    step.value = Tensor::FromVector<int64_t>({12}, {});
    optimizer_.push_back(step);
  }
  void TearDown() override { fs::remove_all(dir_); }

  Status Save(int64_t step) {
    return checkpoint::SaveCheckpoint(dir_.string(), step,
                          {.params = &params_,
                           .optimizer_state = optimizer_,
                           .trainer_state_json = R"({"rng": {"seed": 5}})",
                           .config_yaml = "x: 1\n"},
                          *world_, *dist::Mesh::Create(1, {}));
  }
  Status Load(const std::string& path) {
    return checkpoint::LoadCheckpoint(path, params_, &optimizer_, *world_).status();
  }
  std::string Step(int64_t step) { return (dir_ / checkpoint::StepDirName(step)).string(); }

  fs::path dir_;
  std::unique_ptr<dist::Communicator> world_;
  parallel::ParameterRegistry params_;
  std::vector<parallel::Parameter> optimizer_;
};

TEST_F(CheckpointUnitTest, StepDirectoryNames) {
  EXPECT_EQ(checkpoint::StepDirName(0), "step-00000000");
  EXPECT_EQ(checkpoint::StepDirName(1234), "step-00001234");
  EXPECT_EQ(checkpoint::StepDirName(123456789), "step-123456789");
}

TEST_F(CheckpointUnitTest, RoundTripsInOneProcess) {
  ASSERT_TRUE(Save(4).ok());
  params_.params()[0].value.SetZero();
  optimizer_[0].value.SetZero();
  auto loaded = checkpoint::LoadCheckpoint(dir_.string(), params_, &optimizer_, *world_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(params_.params()[0].value.ToVector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(optimizer_[0].value.ToVector<int64_t>()[0], 12);
  EXPECT_EQ(loaded->step, 4);
  EXPECT_EQ(json::parse(loaded->trainer_state_json)["rng"]["seed"], 5);
  EXPECT_EQ(loaded->config_yaml, "x: 1\n");
  // Without the optimizer: only the model is read.
  EXPECT_TRUE(checkpoint::LoadCheckpoint(Step(4), params_, nullptr, *world_).ok());
}

TEST_F(CheckpointUnitTest, LatestMustNameAStepDirectory) {
  auto none = checkpoint::LatestCheckpoint(dir_.string());
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  ASSERT_TRUE(Save(1).ok());
  WriteBytes((dir_ / "latest").string(), "../elsewhere\n");
  auto bad = checkpoint::LatestCheckpoint(dir_.string());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << bad.status();
  Status s = Load(dir_.string());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("expected one line naming the step directory saved last, like "
                             "step-00000100, got '../elsewhere'"),
            std::string::npos)
      << s;
  // Its bytes are echoed escaped and cut to 80: never a multi-line or 10 MB error.
  WriteBytes((dir_ / "latest").string(), "step-00000001\nstep-2\n\x1b[31m" + std::string(200, 'a'));
  s = Load(dir_.string());
  EXPECT_NE(s.message().find("got 'step-00000001\\nstep-2\\n\\x1b[31maaa"), std::string::npos) << s;
  EXPECT_NE(s.message().find("a'... (226 bytes)"), std::string::npos) << s;
  EXPECT_LT(s.message().size(), 300u) << s;
  WriteBytes((dir_ / "latest").string(), std::string(10000, 'a'));
  s = Load(dir_.string());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("latest: 10000 bytes; expected one line"), std::string::npos) << s;
  // A step directory replaced by a file is said to be one.
  WriteBytes((dir_ / "latest").string(), "step-00000001\n");
  fs::remove_all(Step(1));
  WriteBytes(Step(1), "x");
  s = Load(dir_.string());
  EXPECT_NE(s.message().find("latest names step-00000001, which is not a directory"),
            std::string::npos)
      << s;
}

TEST_F(CheckpointUnitTest, ANewerFormatIsRefused) {
  ASSERT_TRUE(Save(1).ok());
  const std::string path = Step(1) + "/trainer_state.json";
  json state = json::parse(ReadBytes(path));
  state["format_version"] = checkpoint::kCheckpointFormatVersion + 1;
  WriteBytes(path, state.dump());
  Status s = Load(Step(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("this build reads up to"), std::string::npos) << s;
  WriteBytes(path, "{not json");
  s = Load(Step(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  // The index says which format it is too (for readers that start there).
  ASSERT_TRUE(Save(2).ok());
  const std::string index_path = Step(2) + "/model.safetensors.index.json";
  json index = json::parse(ReadBytes(index_path));
  EXPECT_EQ(index["metadata"]["format_version"], checkpoint::kCheckpointFormatVersion);
  index["metadata"]["format_version"] = checkpoint::kCheckpointFormatVersion + 1;
  WriteBytes(index_path, index.dump());
  s = Load(Step(2));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("model.safetensors.index.json: format version 3; this build reads up "
                             "to 2"),
            std::string::npos)
      << s;
}

// A checkpoint of format 1 (one model.safetensors of whole tensors, an index with only a
// weight_map, optimizer.safetensors beside it) still loads.
TEST_F(CheckpointUnitTest, AFormat1CheckpointStillLoads) {
  const std::string dir = Step(5);
  fs::create_directories(dir);
  SafetensorsFile model, optimizer;
  model.metadata["format"] = "pt";
  model.tensors["w"] = Tensor::FromVector<float>({6, 5, 4, 3, 2, 1}, {2, 3});
  model.tensors["b"] = Tensor::FromVector<float>({-1, -2, -3}, {3});
  optimizer.tensors["optimizer.step"] = Tensor::FromVector<int64_t>({77}, {});
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", model).ok());
  ASSERT_TRUE(WriteSafetensors(dir + "/optimizer.safetensors", optimizer).ok());
  WriteBytes(dir + "/model.safetensors.index.json",
            R"({"metadata": {"total_size": 36}, "weight_map": {"w": "model.safetensors", )"
            R"("b": "model.safetensors"}})");
  WriteBytes(dir + "/trainer_state.json",
            R"({"format": "switchyard-checkpoint", "format_version": 1, "step": 5})");
  WriteBytes(dir + "/config.yaml", "x: 1\n");
  auto loaded = checkpoint::LoadCheckpoint(dir, params_, &optimizer_, *world_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 5);
  EXPECT_EQ(params_.params()[0].value.ToVector<float>(), (std::vector<float>{6, 5, 4, 3, 2, 1}));
  EXPECT_EQ(params_.params()[1].value.ToVector<float>(), (std::vector<float>{-1, -2, -3}));
  EXPECT_EQ(optimizer_[0].value.ToVector<int64_t>()[0], 77);
  // Its errors are those of format 1.
  WriteBytes(dir + "/model.safetensors.index.json",
            R"({"weight_map": {"w": "model.safetensors", "v": "model.safetensors"}})");
  Status s = Load(dir);
  EXPECT_NE(s.message().find("lists 'v' in model.safetensors, which does not hold it"),
            std::string::npos)
      << s;
  WriteBytes(dir + "/model.safetensors.index.json", R"({"weight_map": {"w": "model.safetensors"}})");
  s = Load(dir);
  EXPECT_NE(s.message().find("holds 'b', which model.safetensors.index.json does not list"),
            std::string::npos)
      << s;
  fs::remove(dir + "/optimizer.safetensors");
  WriteBytes(dir + "/model.safetensors.index.json",
            R"({"weight_map": {"w": "model.safetensors", "b": "model.safetensors"}})");
  s = Load(dir);
  EXPECT_NE(s.message().find("incomplete checkpoint (no optimizer.safetensors)"), std::string::npos)
      << s;
  EXPECT_TRUE(checkpoint::LoadCheckpoint(dir, params_, nullptr, *world_).ok());
}

TEST_F(CheckpointUnitTest, AnIndexThatDisagreesWithItselfOrItsFileIsCorrupt) {
  ASSERT_TRUE(Save(1).ok());
  const std::string path = Step(1) + "/model.safetensors.index.json";
  const std::string good = ReadBytes(path);
  auto load_with = [&](const json& index) {
    WriteBytes(path, index.dump());
    Status s = Load(Step(1));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    return std::string(s.message());
  };
  json index = json::parse(good);
  index["metadata"]["total_size"] = 1;
  EXPECT_NE(load_with(index).find("total_size 1 but the tensors hold 36 bytes"), std::string::npos);
  index = json::parse(good);
  index["weight_map"].erase("w");
  EXPECT_NE(load_with(index).find("weight_map misses 'w', a model tensor stored whole in "
                                  "model.safetensors"),
            std::string::npos);
  index = json::parse(good);
  index["weight_map"]["v"] = "model.safetensors";
  EXPECT_NE(load_with(index).find("weight_map lists 'v', which \"tensors\" does not"),
            std::string::npos);
  index = json::parse(good);
  index["weight_map"]["w"] = "../model.safetensors";
  EXPECT_NE(load_with(index).find("tensor 'w' maps to \"../model.safetensors\", not a file name"),
            std::string::npos);
  // Pieces: outside the tensor, a gap, an overlap, and a file name with a path in it.
  index = json::parse(good);
  index["tensors"]["w"]["pieces"][0]["elements"] = {0, 7};
  EXPECT_NE(load_with(index).find("tensor 'w': a piece outside the tensor (the whole tensor, "
                                  "elements [0, 7))"),
            std::string::npos);
  index = json::parse(good);
  index["weight_map"].erase("w");
  index["tensors"]["w"]["pieces"][0]["elements"] = {0, 5};
  index["metadata"]["total_size"] = 32;
  EXPECT_NE(load_with(index).find("the pieces of 'w' (2, 3) cover 5 of its 6 elements"),
            std::string::npos);
  index["tensors"]["w"]["pieces"].push_back(
      {{"file", "model.safetensors"}, {"offset", {1, 0}}, {"box", {1, 3}}, {"elements", {0, 3}}});
  index["metadata"]["total_size"] = 44;
  EXPECT_NE(load_with(index).find("the pieces of 'w' overlap (the whole tensor, elements [0, 5) in "
                                  "model.safetensors; box (1, 3) at [1, 0] in model.safetensors)"),
            std::string::npos);
  index = json::parse(good);
  index["tensors"]["b"]["pieces"][0]["file"] = "sub/model.safetensors";
  EXPECT_NE(load_with(index).find("tensor 'b': piece 0: file \"sub/model.safetensors\" is not a file "
                                  "name (a file of the step directory, without '/')"),
            std::string::npos);
  index = json::parse(good);
  index.erase("tensors");
  EXPECT_NE(load_with(index).find("no \"tensors\" object"), std::string::npos);

  // The file: a piece stored under another shape, a tensor the index does not list, and
  // data offsets past its end. With the index's checksums each is a checksum mismatch;
  // without them (an index of an older build) the structure checks name the problem.
  WriteBytes(path, good);
  const std::string file = Step(1) + "/model.safetensors";
  auto contents = ReadSafetensors(file);
  ASSERT_TRUE(contents.ok()) << contents.status();
  SafetensorsFile changed = *contents;
  changed.tensors["w"] = changed.tensors["w"].Reshape({3, 2});
  ASSERT_TRUE(WriteSafetensors(file, changed).ok());
  Status s = Load(Step(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(file + ": checksum mismatch (crc32 "), std::string::npos) << s;
  json unchecked = json::parse(good);
  ASSERT_TRUE(unchecked.contains("files"));
  unchecked.erase("files");
  WriteBytes(path, unchecked.dump());
  s = Load(Step(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("model.safetensors: 'w' is f32 (3, 2) but "
                             "model.safetensors.index.json says f32 (2, 3) (the whole tensor)"),
            std::string::npos)
      << s;
  changed = *contents;
  changed.tensors["x"] = Tensor::Zeros({1}, DType::kF32);
  ASSERT_TRUE(WriteSafetensors(file, changed).ok());
  s = Load(Step(1));
  EXPECT_NE(s.message().find("model.safetensors: holds 'x', which model.safetensors.index.json "
                             "does not list"),
            std::string::npos)
      << s;
  ASSERT_TRUE(WriteSafetensors(file, *contents).ok());
  std::string bytes = ReadBytes(file);
  const size_t at = bytes.find("\"data_offsets\":[0,12]");  // "b", first by name: 3 f32
  ASSERT_NE(at, std::string::npos) << bytes.substr(0, 200);
  bytes.replace(at, 21, "\"data_offsets\":[0,99]");
  WriteBytes(file, bytes);
  s = Load(Step(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(file + ": tensor 'b' data_offsets [0, 99) do not hold f32 (3)"),
            std::string::npos)
      << s;
  // A header length larger than the file, and one whose sum would wrap around.
  for (uint64_t length : {uint64_t{1} << 20, ~uint64_t{0} - 4}) {
    std::string head(8, '\0');
    for (int i = 0; i < 8; ++i) head[i] = static_cast<char>((length >> (8 * i)) & 0xff);
    WriteBytes(file, head + bytes.substr(8));
    s = Load(Step(1));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find(file + ": header length"), std::string::npos) << s;
  }
  // Nothing was changed by the failed loads.
  EXPECT_EQ(params_.params()[0].value.ToVector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST_F(CheckpointUnitTest, ALeftoverTemporaryDirectoryIsNeverLoaded) {
  ASSERT_TRUE(Save(1).ok());
  fs::copy(Step(1), dir_ / ".step-00000002.tmp-99");
  auto latest = checkpoint::LatestCheckpoint(dir_.string());
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ(**latest, Step(1));
  EXPECT_TRUE(Load(dir_.string()).ok());
  Status s = Load((dir_ / ".step-00000002.tmp-99").string());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("incomplete checkpoint"), std::string::npos) << s;
  // The next save is unaffected by it.
  ASSERT_TRUE(Save(2).ok());
  EXPECT_TRUE(Load(dir_.string()).ok());
}

TEST_F(CheckpointUnitTest, TheLeftoversOfAKilledSaveAreRemovedAtTheNextStart) {
  ASSERT_TRUE(Save(1).ok());
  // What a kill -9 mid-save leaves: a temporary step directory, a replaced step's old
  // directory, and `latest`'s temporary file from WriteFileAtomically.
  fs::copy(Step(1), dir_ / ".step-00000002.tmp-99");
  fs::copy(Step(1), dir_ / ".step-00000001.old-98");
  WriteBytes((dir_ / "latest.tmp.97").string(), "step-00000002\n");
  // Not leftovers: a user's file that only looks alike, and a directory named like the file.
  WriteBytes((dir_ / "latest.tmpfile").string(), "x");
  fs::create_directories(dir_ / "notes" / "latest.tmp.5");
  std::vector<std::string> removed;
  ASSERT_TRUE(checkpoint::RemoveLeftoverTempDirs(dir_.string(), &removed).ok());
  EXPECT_EQ(removed, (std::vector<std::string>{(dir_ / ".step-00000001.old-98").string(),
                                               (dir_ / ".step-00000002.tmp-99").string(),
                                               (dir_ / "latest.tmp.97").string()}));
  EXPECT_FALSE(fs::exists(dir_ / "latest.tmp.97"));
  EXPECT_FALSE(fs::exists(dir_ / ".step-00000002.tmp-99"));
  EXPECT_TRUE(fs::exists(dir_ / "latest.tmpfile"));
  EXPECT_TRUE(fs::exists(dir_ / "notes" / "latest.tmp.5"));
  // What was saved is untouched and still `latest`.
  EXPECT_EQ(ReadBytes((dir_ / "latest").string()), "step-00000001\n");
  EXPECT_TRUE(Load(dir_.string()).ok());
  // A second start finds nothing more to remove.
  removed.clear();
  ASSERT_TRUE(checkpoint::RemoveLeftoverTempDirs(dir_.string(), &removed).ok());
  EXPECT_TRUE(removed.empty());
}

// ---- Pieces in one process ---------------------------------------------------------------


checkpoint::CheckpointContents Contents(const parallel::ParameterRegistry& params) {
  return {.params = &params, .optimizer_state = {}, .trainer_state_json = "", .config_yaml = ""};
}

// One process holds the whole tensor to save it; any box of it loads back bit for bit, and
// a box alone cannot be saved (nothing else holds the rest).
TEST_F(CheckpointUnitTest, AWholeTensorLoadsIntoEveryBoxOfATwoDimSplit) {
  using parallel::Parameter;
  const Shape global = {4, 3, 6};
  const Tensor w1 = Pattern(global, DType::kF32, 3);
  parallel::ParameterRegistry whole;
  whole.Add(Parameter::Expert("experts.w1", w1.Clone(), Tensor::Zeros(global, DType::kF32), true));
  const dist::Mesh one = *dist::Mesh::Create(1, {});
  ASSERT_TRUE(checkpoint::SaveCheckpoint(dir_.string(), 1, Contents(whole), *world_, one).ok());
  for (int64_t e = 0; e < 2; ++e) {
    for (int64_t t = 0; t < 2; ++t) {
      SCOPED_TRACE("ep index " + std::to_string(e) + ", etp index " + std::to_string(t));
      parallel::ParameterRegistry box;
      Parameter p = Parameter::Expert("experts.w1", Tensor::Zeros({2, 3, 3}, DType::kF32),
                                      Tensor::Zeros({2, 3, 3}, DType::kF32), true);
      p.Split(0, 2 * e, 4).Split(2, 3 * t, 6);
      box.Add(std::move(p));
      auto loaded = checkpoint::LoadCheckpoint(dir_.string(), box, nullptr, *world_);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      const Parameter& got = box.params()[0];
      for (int64_t k = 0; k < got.value.numel(); ++k) {
        ASSERT_TRUE(
            SameElement(got.value, k, w1, GlobalFlat(global, got.offset, {2, 3, 3}, k)))
            << "element " << k;
      }
      // Saving that box alone leaves three quarters of the tensor uncovered.
      Status s = checkpoint::SaveCheckpoint((dir_ / "box").string(), 1, Contents(box), *world_, one);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_NE(s.message().find("the pieces of 'experts.w1' (4, 3, 6) cover 18 of its 72 elements"),
                std::string::npos)
          << s;
      EXPECT_FALSE(fs::exists(dir_ / "box")) << "nothing is written";
    }
  }
}

// One process holding every element saves flat values (a ZeRO shard of the whole box is
// the whole box here) as ordinary whole tensors, and loads into any element range of a box.
TEST_F(CheckpointUnitTest, FlatValuesSaveWholeAndLoadIntoAnyRange) {
  using parallel::Parameter;
  const Tensor w1 = Pattern({4, 3}, DType::kF32, 9);
  parallel::ParameterRegistry whole;
  Parameter flat = Parameter::Dense("w", w1.Reshape({12}).Clone(), Tensor::Zeros({12}, DType::kF32), true);
  flat.global_shape = {4, 3};
  flat.flat_value = true;
  flat.box_shape = {4, 3};
  whole.Add(flat);
  const dist::Mesh one = *dist::Mesh::Create(1, {});
  ASSERT_TRUE(checkpoint::SaveCheckpoint(dir_.string(), 1, Contents(whole), *world_, one).ok());
  auto file = ReadSafetensors(Step(1) + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->tensors.at("w").shape(), (Shape{4, 3})) << "stored whole, under its shape";
  json index = json::parse(ReadBytes(Step(1) + "/model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"]["w"], "model.safetensors");
  EXPECT_EQ(index["tensors"]["w"]["kind"], "model");
  EXPECT_EQ(index["tensors"]["w"]["pieces"][0]["elements"], json({0, 12}));

  // Rows [1, 3) as a box, and elements [2, 5) of it held flat.
  parallel::ParameterRegistry part;
  Parameter p = Parameter::Dense("w", Tensor::Zeros({3}, DType::kF32), Tensor::Zeros({3}, DType::kF32), true);
  p.global_shape = {4, 3};
  p.offset = {1, 0};
  p.flat_value = true;
  p.box_shape = {2, 3};
  p.flat_begin = 2;
  p.flat_end = 5;
  part.Add(p);
  ASSERT_TRUE(checkpoint::LoadCheckpoint(dir_.string(), part, nullptr, *world_).ok());
  const Tensor& got = part.params()[0].value;
  for (int64_t k = 0; k < 3; ++k) {
    ASSERT_TRUE(SameElement(got, k, w1, GlobalFlat({4, 3}, {1, 0}, {2, 3}, k + 2))) << k;
  }
}

TEST(CheckpointIndexTest, FileNamesAndStoredShapes) {
  EXPECT_EQ(checkpoint::PieceFileName(checkpoint::kModelTensors, 3, 8), "model-00003-of-00008.safetensors");
  EXPECT_EQ(checkpoint::PieceFileName(checkpoint::kOptimizerTensors, 0, 2), "optimizer-00000-of-00002.safetensors");
  EXPECT_EQ(checkpoint::PieceFileName(checkpoint::kModelTensors, 0, 1), "model.safetensors");
  EXPECT_EQ(checkpoint::PieceFileName(checkpoint::kOptimizerTensors, 0, 1), "optimizer.safetensors");
  EXPECT_EQ(checkpoint::StoredShape(checkpoint::BoxPiece({0, 2}, {4, 2})), (Shape{4, 2}));
  EXPECT_EQ(checkpoint::StoredShape(checkpoint::Piece{{0, 2}, {4, 2}, 1, 6}), Shape{5});
  EXPECT_EQ(checkpoint::StoredShape(checkpoint::BoxPiece({}, {})), Shape{});
}

// The index text a plan gives parses back into the same pieces.
TEST(CheckpointIndexTest, TheIndexOfAPlanParsesBack) {
  std::vector<checkpoint::SaveItem> plan = {
      {checkpoint::kModelTensors, "a", DType::kF32, {4, 2}, {{0, 0, checkpoint::BoxPiece({0, 0}, {2, 2})}, {1, 0, checkpoint::BoxPiece({2, 0}, {2, 2})}}},
      {checkpoint::kModelTensors, "e", DType::kBF16, {3}, {{1, 1, checkpoint::BoxPiece({0}, {3})}}},
      {checkpoint::kOptimizerTensors, "optimizer.m.a", DType::kF32, {4, 2},
       {{0, 2, checkpoint::Piece{{0, 0}, {4, 2}, 0, 3}}, {1, 2, checkpoint::Piece{{0, 0}, {4, 2}, 3, 8}}}},
      {checkpoint::kOptimizerTensors, "optimizer.step", DType::kI64, {}, {{0, 3, checkpoint::BoxPiece({}, {})}}}};
  const std::string text = checkpoint::IndexText(plan, 2);
  auto index = checkpoint::ParseIndex(text, "i.json", checkpoint::kCheckpointFormatVersion);
  ASSERT_TRUE(index.ok()) << index.status() << "\n" << text;
  EXPECT_EQ(index->total_size, 8 * 4 + 3 * 2);
  EXPECT_EQ(index->weight_map, (std::map<std::string, std::string>{{"e", "model-00001-of-00002.safetensors"}}))
      << "only model tensors stored whole in one file";
  ASSERT_EQ(index->tensors.size(), plan.size());
  for (const checkpoint::SaveItem& item : plan) {
    SCOPED_TRACE(item.name);
    const checkpoint::IndexTensor& t = index->tensors.at(item.name);
    EXPECT_EQ(t.file, item.file);
    EXPECT_EQ(t.dtype, item.dtype);
    EXPECT_EQ(t.global, item.global);
    ASSERT_EQ(t.pieces.size(), item.pieces.size());
    for (size_t i = 0; i < item.pieces.size(); ++i) {
      EXPECT_EQ(t.pieces[i].piece, item.pieces[i].piece);
      EXPECT_EQ(t.pieces[i].file, checkpoint::PieceFileName(item.file, item.pieces[i].rank, 2));
    }
  }
  EXPECT_EQ(index->by_file.at("optimizer-00001-of-00002.safetensors"),
            (std::vector<std::pair<std::string, int>>{{"optimizer.m.a", 1}}));
  // Refusals: a kind, a dtype, a shape.
  json j = json::parse(text);
  j["tensors"]["a"]["kind"] = "gradient";
  EXPECT_NE(checkpoint::ParseIndex(j.dump(), "i.json", 2).status().message().find(
                "i.json: tensor 'a': kind is not \"model\" or \"optimizer\""),
            std::string::npos);
  j = json::parse(text);
  j["tensors"]["a"]["dtype"] = "Q7";
  EXPECT_NE(checkpoint::ParseIndex(j.dump(), "i.json", 2).status().message().find(
                "i.json: tensor 'a': unsupported safetensors dtype 'Q7'"),
            std::string::npos);
  j = json::parse(text);
  j["tensors"]["a"]["shape"] = {4, -2};
  EXPECT_NE(checkpoint::ParseIndex(j.dump(), "i.json", 2).status().message().find("tensor 'a': a bad shape"),
            std::string::npos);
  j = json::parse(text);
  j["tensors"]["a"]["shape"] = {uint64_t{1} << 40, uint64_t{1} << 40};
  EXPECT_NE(checkpoint::ParseIndex(j.dump(), "i.json", 2).status().message().find("tensor 'a': a bad shape"),
            std::string::npos)
      << "a shape whose product overflows";
  EXPECT_EQ(checkpoint::ParseIndex("[1]", "i.json", 2).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace switchyard::train
