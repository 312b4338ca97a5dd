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
// Also: trainer state and config round trip; `latest` names the newest step; the index
// lists every tensor with its total size; each broken checkpoint (missing, no latest,
// partial, truncated, mismatched) gives its own error, the same on every rank, changes no
// value and leaves the good checkpoint loadable; a failed save leaves the previous step and
// `latest` as they were; saving a step again replaces it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/safetensors.h"
#include "engine/dist/mesh.h"
#include "engine/dist/process.h"
#include "engine/train/checkpoint.h"

namespace switchyard::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using parallel::Parameter;
using parallel::ParameterRegistry;

constexpr int64_t kExperts = 8, kD = 4, kF = 6, kVocab = 16, kLayers = 2;

// How one rank holds the model: its ep and etp indices (its box) and its pipeline stage.
struct Holding {
  int ep = 1, ep_index = 0;
  int stages = 1, stage = 0;
  int etp = 1, etp_index = 0;
};

Holding HoldingOf(const dist::Mesh& mesh, int rank) {
  const dist::PipelineNeighbors pipe = mesh.PipelineOf(rank);
  return {mesh.ep(), mesh.Coord(rank, dist::View::kExpert, dist::Axis::kEp), pipe.num_stages,
          pipe.stage, mesh.etp(), mesh.Coord(rank, dist::View::kExpert, dist::Axis::kTp)};
}

struct Spec {
  std::string name;
  Shape global;
  int ep_dim = -1;   // split over the ep group along this dim
  int etp_dim = -1;  // split over the etp group along this dim (experts' hidden dim)
  bool trainable = true;
  DType dtype = DType::kF32;
};

// The parameters that stage `stage` of `stages` holds.
std::vector<Spec> Specs(int stages, int stage) {
  std::vector<Spec> out;
  if (stage == 0) out.push_back({"embed.weight", {kVocab, kD}});
  for (int64_t l = 0; l < kLayers; ++l) {
    if (l * stages / kLayers != stage) continue;
    const std::string p = "layers." + std::to_string(l) + ".";
    out.push_back({p + "norm.weight", {kD}});
    out.push_back({p + "moe.router.weight", {kExperts, kD}});
    out.push_back({p + "moe.expert_bias", {kExperts}, -1, -1, false});
    out.push_back({p + "moe.experts.w1", {kExperts, kD, kF}, 0, 2});
    out.push_back({p + "moe.experts.b1", {kExperts, kF}, 0, 1});
    out.push_back({p + "moe.experts.w2", {kExperts, kF, kD}, 0, 1});
  }
  if (stage == stages - 1) out.push_back({"lm_head.weight", {kD, kVocab}, 1});
  return out;
}

uint32_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return static_cast<uint32_t>(x ^ (x >> 33));
}

// The bits of element `global_index` of `name` (any pattern, NaNs included).
uint32_t Bits(const std::string& name, int64_t global_index, uint32_t salt) {
  return Mix(std::hash<std::string>{}(name) ^ (uint64_t(global_index) << 20) ^ salt);
}

// The global flat index of local element j of parameter p's box.
int64_t GlobalIndex(const Parameter& p, int64_t j) {
  const Shape& local = p.value.shape();
  int64_t g = 0, rest = j;
  std::vector<int64_t> idx(local.size());
  for (int d = static_cast<int>(local.size()) - 1; d >= 0; --d) {
    idx[d] = rest % local[d];
    rest /= local[d];
  }
  for (size_t d = 0; d < local.size(); ++d) {
    g = g * p.global_shape[d] + idx[d] + p.OffsetAt(static_cast<int>(d));
  }
  return g;
}

struct Model {
  ParameterRegistry params;
  std::vector<Parameter> optimizer;
};

