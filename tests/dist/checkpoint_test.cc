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
// and total size; each broken checkpoint (missing, no latest, partial, truncated,
// mismatched) gives its own error, the same on every rank, changes no value and leaves the
// good checkpoint loadable; a failed save (an error on any rank) leaves the previous step
// and `latest` as they were; saving a step again replaces it.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/safetensors.h"
#include "engine/dist/mesh.h"
#include "engine/dist/process.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/index.h"

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

// ZeRO on top of a layout: the c replicas of a box (the ranks holding the same box) split
// its elements into `ways` near-equal ranges (0: no split; -1: c ways), replica i taking
// range i % ways, so replicas i and i + ways hold the same range. `flat`: values hold only
// the range (flat_value), else the whole box with the range owned (flat_begin/flat_end).
struct Zero {
  int ways = 0;
  bool flat = true;
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

// The global flat index of local element j of parameter p's value (element flat_begin + j
// of its box when the value is flat).
int64_t GlobalIndex(const Parameter& p, int64_t j) {
  const Shape& local = p.BoxShape();
  int64_t g = 0, rest = j + (p.flat_value ? p.flat_begin : 0);
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

// The box of spec s that holding h holds: its offset (per dim) and size.
std::pair<std::vector<int64_t>, Shape> BoxOf(const Spec& s, const Holding& h) {
  Shape local = s.global;
  std::vector<int64_t> offset(s.global.size(), 0);
  if (s.ep_dim >= 0) local[s.ep_dim] /= h.ep;
  if (s.etp_dim >= 0) local[s.etp_dim] /= h.etp;
  if (s.ep_dim >= 0) offset[s.ep_dim] = h.ep_index * local[s.ep_dim];
  if (s.etp_dim >= 0) offset[s.etp_dim] = h.etp_index * local[s.etp_dim];
  return {offset, local};
}

// Which replica of its box rank `me` is (among every rank's holdings), and how many there are.
std::pair<int, int> ReplicaOf(const Spec& s, const std::vector<Holding>& all, int me) {
  int index = 0, count = 0;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    if (all[r].stage != all[me].stage || BoxOf(s, all[r]) != BoxOf(s, all[me])) continue;
    if (r == me) index = count;
    ++count;
  }
  return {index, count};
}

Parameter MakeParameter(const Spec& s, const std::vector<Holding>& all, int me, uint32_t salt,
                        bool zero, Zero z) {
  const auto [offset, local] = BoxOf(s, all[me]);
  Tensor value = Tensor::Zeros(local, s.dtype);
  Tensor grad = s.trainable ? Tensor::Zeros(local, s.dtype) : Tensor();
  Parameter p = s.ep_dim >= 0 && s.etp_dim >= 0
                    ? Parameter::Expert(s.name, value, grad, s.trainable)
                    : Parameter::Dense(s.name, value, grad, s.trainable);
  // One box: [ep_index * n, +n) along ep_dim and [etp_index * m, +m) along etp_dim.
  if (s.ep_dim >= 0) p.Split(s.ep_dim, offset[s.ep_dim], s.global[s.ep_dim]);
  if (s.etp_dim >= 0) p.Split(s.etp_dim, offset[s.etp_dim], s.global[s.etp_dim]);
  if (!zero) {
    if (s.dtype == DType::kI64) {
      p.value.data<int64_t>()[0] = 100 + salt;
    } else {
      uint32_t* v = static_cast<uint32_t*>(p.value.raw_data());
      for (int64_t j = 0; j < p.value.numel(); ++j) v[j] = Bits(s.name, GlobalIndex(p, j), salt);
    }
  }
  if (z.ways == 0) return p;
  const auto [replica, replicas] = ReplicaOf(s, all, me);
  const int ways = z.ways < 0 ? replicas : z.ways;
  SY_CHECK_EQ(replicas % ways, 0) << s.name << ": " << ways << " ways over " << replicas;
  const int64_t n = NumElements(local), k = replica % ways;
  p.flat_begin = k * n / ways;
  p.flat_end = (k + 1) * n / ways;
  if (z.flat) {
    p.value = p.value.Reshape({n}).View({p.flat_end - p.flat_begin}, p.flat_begin).Clone();
    if (p.trainable) p.grad = Tensor::Zeros(p.value.shape(), s.dtype);
    p.flat_value = true;
    p.box_shape = local;
  }
  p.CheckConsistent();
  return p;
}

// The model as rank `me` holds it among `all` ranks' holdings; `zero` leaves every value 0
// (a load target). `edit` changes the specs first (the error cases).
Model MakeModel(const std::vector<Holding>& all, int me, uint32_t salt, bool zero = false,
                const std::function<void(std::vector<Spec>&)>& edit = {}, Zero z = {}) {
  std::vector<Spec> specs = Specs(all[me].stages, all[me].stage);
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
    Parameter p = MakeParameter(s, all, me, salt, zero, z);
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

// The model as `h` holds it, without ZeRO.
Model MakeModel(const Holding& h, uint32_t salt, bool zero = false,
                const std::function<void(std::vector<Spec>&)>& edit = {}) {
  return MakeModel(std::vector<Holding>{h}, 0, salt, zero, edit);
}

// Every value of `m` holds the bits MakeModel(.., salt) gives it.
void ExpectModel(const Model& m, uint32_t salt, const std::string& what) {
  std::vector<const Parameter*> all;
  for (const Parameter& p : m.params.params()) all.push_back(&p);
  for (const Parameter& p : m.optimizer) all.push_back(&p);
  for (const Parameter* p : all) {
    if (p->value.dtype() == DType::kI64) {
      if (p->value.numel() > 0) {
        EXPECT_EQ(p->value.data<int64_t>()[0], 100 + salt) << what << ": " << p->name;
      }
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

// Every tensor of one kind ("model" or "optimizer") of a step directory, assembled whole
// from the index's pieces element by element: a reader written from docs/checkpoints.md
// that shares no code with the loader. Files are read whole with ReadSafetensors.
std::map<std::string, Tensor> Assemble(const std::string& dir, const std::string& kind) {
  const json index = json::parse(ReadText((fs::path(dir) / checkpoint::kModelIndexFile).string()));
  std::map<std::string, SafetensorsFile> files;
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : index["tensors"].items()) {
    if (t["kind"] != kind) continue;
    const Shape global = t["shape"].get<Shape>();
    Tensor whole = Tensor::Zeros(global, *ParseSafetensorsDType(t["dtype"].get<std::string>()));
    const size_t elem = SizeOf(whole.dtype());
    for (const json& piece : t["pieces"]) {
      const std::string file = piece["file"].get<std::string>();
      if (!files.count(file)) {
        auto read = ReadSafetensors((fs::path(dir) / file).string());
        SY_CHECK_OK(read.status());
        files[file] = *std::move(read);
      }
      const Tensor& data = files[file].tensors.at(name);
      const std::vector<int64_t> offset = piece["offset"].get<std::vector<int64_t>>();
      const Shape box = piece["box"].get<Shape>();
      const int64_t begin = piece["elements"][0].get<int64_t>();
      const int64_t end = piece["elements"][1].get<int64_t>();
      SY_CHECK_EQ(data.numel(), end - begin) << name << " in " << file;
      for (int64_t k = begin; k < end; ++k) {
        int64_t g = 0, rest = k, stride = 1;
        for (int d = static_cast<int>(box.size()) - 1; d >= 0; --d) {
          g += (rest % box[d] + offset[d]) * stride;
          rest /= box[d];
          stride *= global[d];
        }
        std::memcpy(static_cast<char*>(whole.raw_data()) + g * elem,
                    static_cast<const char*>(data.raw_data()) + (k - begin) * elem, elem);
      }
    }
    out.emplace(name, std::move(whole));
  }
  return out;
}

// Two checkpoints hold the same tensors, bit for bit, however their pieces are cut.
void ExpectSameTensors(const std::string& a, const std::string& b, const std::string& what) {
  for (const char* kind : {"model", "optimizer"}) {
    const auto ta = Assemble(a, kind), tb = Assemble(b, kind);
    ASSERT_EQ(ta.size(), tb.size()) << what << ": " << kind;
    for (const auto& [name, t] : ta) {
      ASSERT_TRUE(tb.count(name)) << what << ": " << name;
      const Tensor& u = tb.at(name);
      EXPECT_EQ(t.shape(), u.shape()) << what << ": " << name;
      EXPECT_EQ(t.dtype(), u.dtype()) << what << ": " << name;
      EXPECT_TRUE(t.nbytes() == u.nbytes() &&
                  std::memcmp(t.raw_data(), u.raw_data(), t.nbytes()) == 0)
          << what << ": " << name << " differs";
    }
  }
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
  // This rank's model under `sizes` with ZeRO `z` over the replicas of every box.
  Model ZeroModel(dist::MeshSizes sizes, uint32_t salt, bool zero, Zero z) {
    const dist::Mesh mesh = MakeMesh(sizes);
    std::vector<Holding> all;
    for (int r = 0; r < R_; ++r) all.push_back(HoldingOf(mesh, r));
    return MakeModel(all, me_, salt, zero, {}, z);
  }
  // The step directory `step` of dir_.
  std::string StepPath(int64_t step) { return (fs::path(dir_) / checkpoint::StepDirName(step)).string(); }
  // The file rank r writes for `file` (kModelTensors or kOptimizerTensors) in this world.
  std::string FileOf(int file, int r) { return checkpoint::PieceFileName(file, r, R_); }

  Status Save(const std::string& out, int64_t step, const Model& m, dist::MeshSizes sizes,
              const std::string& trainer = R"({"tokens_seen": 4096})",
              const std::string& config = "model:\n  d_model: 4\n") {
    return checkpoint::SaveCheckpoint(out, step,
                          {.params = &m.params,
                           .optimizer_state = m.optimizer,
                           .trainer_state_json = trainer,
                           .config_yaml = config},
                          *world_, MakeMesh(sizes));
  }
  StatusOr<checkpoint::LoadedCheckpoint> Load(const std::string& path, Model& m) {
    return checkpoint::LoadCheckpoint(path, m.params, &m.optimizer, *world_);
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
    EXPECT_NE(s.message().find(FileOf(checkpoint::kModelTensors, R_ - 1) + ".tmp."), std::string::npos) << s;
    EXPECT_NE(s.message().find("write failed"), std::string::npos) << s;
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
}  // namespace switchyard::train
