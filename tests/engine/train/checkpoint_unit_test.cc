// Checkpoints in one process (a local communicator; runs in builds without MPI too): step
// directory names, `latest`, a newer format, a corrupt trainer state, an index that
// disagrees with its file, and a leftover temporary directory that nothing reads. The
// layout cases run under mpirun in tests/dist/checkpoint_test.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/train/checkpoint.h"

namespace switchyard::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

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
    return SaveCheckpoint(dir_.string(), step,
                          {.params = &params_,
                           .optimizer_state = optimizer_,
                           .trainer_state_json = R"({"rng": {"seed": 5}})",
                           .config_yaml = "x: 1\n"},
                          *world_, *dist::Mesh::Create(1, {}));
  }
  Status Load(const std::string& path) {
    return LoadCheckpoint(path, params_, &optimizer_, *world_).status();
  }
  std::string Step(int64_t step) { return (dir_ / StepDirName(step)).string(); }

  fs::path dir_;
  std::unique_ptr<dist::Communicator> world_;
  parallel::ParameterRegistry params_;
  std::vector<parallel::Parameter> optimizer_;
};

TEST_F(CheckpointUnitTest, StepDirectoryNames) {
  EXPECT_EQ(StepDirName(0), "step-00000000");
  EXPECT_EQ(StepDirName(1234), "step-00001234");
  EXPECT_EQ(StepDirName(123456789), "step-123456789");
}

TEST_F(CheckpointUnitTest, RoundTripsInOneProcess) {
  ASSERT_TRUE(Save(4).ok());
  params_.params()[0].value.SetZero();
  optimizer_[0].value.SetZero();
  auto loaded = LoadCheckpoint(dir_.string(), params_, &optimizer_, *world_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(params_.params()[0].value.ToVector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(optimizer_[0].value.ToVector<int64_t>()[0], 12);
  EXPECT_EQ(loaded->step, 4);
  EXPECT_EQ(json::parse(loaded->trainer_state_json)["rng"]["seed"], 5);
  EXPECT_EQ(loaded->config_yaml, "x: 1\n");
  // Without the optimizer: only the model is read.
  EXPECT_TRUE(LoadCheckpoint(Step(4), params_, nullptr, *world_).ok());
}

TEST_F(CheckpointUnitTest, LatestMustNameAStepDirectory) {
  auto none = LatestCheckpoint(dir_.string());
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  ASSERT_TRUE(Save(1).ok());
  WriteText((dir_ / "latest").string(), "../elsewhere\n");
  auto bad = LatestCheckpoint(dir_.string());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << bad.status();
  Status s = Load(dir_.string());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("expected a step directory name"), std::string::npos) << s;
}

TEST_F(CheckpointUnitTest, ANewerFormatIsRefused) {
  ASSERT_TRUE(Save(1).ok());
  const std::string path = Step(1) + "/trainer_state.json";
  json state = json::parse(ReadText(path));
  state["format_version"] = kCheckpointFormatVersion + 1;
  WriteText(path, state.dump());
  Status s = Load(Step(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("this build reads up to"), std::string::npos) << s;
  WriteText(path, "{not json");
  s = Load(Step(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

TEST_F(CheckpointUnitTest, AnIndexThatDisagreesWithItsFileIsCorrupt) {
  ASSERT_TRUE(Save(1).ok());
  const std::string path = Step(1) + "/model.safetensors.index.json";
  const std::string good = ReadText(path);
  json index = json::parse(good);
  index["metadata"]["total_size"] = 1;
  WriteText(path, index.dump());
  Status s = Load(Step(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("total_size 1 but the tensors hold 36 bytes"), std::string::npos) << s;
  index = json::parse(good);
  index["weight_map"].erase("w");
  WriteText(path, index.dump());
  s = Load(Step(1));
  EXPECT_NE(s.message().find("holds 'w', which model.safetensors.index.json does not list"),
            std::string::npos)
      << s;
  index = json::parse(good);
  index["weight_map"]["v"] = "model.safetensors";
  WriteText(path, index.dump());
  s = Load(Step(1));
  EXPECT_NE(s.message().find("lists 'v' in model.safetensors, which does not hold it"),
            std::string::npos)
      << s;
}

TEST_F(CheckpointUnitTest, ALeftoverTemporaryDirectoryIsNeverLoaded) {
  ASSERT_TRUE(Save(1).ok());
  fs::copy(Step(1), dir_ / ".step-00000002.tmp-99");
  auto latest = LatestCheckpoint(dir_.string());
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

}  // namespace
}  // namespace switchyard::train