Parameter MakeParameter(const Spec& s, const Holding& h, uint32_t salt, bool zero) {
  Shape local = s.global;
  if (s.ep_dim >= 0) local[s.ep_dim] /= h.ep;
  if (s.etp_dim >= 0) local[s.etp_dim] /= h.etp;
  Tensor value = Tensor::Zeros(local, s.dtype);
  Tensor grad = s.trainable ? Tensor::Zeros(local, s.dtype) : Tensor();
  Parameter p = s.ep_dim >= 0 && s.etp_dim >= 0
                    ? Parameter::Expert(s.name, value, grad, s.trainable)
                    : Parameter::Dense(s.name, value, grad, s.trainable);
  // One box: [ep_index * n, +n) along ep_dim and [etp_index * m, +m) along etp_dim.
  if (s.ep_dim >= 0) p.Split(s.ep_dim, h.ep_index * local[s.ep_dim], s.global[s.ep_dim]);
  if (s.etp_dim >= 0) p.Split(s.etp_dim, h.etp_index * local[s.etp_dim], s.global[s.etp_dim]);
  if (!zero) {
    if (s.dtype == DType::kI64) {
      p.value.data<int64_t>()[0] = 100 + salt;
    } else {
      uint32_t* v = static_cast<uint32_t*>(p.value.raw_data());
      for (int64_t j = 0; j < p.value.numel(); ++j) v[j] = Bits(s.name, GlobalIndex(p, j), salt);
    }
  }
  return p;
}

// The model as `h` holds it; `zero` leaves every value 0 (a load target). `edit` changes the
// specs first (the error cases).
Model MakeModel(const Holding& h, uint32_t salt, bool zero = false,
                const std::function<void(std::vector<Spec>&)>& edit = {}) {
  std::vector<Spec> specs = Specs(h.stages, h.stage);
  std::vector<Spec> state;
  for (const Spec& s : specs) {
    if (!s.trainable) continue;
    for (const char* kind : {"exp_avg", "exp_avg_sq"}) {
      Spec o = s;
      o.name = std::string("optimizer.") + kind + "." + s.name;
      o.trainable = false;
      state.push_back(o);
    }
  }
  state.push_back({"optimizer.step", {}, -1, -1, false, DType::kI64});
  specs.insert(specs.end(), state.begin(), state.end());
  if (edit) edit(specs);
  Model m;
  for (const Spec& s : specs) {
    Parameter p = MakeParameter(s, h, salt, zero);
    if (s.name.rfind("optimizer.", 0) == 0) {
      p.trainable = false;
      p.grad = Tensor();
      m.optimizer.push_back(std::move(p));
    } else {
      m.params.Add(std::move(p));
    }
  }
  return m;
}

