// Checkpoints in one process (a local communicator; runs in builds without MPI too): step
// directory names, `latest`, a newer format, a corrupt trainer state, an index that
// disagrees with its file, and a leftover temporary directory that nothing reads. The
// boxes (engine/train/checkpoint_plan.h): CopyBox out of and into a whole tensor on 0-3
// dims and every dtype, byte for byte; PlanGather over hand-written slice lists (a tensor
// split on two dims at once with replicas, a whole copy preferred, empty boxes ignored)
// and its refusals (boxes that overlap without being equal, boxes that leave a gap, ranks
// that disagree on a dtype); the slice lists' text round trip; LocalSlices' refusals; and
// a whole saved tensor loaded into every box of a 2-dim split. The layout cases run under
// mpirun in tests/dist/checkpoint_test.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/train/checkpoint.h"
#include "engine/train/checkpoint_plan.h"

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

// ---- Boxes -------------------------------------------------------------------------------

// A tensor whose every byte is a function of its index, so that a misplaced element shows.
Tensor Pattern(const Shape& shape, DType dtype, uint8_t salt) {
  Tensor t = Tensor::Empty(shape, dtype);
  auto* bytes = static_cast<uint8_t*>(t.raw_data());
  for (size_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<uint8_t>(i * 131 + salt);
  return t;
}

// The row-major flat index in `global` of element k of the box at `offset` of size `size`.
int64_t GlobalFlat(const Shape& global, const std::vector<int64_t>& offset, const Shape& size,
                   int64_t k) {
  std::vector<int64_t> idx(size.size());
  for (int d = static_cast<int>(size.size()) - 1; d >= 0; --d) {
    idx[d] = k % size[d];
    k /= size[d];
  }
  int64_t g = 0;
  for (size_t d = 0; d < size.size(); ++d) {
    g = g * global[d] + idx[d] + (offset.empty() ? 0 : offset[d]);
  }
  return g;
}

// Element k of t and element j of u hold the same bytes.
bool SameElement(const Tensor& t, int64_t k, const Tensor& u, int64_t j) {
  const size_t e = SizeOf(t.dtype());
  return std::memcmp(static_cast<const char*>(t.raw_data()) + k * e,
                     static_cast<const char*>(u.raw_data()) + j * e, e) == 0;
}

struct BoxCase {
  Shape global;
  std::vector<int64_t> offset;  // empty: all zero
  Shape size;
};

TEST(CopyBoxTest, CutsAndPastesBoxesOnZeroToThreeDimsByteForByte) {
  const std::vector<BoxCase> cases = {
      {{}, {}, {}},                       // a 0-d scalar
      {{7}, {0}, {7}},                    // whole
      {{7}, {2}, {3}},                    // inside
      {{7}, {6}, {1}},                    // the last element
      {{7}, {3}, {0}},                    // empty
      {{4, 5}, {1, 2}, {2, 3}},           // inside on both dims
      {{4, 5}, {0, 4}, {4, 1}},           // one column
      {{4, 5}, {}, {1, 5}},               // the first row, offsets omitted
      {{3, 4, 6}, {1, 0, 3}, {2, 4, 3}},  // ep on dim 0 and etp on dim 2 at once
      {{3, 4, 6}, {0, 1, 0}, {1, 2, 6}},  // runs whole along the last dim
      {{3, 4, 6}, {2, 3, 5}, {1, 1, 1}},  // one corner element
      {{3, 4, 6}, {0, 0, 0}, {3, 4, 6}},  // whole
  };
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI32, DType::kI64, DType::kU8,
                      DType::kF64}) {
    for (const BoxCase& c : cases) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " box " + ShapeString(c.size) + " of " +
                   ShapeString(c.global));
      const Tensor whole = Pattern(c.global, dtype, 7);
      // Out of the whole tensor: every element from its global place.
      Tensor part = Pattern(c.size, dtype, 99);
      CopyBox(whole, part, c.offset, /*paste=*/false);
      for (int64_t k = 0; k < part.numel(); ++k) {
        ASSERT_TRUE(SameElement(part, k, whole, GlobalFlat(c.global, c.offset, c.size, k)))
            << "element " << k;
      }
      // Back into a zero tensor: the box holds it, everything else stays zero.
      Tensor pasted = Tensor::Zeros(c.global, dtype);
      CopyBox(pasted, part, c.offset, /*paste=*/true);
      std::vector<bool> in_box(pasted.numel(), false);
      for (int64_t k = 0; k < part.numel(); ++k) {
        const int64_t g = GlobalFlat(c.global, c.offset, c.size, k);
        in_box[g] = true;
        ASSERT_TRUE(SameElement(pasted, g, whole, g)) << "global element " << g;
      }
      const Tensor zero = Tensor::Zeros({1}, dtype);
      for (int64_t g = 0; g < pasted.numel(); ++g) {
        if (!in_box[g]) {
          ASSERT_TRUE(SameElement(pasted, g, zero, 0)) << "global element " << g;
        }
      }
    }
  }
}

