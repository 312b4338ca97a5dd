// The checkpoint tests' model and fixture (tests/dist/checkpoint_test.cc: layouts and
// sharding; tests/dist/checkpoint_failure_test.cc: broken checkpoints and failed saves). The
// model is built by hand from parameter descriptions (engine/parallel/parameter.h):
// replicated dense parameters, experts (E, d, f) whose box is split over ep along dim 0 and
// over etp along the hidden dim at once, a "column-parallel" weight split over the ep group
// along dim 1, a non-trainable expert bias, two layers that pipeline stages can divide, and
// a fake Adam state (exp_avg, exp_avg_sq in the boxes of their parameter, an i64 step
// scalar). Every element's bits are a hash of (name, global index, salt), so a box in the
// wrong place, a stale value or a rounding shows up as a wrong bit pattern. ZeRO is
// simulated on top of any layout: the replicas of each box split its elements into
// near-equal ranges, held flat (flat_value) or owned (flat_begin/flat_end).
#pragma once

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

namespace switchyard::train::checkpoint_testing {

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

inline Holding HoldingOf(const dist::Mesh& mesh, int rank) {
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
inline std::vector<Spec> Specs(int stages, int stage) {
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

inline uint32_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return static_cast<uint32_t>(x ^ (x >> 33));
}

// The bits of element `global_index` of `name` (any pattern, NaNs included).
inline uint32_t Bits(const std::string& name, int64_t global_index, uint32_t salt) {
  return Mix(std::hash<std::string>{}(name) ^ (uint64_t(global_index) << 20) ^ salt);
}

// The global flat index of local element j of parameter p's value (element flat_begin + j
// of its box when the value is flat).
inline int64_t GlobalIndex(const Parameter& p, int64_t j) {
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
inline std::pair<std::vector<int64_t>, Shape> BoxOf(const Spec& s, const Holding& h) {
  Shape local = s.global;
  std::vector<int64_t> offset(s.global.size(), 0);
  if (s.ep_dim >= 0) local[s.ep_dim] /= h.ep;
  if (s.etp_dim >= 0) local[s.etp_dim] /= h.etp;
  if (s.ep_dim >= 0) offset[s.ep_dim] = h.ep_index * local[s.ep_dim];
  if (s.etp_dim >= 0) offset[s.etp_dim] = h.etp_index * local[s.etp_dim];
  return {offset, local};
}

// Which replica of its box rank `me` is (among every rank's holdings), and how many there are.
inline std::pair<int, int> ReplicaOf(const Spec& s, const std::vector<Holding>& all, int me) {
  int index = 0, count = 0;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    if (all[r].stage != all[me].stage || BoxOf(s, all[r]) != BoxOf(s, all[me])) continue;
    if (r == me) index = count;
    ++count;
  }
  return {index, count};
}

inline Parameter MakeParameter(const Spec& s, const std::vector<Holding>& all, int me, uint32_t salt,
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
inline Model MakeModel(const std::vector<Holding>& all, int me, uint32_t salt, bool zero = false,
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
inline Model MakeModel(const Holding& h, uint32_t salt, bool zero = false,
                const std::function<void(std::vector<Spec>&)>& edit = {}) {
  return MakeModel(std::vector<Holding>{h}, 0, salt, zero, edit);
}

// Every value of `m` holds the bits MakeModel(.., salt) gives it.
inline void ExpectModel(const Model& m, uint32_t salt, const std::string& what) {
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

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Every tensor of one kind ("model" or "optimizer") of a step directory, assembled whole
// from the index's pieces element by element: a reader written from docs/checkpoints.md
// that shares no code with the loader. Files are read whole with ReadSafetensors.
inline std::map<std::string, Tensor> Assemble(const std::string& dir, const std::string& kind) {
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
inline void ExpectSameTensors(const std::string& a, const std::string& b, const std::string& what) {
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

}  // namespace switchyard::train::checkpoint_testing