// Every value of `m` holds the bits MakeModel(.., salt) gives it.
void ExpectModel(const Model& m, uint32_t salt, const std::string& what) {
  std::vector<const Parameter*> all;
  for (const Parameter& p : m.params.params()) all.push_back(&p);
  for (const Parameter& p : m.optimizer) all.push_back(&p);
  for (const Parameter* p : all) {
    if (p->value.dtype() == DType::kI64) {
      EXPECT_EQ(p->value.data<int64_t>()[0], 100 + salt) << what << ": " << p->name;
      continue;
    }
    const uint32_t* v = static_cast<const uint32_t*>(p->value.raw_data());
    int64_t bad = 0;
    for (int64_t j = 0; j < p->value.numel(); ++j) {
      const uint32_t want = Bits(p->name, GlobalIndex(*p, j), salt);
      if (v[j] != want && bad++ == 0) {
        ADD_FAILURE() << what << ": " << p->name << "[" << j << "] bits " << std::hex << v[j]
                      << ", want " << want;
      }
    }
    EXPECT_EQ(bad, 0) << what << ": " << p->name << ": " << bad << " wrong elements";
  }
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    world_ = dist::WorldCommunicator();
    R_ = world_->size();
    me_ = world_->rank();
    // One directory for every rank: rank 0's pid names it.
    Tensor pid = Tensor::FromVector<int64_t>({static_cast<int64_t>(::getpid())}, {1});
    world_->Broadcast(pid, 0);
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = (fs::path(::testing::TempDir()) /
            ("sy_ckpt_" + std::to_string(pid.ToVector<int64_t>()[0]) + "_" + info->name()))
               .string();
    if (me_ == 0) fs::remove_all(dir_);
    world_->Barrier();
  }
  void TearDown() override {
    world_->Barrier();
    if (me_ == 0) fs::remove_all(dir_);
  }

  dist::Mesh MakeMesh(dist::MeshSizes sizes) {
    auto mesh = dist::Mesh::Create(R_, sizes);
    SY_CHECK_OK(mesh.status());
    return *mesh;
  }
  Holding HoldingFor(dist::MeshSizes sizes) { return HoldingOf(MakeMesh(sizes), me_); }

  Status Save(const std::string& out, int64_t step, const Model& m, dist::MeshSizes sizes,
              const std::string& trainer = R"({"tokens_seen": 4096})",
              const std::string& config = "model:\n  d_model: 4\n") {
    return SaveCheckpoint(out, step,
                          {.params = &m.params,
                           .optimizer_state = m.optimizer,
                           .trainer_state_json = trainer,
                           .config_yaml = config},
                          *world_, MakeMesh(sizes));
  }
  StatusOr<LoadedCheckpoint> Load(const std::string& path, Model& m) {
    return LoadCheckpoint(path, m.params, &m.optimizer, *world_);
  }

  // Rank 0's text on every rank.
  std::string FromRank0(std::string text) {
    Tensor len = Tensor::FromVector<int64_t>({static_cast<int64_t>(text.size())}, {1});
    world_->Broadcast(len, 0);
    text.resize(len.ToVector<int64_t>()[0]);
    if (!text.empty()) {
      Tensor bytes = Tensor::Empty({static_cast<int64_t>(text.size())}, DType::kU8);
      std::memcpy(bytes.raw_data(), text.data(), text.size());
      world_->Broadcast(bytes, 0);
      std::memcpy(text.data(), bytes.raw_data(), text.size());
    }
    return text;
  }

  // The load fails with `code` and a message containing `needle`, the same on every rank,
  // and changes nothing in `m` (a zero target).
  void ExpectLoadError(const std::string& path, Model& m, absl::StatusCode code,
                       const std::string& needle) {
    auto loaded = Load(path, m);
    const std::string message = loaded.ok() ? "(ok)" : std::string(loaded.status().message());
    EXPECT_EQ(message, FromRank0(message)) << "the error differs between ranks";
    EXPECT_FALSE(loaded.ok()) << path;
    if (loaded.ok()) return;
    EXPECT_EQ(loaded.status().code(), code) << loaded.status();
    EXPECT_NE(message.find(needle), std::string::npos)
        << "'" << message << "' does not mention '" << needle << "'";
    if (me_ == 0) std::printf("    error: %s\n", message.c_str());
    for (const Parameter& p : m.params.params()) {
      const Tensor zero = Tensor::Zeros(p.value.shape(), p.value.dtype());
      EXPECT_EQ(std::memcmp(p.value.raw_data(), zero.raw_data(), p.value.nbytes()), 0)
          << p.name << " was changed by a failed load";
    }
  }

  // Files and directories directly under `dir`.
  std::vector<std::string> Listing(const std::string& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

  std::unique_ptr<dist::Communicator> world_;
  int R_ = 1, me_ = 0;
  std::string dir_;
};

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
  EXPECT_EQ(state["format_version"], kCheckpointFormatVersion);
  EXPECT_TRUE(state.contains("switchyard_version"));
  EXPECT_EQ(state["layout"]["ep"], R_);

  // The files hold whole tensors: what a one-rank reader sees.
  auto file = ReadSafetensors((fs::path(loaded->dir) / kModelFile).string());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->tensors.at("layers.0.moe.experts.w1").shape(), (Shape{kExperts, kD, kF}));
  EXPECT_EQ(file->tensors.at("lm_head.weight").shape(), (Shape{kD, kVocab}));
  EXPECT_EQ(file->metadata.at("format"), "pt");
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
// ep 2 x etp 2) save as whole tensors, the same bytes a whole model writes, and load under
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

  // The files are those a save of the whole model writes, byte for byte.
  const std::string whole_dir = (fs::path(dir_) / "whole").string();
  ASSERT_TRUE(Save(whole_dir, 7, MakeModel(HoldingFor({.ep = 1}), 11), {.ep = 1}).ok());
  if (me_ == 0) {
    for (const char* f : {kModelFile, kOptimizerFile, kModelIndexFile}) {
      EXPECT_EQ(ReadText((fs::path(dir_) / "step-00000007" / f).string()),
                ReadText((fs::path(whole_dir) / "step-00000007" / f).string()))
          << f << " saved under " << name << " differs from the whole model's";
    }
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
  // Saving what was loaded, under another layout, writes the same bytes.
  Model half = MakeModel(HoldingFor({.ep = std::max(1, R_ / 2)}), 0, true);
  ASSERT_TRUE(Load(dir_, half).ok());
  const std::string again = (fs::path(dir_) / "again").string();
  ASSERT_TRUE(Save(again, 1, half, {.ep = std::max(1, R_ / 2)}).ok());
  if (me_ == 0) {
    for (const char* f : {kModelFile, kOptimizerFile, kModelIndexFile}) {
      EXPECT_EQ(ReadText((fs::path(dir_) / "step-00000001" / f).string()),
                ReadText((fs::path(again) / "step-00000001" / f).string()))
          << f;
    }
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
  auto none = LatestCheckpoint(dir_);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  world_->Barrier();
  ASSERT_TRUE(Save(dir_, 1, m, {.ep = R_}).ok());
  ASSERT_TRUE(Save(dir_, 2, m, {.ep = R_}).ok());
  auto latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_TRUE(latest->has_value());
  EXPECT_EQ(**latest, (fs::path(dir_) / "step-00000002").string());
  EXPECT_EQ(ReadText((fs::path(dir_) / kLatestFile).string()), "step-00000002\n");
  EXPECT_EQ(Listing(dir_), (std::vector<std::string>{"latest", "step-00000001", "step-00000002"}));
  EXPECT_EQ(Listing(**latest), (std::vector<std::string>{kConfigFile, kModelFile, kModelIndexFile,
                                                         kOptimizerFile, kTrainerStateFile}));

  json index = json::parse(ReadText((fs::path(**latest) / kModelIndexFile).string()));
  auto file = ReadSafetensors((fs::path(**latest) / kModelFile).string());
  ASSERT_TRUE(file.ok()) << file.status();
  const Model whole = MakeModel(HoldingFor({.ep = 1}), 0, true);
  uint64_t total = 0;
  for (const Parameter& p : whole.params.params()) {
    EXPECT_EQ(index["weight_map"].value(p.name, ""), kModelFile) << p.name;
    total += NumElements(p.global_shape) * SizeOf(p.value.dtype());
  }
  EXPECT_EQ(index["weight_map"].size(), whole.params.params().size());
  EXPECT_EQ(file->tensors.size(), whole.params.params().size());
  EXPECT_EQ(index["metadata"]["total_size"], total);
  auto optim = ReadSafetensors((fs::path(**latest) / kOptimizerFile).string());
  ASSERT_TRUE(optim.ok()) << optim.status();
  EXPECT_EQ(optim->tensors.size(), whole.optimizer.size());
  EXPECT_EQ(optim->tensors.at("optimizer.step").shape(), Shape{});
}

TEST_F(CheckpointTest, BrokenCheckpointsGiveTheirErrorAndTheGoodOneStillLoads) {
  const Model m = MakeModel(HoldingFor({.ep = R_}), 6);
  const std::string out = (fs::path(dir_) / "out").string();
  ASSERT_TRUE(Save(out, 7, m, {.ep = R_}).ok());
  const std::string good = (fs::path(out) / "step-00000007").string();
  const std::string good_bytes = ReadText((fs::path(good) / kModelFile).string());
  auto path = [&](const std::string& name) { return (fs::path(dir_) / name).string(); };
  if (me_ == 0) {
    // An out dir with a step directory but no `latest`.
    fs::create_directories(path("no_latest"));
    fs::copy(good, path("no_latest/step-00000007"));
    // The temporary directory of an interrupted save, and a step dir without its index.
    fs::copy(good, path(".step-00000008.tmp-123"));
    fs::copy(good, path("step-00000009"));
    fs::remove(path("step-00000009/") + kModelIndexFile);
    // A truncated model file.
    fs::copy(good, path("cut"));
    fs::resize_file(path("cut/") + kModelFile, good_bytes.size() / 2);
    // An index that names a second file that is not there.
    fs::copy(good, path("missing_file"));
    json index = json::parse(ReadText(path("missing_file/") + kModelIndexFile));
    index["weight_map"]["lm_head.weight"] = "model-00002-of-00002.safetensors";
    WriteText(path("missing_file/") + kModelIndexFile, index.dump());
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
    ExpectLoadError(path("cut"), t, C::kDataLoss, "do not hold f32");
    ExpectLoadError(path("missing_file"), t, C::kFailedPrecondition,
                    "names model-00002-of-00002.safetensors, which is missing");
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
  EXPECT_EQ(ReadText((fs::path(good) / kModelFile).string()), good_bytes);
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

  EXPECT_EQ(Listing(dir_), (std::vector<std::string>{"latest", "step-00000001", "step-00000002"}))
      << "no temporary directory is left behind";
  EXPECT_EQ(ReadText((fs::path(dir_) / kLatestFile).string()), "step-00000001\n");
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

}  // namespace
}  // namespace switchyard::train