// A box `size` at `offset` of f32 `global`.
SliceEntry Box(const std::string& name, const Shape& global, std::vector<int64_t> offset,
               const Shape& size, DType dtype = DType::kF32, int file = kModelTensors) {
  return {file, name, dtype, global, std::move(offset), size};
}

TEST(PlanGatherTest, TilesATensorSplitOnTwoDimsFromTheLowestRankOfEachBox) {
  // (E, d, f) = (4, 3, 6) over ep 2 (dim 0) x etp 2 (dim 2), each box on two edp replicas:
  // rank r holds ep index (r / 2) % 2 and etp index r % 2; ranks r and r + 4 hold the same.
  const Shape global = {4, 3, 6};
  std::vector<std::vector<SliceEntry>> per_rank(8);
  for (int r = 0; r < 8; ++r) {
    const int64_t e = (r / 2) % 2, t = r % 2;
    per_rank[r].push_back(Box("experts.w1", global, {2 * e, 0, 3 * t}, {2, 3, 3}));
  }
  auto plan = PlanGather(per_rank);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 1u);
  const GatherItem& item = (*plan)[0];
  EXPECT_EQ(item.name, "experts.w1");
  EXPECT_EQ(item.global, global);
  ASSERT_EQ(item.pieces.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(item.pieces[r].rank, r);
    EXPECT_EQ(item.pieces[r].index, 0);
    EXPECT_EQ(item.pieces[r].offset, (std::vector<int64_t>{2 * ((r / 2) % 2), 0, 3 * (r % 2)}));
    EXPECT_EQ(item.pieces[r].size, (Shape{2, 3, 3}));
  }
}

TEST(PlanGatherTest, AWholeCopyWinsEmptyBoxesAreSkippedAndItemsAreSorted) {
  std::vector<std::vector<SliceEntry>> per_rank(3);
  // "b": a half on rank 0, whole on ranks 1 and 2: rank 1's copy is the one piece.
  per_rank[0].push_back(Box("b", {6}, {0}, {3}));
  per_rank[1].push_back(Box("b", {6}, {0}, {6}));
  per_rank[2].push_back(Box("b", {6}, {0}, {6}));
  // "a": two halves and an empty box (a rank with nothing of it), index 1 on rank 2.
  per_rank[0].push_back(Box("a", {2, 4}, {0, 0}, {2, 2}));
  per_rank[1].push_back(Box("a", {2, 4}, {0, 2}, {2, 0}));
  per_rank[2].push_back(Box("a", {2, 4}, {0, 2}, {2, 2}));
  // An optimizer scalar, and a model tensor that sorts after it by name.
  per_rank[0].push_back(Box("optimizer.step", {}, {}, {}, DType::kI64, kOptimizerTensors));
  per_rank[2].push_back(Box("z", {}, {}, {}));
  auto plan = PlanGather(per_rank);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 4u);
  EXPECT_EQ((*plan)[0].name, "a");
  EXPECT_EQ((*plan)[1].name, "b");
  EXPECT_EQ((*plan)[2].name, "z");
  EXPECT_EQ((*plan)[3].name, "optimizer.step");
  EXPECT_EQ((*plan)[3].file, kOptimizerTensors);
  const auto& a = (*plan)[0].pieces;
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].rank, 0);
  EXPECT_EQ(a[1].rank, 2);
  EXPECT_EQ(a[1].index, 1);
  EXPECT_EQ(a[1].offset, (std::vector<int64_t>{0, 2}));
  const auto& b = (*plan)[1].pieces;
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].rank, 1);
  EXPECT_EQ(b[0].size, Shape{6});
  ASSERT_EQ((*plan)[2].pieces.size(), 1u);
  EXPECT_EQ((*plan)[2].pieces[0].rank, 2);
}

