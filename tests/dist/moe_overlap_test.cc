// moe.overlap_chunks (moe/overlap.h) against no chunks, run with 2, 4 and 8 ranks: the MoE
// layer's forward and backward with its local experts cut into C = 2 (and C = E / ep, when
// that is more) chunks give the same bits as C = 1 — y, dh, every parameter gradient, the
// per-group values and the statistics compared with memcmp — under expert parallelism
// (ep = world; ep = world / 2 with edp 2), expert tensor parallelism (ep x etp 2) and tensor
// parallelism (tp 2 x ep: each routing group's rows split over tp). Each layout also runs
// with two compute threads per rank, where the grouped GEMMs may run each expert whole on
// one thread or split over both (kernels/gemm.h GroupSchedule): the chunks must follow the
// unchunked call's choice. Cases: top-1 with capacity drops, top-2 swiglu with shared
// experts and biases, a hot dropless case where most ep ranks receive no rows, and one
// with GEMMs large enough (>= 4 MFLOP per expert) for the compute pool to split them.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine/core/thread_pool.h"
#include "engine/dist/parallel_context.h"
#include "engine/dist/process.h"
#include "kernels/random.h"
#include "moe/moe_layer.h"

namespace switchyard::moe {
namespace {

constexpr uint64_t kModelSeed = 31;
constexpr int64_t kLayer = 1, kGroups = 2, kStep = 5;

struct Case {
  std::string name;
  MoEConfig config;
  int64_t tokens = 32;  // T per routing group
  std::vector<float> expert_bias;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

MoEConfig Base() {
  MoEConfig c;
  c.d_model = 8;
  c.num_experts = 16;  // E / ep = 16, 8, 4, 2 for ep = 1, 2, 4, 8
  c.d_expert = 8;      // divisible by etp = 2
  c.aux_loss_coef = 0.01f;
  c.z_loss_coef = 0.001f;
  return c;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  Case c{"top1_cf1", Base(), 32, {}};
  c.config.capacity_factor = 1.0f;
  c.config.jitter_eps = 0.1f;
  cases.push_back(c);
  c = Case{"top2_swiglu_shared_bias", Base(), 32, {}};
  c.config.top_k = 2;
  c.config.activation = Activation::kSwiglu;
  c.config.normalize_gates = true;
  c.config.bias = true;
  c.config.num_shared_experts = 2;
  c.config.d_shared = 4;
  cases.push_back(c);
  // Every choice on experts 0 and 1 (ep rank 0's): the others' chunks are empty.
  c = Case{"hot_top2_dropless", Base(), 32, {}};
  c.config.top_k = 2;
  c.config.capacity_factor = 0.0f;
  c.config.expert_bias_rate = 0.001f;
  c.expert_bias.assign(16, 0.0f);
  c.expert_bias[0] = 2.0f;
  c.expert_bias[1] = 1.0f;
  cases.push_back(c);
  // 2 * rows * d * f >= 4e6 per expert: the pool may split an expert's product.
  c = Case{"large_gemms", Base(), 32, {}};
  c.config.d_model = 128;
  c.config.d_expert = 256;
  c.config.num_experts = 8;
  c.config.top_k = 2;
  c.config.capacity_factor = 2.0f;
  c.tokens = 256;
  cases.push_back(c);
  return cases;
}

struct Layout {
  int tp = 1, ep = 1, etp = 1;
  std::string Name() const { return StrCat("tp ", tp, " x ep ", ep, " x etp ", etp); }
};

// Rows [lo, hi) of each of `groups` groups of T rows from group g0 on: (groups * (hi - lo), d).
Tensor GroupRows(const Tensor& all, int64_t g0, int64_t groups, int64_t T, int64_t lo,
                 int64_t hi) {
  const int64_t d = all.dim(1), rows = hi - lo;
  Tensor out = Tensor::Empty({groups * rows, d}, DType::kF32);
  for (int64_t g = 0; g < groups; ++g) {
    std::memcpy(out.data<float>() + g * rows * d, all.data<float>() + ((g0 + g) * T + lo) * d,
                sizeof(float) * rows * d);
  }
  return out;
}

bool SameBits(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  return a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// One run of the layer: its outputs and every gradient.
struct Run {
  MoEForward out;
  Tensor dh;
  std::vector<parallel::Parameter> params;
};

Run RunLayer(const Case& c, int64_t chunks, const dist::ParallelContext& pc, const Tensor& h,
             const Tensor& dy, int64_t rows, int64_t first_token) {
  MoEConfig config = c.config;
  config.overlap_chunks = chunks;
  Run run{.out = {}, .dh = {}, .params = {}};
  MoELayer layer = MoELayer::Init(config, kLayer, MoEParallel{&pc.ep(), &pc.tp(), &pc.etp()},
                                  kModelSeed, 0.3f);
  auto fill = [&](Experts& ex, const char* name) {
    const ExpertsOptions& o = ex.options();
    if (Tensor b = ex.b1(); b.defined()) {
      kernels::FillNormal(b, RngKey{kModelSeed, StreamId(StrCat(name, ".b1"))},
                          o.first * o.d_hidden, 0.0f, 0.2f);
    }
    if (Tensor b = ex.b2(); b.defined()) {
      kernels::FillNormal(b, RngKey{kModelSeed, StreamId(StrCat(name, ".b2"))},
                          o.first * o.d_model, 0.0f, 0.2f);
    }
  };
  fill(layer.experts(), "experts");
  if (layer.shared()) fill(layer.shared()->experts(), "shared");
  if (!c.expert_bias.empty()) {
    layer.expert_bias().CopyFrom(
        Tensor::FromVector(c.expert_bias, {static_cast<int64_t>(c.expert_bias.size())}));
  }
  run.out = layer.Forward(h, rows, /*training=*/true, kStep, first_token);
  const std::vector<float> daux(kGroups, 0.5f), dz(kGroups, 0.25f);
  run.dh = layer.Backward(run.out.acts, dy, daux, dz);
  run.params = layer.Parameters();
  return run;
}

void CheckLayout(const Case& c, dist::Communicator& world, const Layout& layout, int threads) {
  auto mesh = dist::Mesh::Create(world.size(), {.tp = layout.tp, .ep = layout.ep,
                                                .etp = layout.etp});
  ASSERT_TRUE(mesh.ok()) << mesh.status();  // the same on every rank
  auto pc_or = dist::ParallelContext::Create(world, *mesh);
  ASSERT_TRUE(pc_or.ok()) << pc_or.status();
  const dist::ParallelContext& pc = **pc_or;
  SetComputeThreads(threads);
  const int64_t T = c.tokens, d = c.config.d_model, tp = pc.tp().size();
  const int64_t replica = mesh->Coord(world.rank(), dist::View::kDense, dist::Axis::kDp);
  const int64_t g0 = replica * kGroups, rows = T / tp, lo = pc.tp().rank() * rows;
  const int64_t all_groups = mesh->dp() * kGroups;
  Tensor h_all = Tensor::Empty({all_groups * T, d}, DType::kF32);
  Tensor dy_all = Tensor::Empty({all_groups * T, d}, DType::kF32);
  kernels::FillNormal(h_all, RngKey{777, 1}, 0, 0.0f, 1.0f);
  kernels::FillNormal(dy_all, RngKey{777, 2}, 0, 0.0f, 1.0f);
  const Tensor h = GroupRows(h_all, g0, kGroups, T, lo, lo + rows);
  const Tensor dy = GroupRows(dy_all, g0, kGroups, T, lo, lo + rows);

  const Run want = RunLayer(c, 1, pc, h, dy, rows, g0 * T);
  EXPECT_EQ(want.out.acts.chunks, nullptr);
  const int64_t per_rank = c.config.num_experts / layout.ep;
  std::vector<int64_t> chunk_counts = {2};
  if (per_rank > 2) chunk_counts.push_back(per_rank);
  for (int64_t chunks : chunk_counts) {
    SCOPED_TRACE(StrCat(chunks, " chunks, ", threads, " threads"));
    if (world.rank() == 0) {
      std::printf("[ %s, %s, %lld chunks, %d threads ]\n", c.name.c_str(), layout.Name().c_str(),
                  static_cast<long long>(chunks), threads);
    }
    const Run got = RunLayer(c, chunks, pc, h, dy, rows, g0 * T);
    EXPECT_TRUE(got.out.acts.chunks != nullptr && got.out.acts.chunks->chunks() == chunks)
        << "the chunked path did not run";
    EXPECT_TRUE(SameBits(got.out.y, want.out.y)) << "y";
    EXPECT_TRUE(SameBits(got.dh, want.dh)) << "dh";
    EXPECT_EQ(got.out.groups.aux, want.out.groups.aux);
    EXPECT_EQ(got.out.groups.z, want.out.groups.z);
    EXPECT_EQ(got.out.groups.tokens_per_expert_kept, want.out.groups.tokens_per_expert_kept);
    EXPECT_EQ(got.out.stats.tokens_per_expert_kept, want.out.stats.tokens_per_expert_kept);
    EXPECT_EQ(got.out.acts.plan->received_rows(), want.out.acts.plan->received_rows());
    ASSERT_EQ(got.params.size(), want.params.size());
    for (size_t i = 0; i < got.params.size(); ++i) {
      EXPECT_TRUE(SameBits(got.params[i].grad, want.params[i].grad))
          << got.params[i].name << " grad";
    }
  }
  SetComputeThreads(1);
}

class MoEOverlapTest : public ::testing::TestWithParam<Case> {};

TEST_P(MoEOverlapTest, ChunksGiveTheBitsOfOne) {
  auto world = dist::WorldCommunicator();
  const int R = world->size();
  const std::vector<Layout> layouts = {{1, R, 1}, {1, R / 2, 1}, {1, R / 2, 2}, {2, R / 2, 1},
                                       {2, R / 4, 2}};
  int run = 0;
  for (const Layout& layout : layouts) {
    const int64_t experts = GetParam().config.num_experts;
    if (layout.ep < 1 || R % (layout.tp * layout.ep * layout.etp) != 0 ||
        R % (layout.ep * layout.etp) != 0 || experts % layout.ep != 0 ||
        experts / layout.ep < 2) {
      continue;  // not this world size, or one expert per rank: nothing to chunk
    }
    SCOPED_TRACE(layout.Name());
    for (int threads : {1, 2}) CheckLayout(GetParam(), *world, layout, threads);
    ++run;
  }
  EXPECT_GE(run, 3) << "ep x edp, ep x etp and tp x ep run on every world size";
}

INSTANTIATE_TEST_SUITE_P(Configs, MoEOverlapTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace switchyard::moe