TEST(PlanGatherTest, BoxesThatOverlapWithoutBeingEqualAreRefused) {
  // (4, 6) cut into 2 x 2 boxes by ranks 0 and 2, and one by rank 1 shifted by one row
  // that overlaps both boxes of the first column.
  std::vector<std::vector<SliceEntry>> per_rank(3);
  per_rank[0].push_back(Box("w", {4, 6}, {0, 0}, {2, 3}));
  per_rank[1].push_back(Box("w", {4, 6}, {1, 0}, {2, 3}));
  per_rank[2].push_back(Box("w", {4, 6}, {2, 3}, {2, 3}));
  auto plan = PlanGather(per_rank);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
  EXPECT_NE(plan.status().message().find(
                "the boxes of 'w' held by ranks 0 and 1 overlap without being equal"),
            std::string::npos)
      << plan.status();
  // Overlapping on dim 2 only (etp halves of different widths) is an overlap too.
  per_rank = {{Box("x", {2, 3, 6}, {0, 0, 0}, {2, 3, 4})},
              {Box("x", {2, 3, 6}, {0, 0, 3}, {2, 3, 3})}};
  plan = PlanGather(per_rank);
  EXPECT_NE(plan.status().message().find("'x' held by ranks 0 and 1 overlap"), std::string::npos)
      << plan.status();
}

TEST(PlanGatherTest, BoxesThatLeaveAGapAreRefused) {
  // Diagonal blocks of (4, 4): disjoint, half the elements.
  std::vector<std::vector<SliceEntry>> per_rank = {{Box("w", {4, 4}, {0, 0}, {2, 2})},
                                                   {Box("w", {4, 4}, {2, 2}, {2, 2})}};
  auto plan = PlanGather(per_rank);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
  EXPECT_NE(plan.status().message().find("the boxes of 'w' (4, 4) cover 8 of its 16 elements"),
            std::string::npos)
      << plan.status();
  // Only empty boxes: nothing covered.
  per_rank = {{Box("v", {3}, {0}, {0})}};
  plan = PlanGather(per_rank);
  EXPECT_NE(plan.status().message().find("'v' (3) cover 0 of its 3 elements"), std::string::npos)
      << plan.status();
}

TEST(PlanGatherTest, RanksThatDisagreeOnADtypeOrShapeAreRefused) {
  std::vector<std::vector<SliceEntry>> per_rank = {
      {Box("w", {4}, {0}, {2})}, {Box("w", {4}, {2}, {2}, DType::kBF16)}};
  auto plan = PlanGather(per_rank);
  EXPECT_NE(plan.status().message().find("'w' is f32 (4) on rank 0 but bf16 (4) on rank 1"),
            std::string::npos)
      << plan.status();
  per_rank = {{Box("w", {4}, {0}, {4})}, {Box("w", {2, 2}, {0, 0}, {2, 2})}};
  plan = PlanGather(per_rank);
  EXPECT_NE(plan.status().message().find("'w' is f32 (4) on rank 0 but f32 (2, 2) on rank 1"),
            std::string::npos)
      << plan.status();
}

TEST(SliceListTest, TextRoundTripKeepsEveryField) {
  const std::vector<SliceEntry> entries = {
      Box("experts.w1", {8, 4, 6}, {4, 0, 3}, {4, 4, 3}),
      Box("norm", {4}, {0}, {4}, DType::kBF16),
      Box("optimizer.step", {}, {}, {}, DType::kI64, kOptimizerTensors)};
  const std::vector<SliceEntry> back = DeserializeSlices(SerializeSlices(entries));
  ASSERT_EQ(back.size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_EQ(back[i].file, entries[i].file);
    EXPECT_EQ(back[i].name, entries[i].name);
    EXPECT_EQ(back[i].dtype, entries[i].dtype);
    EXPECT_EQ(back[i].global, entries[i].global);
    EXPECT_EQ(back[i].offset, entries[i].offset);
    EXPECT_EQ(back[i].size, entries[i].size);
  }
  EXPECT_TRUE(DeserializeSlices("").empty());
  EXPECT_TRUE(DeserializeSlices(SerializeSlices({})).empty());
}

TEST(SliceListTest, LocalSlicesListsBoxesAndRefusesWhatIsNotOne) {
  using parallel::Parameter;
  Parameter w = Parameter::Expert("experts.w1", Tensor::Zeros({2, 3, 3}, DType::kF32),
                                  Tensor::Zeros({2, 3, 3}, DType::kF32), true);
  w.Split(0, 2, 4).Split(2, 3, 6);
  Parameter step;
  step.name = "optimizer.step";
  step.trainable = false;
  step.value = Tensor::Zeros({}, DType::kI64);
  auto slices = LocalSlices({w}, {step});
  ASSERT_TRUE(slices.ok()) << slices.status();
  ASSERT_EQ(slices->size(), 2u);
  EXPECT_EQ((*slices)[0].file, kModelTensors);
  EXPECT_EQ((*slices)[0].global, (Shape{4, 3, 6}));
  EXPECT_EQ((*slices)[0].offset, (std::vector<int64_t>{2, 0, 3}));
  EXPECT_EQ((*slices)[0].size, (Shape{2, 3, 3}));
  EXPECT_EQ((*slices)[1].file, kOptimizerTensors);
  EXPECT_EQ((*slices)[1].size, Shape{});

  EXPECT_NE(LocalSlices({w, w}, {}).status().message().find("'experts.w1' is listed twice"),
            std::string::npos);
  Parameter outside = w;
  outside.offset = {3, 0, 3};  // rows [3, 5) of 4
  EXPECT_NE(LocalSlices({outside}, {}).status().message().find(
                "'experts.w1': value (2, 3, 3) is not a box of (4, 3, 6)"),
            std::string::npos)
      << LocalSlices({outside}, {}).status();
  Parameter empty;
  empty.name = "nothing";
  EXPECT_NE(LocalSlices({empty}, {}).status().message().find("'nothing' has no value"),
            std::string::npos);
}

CheckpointContents Contents(const parallel::ParameterRegistry& params) {
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
  ASSERT_TRUE(SaveCheckpoint(dir_.string(), 1, Contents(whole), *world_, one).ok());
  for (int64_t e = 0; e < 2; ++e) {
    for (int64_t t = 0; t < 2; ++t) {
      SCOPED_TRACE("ep index " + std::to_string(e) + ", etp index " + std::to_string(t));
      parallel::ParameterRegistry box;
      Parameter p = Parameter::Expert("experts.w1", Tensor::Zeros({2, 3, 3}, DType::kF32),
                                      Tensor::Zeros({2, 3, 3}, DType::kF32), true);
      p.Split(0, 2 * e, 4).Split(2, 3 * t, 6);
      box.Add(std::move(p));
      auto loaded = LoadCheckpoint(dir_.string(), box, nullptr, *world_);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      const Parameter& got = box.params()[0];
      for (int64_t k = 0; k < got.value.numel(); ++k) {
        ASSERT_TRUE(
            SameElement(got.value, k, w1, GlobalFlat(global, got.offset, {2, 3, 3}, k)))
            << "element " << k;
      }
      // Saving that box alone leaves three quarters of the tensor uncovered.
      Status s = SaveCheckpoint((dir_ / "box").string(), 1, Contents(box), *world_, one);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_NE(s.message().find("the boxes of 'experts.w1' (4, 3, 6) cover 18 of its 72 elements"),
                std::string::npos)
          << s;
      EXPECT_FALSE(fs::exists(dir_ / "box")) << "nothing is written";
    }
  }
}

}  // namespace
}  // namespace switchyard::train
