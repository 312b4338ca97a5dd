// The MoE layer under tensor (+ sequence) and expert tensor parallelism (run with 2, 4 and 8
// ranks), against one rank: MODEL.md section 4's whole routing groups. Each data-parallel
// replica of the mesh has one routing group of T tokens; its tp ranks each hold T / tp rows
// (the layer gets them with G = 1, first_token = the group's first token), and the experts
// are split over ep and, with etp > 1, over their hidden units. Every rank also runs a
// one-rank reference layer (ep = tp = etp = 1) over every group.
//
// Checked: the layer's parameters are boxes of the reference's (bitwise); per group, the
// kept counts, drops, aux and z are identical to the reference (every tp rank routes the
// whole group exactly as one rank); y and dh of this rank's rows agree to 1e-5; and every
// gradient, summed over its description's grad_sum group, equals the reference's gradient
// summed over all groups, box by box. Layouts: tp = world; tp 2 x ep 2 (etp 1); etp = world
// (tp 1, ep 1); tp 2 x etp 2 (ep = world / 4 x ...). Cases: top-1 position policy with drops;
// top-2 probability policy with the random second expert, swiglu, biases, a shared expert
// and the aux-loss-free expert bias, with jitter.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/dist/communicator.h"
#include "engine/dist/mesh.h"
#include "engine/dist/parallel_context.h"
#include "engine/dist/process.h"
#include "engine/parallel/grad_sync.h"
#include "kernels/random.h"
#include "moe/moe_layer.h"

namespace switchyard::moe {
namespace {

constexpr uint64_t kDataSeed = 91;
constexpr uint64_t kModelSeed = 17;
constexpr int64_t kTokens = 32;  // per routing group
constexpr float kInitStd = 0.3f;

Tensor GroupNormal(int64_t group, const Shape& shape, uint64_t stream) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  kernels::FillNormal(t, RngKey{kDataSeed, stream}, group * NumElements(shape), 0.0f, 1.0f);
  return t;
}

// The box of `whole` that `p` describes, as a new tensor.
Tensor Box(const Tensor& whole, const parallel::Parameter& p) {
  const Shape& local = p.value.shape();
  Tensor out = Tensor::Empty(local, DType::kF32);
  const int nd = static_cast<int>(local.size());
  std::vector<int64_t> idx(nd, 0);
  for (int64_t n = 0; n < out.numel(); ++n) {
    int64_t g = 0;
    for (int d = 0; d < nd; ++d) g = g * whole.dim(d) + idx[d] + p.OffsetAt(d);
    out.data<float>()[n] = whole.data<float>()[g];
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[d] < local[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// |got - want| <= 1e-5 |want| + 1e-6 max |want|, elementwise.
void ExpectClose(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  const std::vector<float> g = got.ToVector<float>(), w = want.ToVector<float>();
  double scale = 0;
  for (float v : w) scale = std::max(scale, double(std::abs(v)));
  int64_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double tol = 1e-5 * std::abs(w[i]) + 1e-6 * scale + 1e-30;
    if (!(std::abs(double(g[i]) - w[i]) <= tol) && bad++ < 3) {
      ADD_FAILURE() << what << "[" << i << "] = " << g[i] << ", reference " << w[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

struct Case {
  std::string name;
  MoEConfig config;
};

std::vector<Case> Cases() {
  MoEConfig base;
  base.d_model = 8;
  base.num_experts = 8;
  base.d_expert = 8;  // divisible by etp = 1, 2, 4, 8
  base.aux_loss_coef = 0.01f;
  base.z_loss_coef = 0.001f;
  Case top1{"top1_position_drops", base};
  top1.config.top_k = 1;
  top1.config.capacity_factor = 1.0f;
  Case top2{"top2_probability_random_shared_bias", base};
  top2.config.top_k = 2;
  top2.config.drop_policy = DropPolicy::kProbability;
  top2.config.second_expert_policy = SecondExpertPolicy::kRandom;
  top2.config.capacity_factor = 0.75f;
  top2.config.activation = Activation::kSwiglu;
  top2.config.bias = true;
  top2.config.num_shared_experts = 1;
  top2.config.d_shared = 8;
  top2.config.expert_bias_rate = 0.01f;
  top2.config.jitter_eps = 0.05f;
  return {top1, top2};
}

struct Layout {
  std::string name;
  dist::MeshSizes sizes;
};

std::vector<Layout> Layouts(int world) {
  std::vector<Layout> out = {{"tp=world", {.tp = world, .ep = 1, .etp = 1}},
                             {"tp=2,ep=2,etp=1", {.tp = 2, .ep = 2, .etp = 1}},
                             {"etp=world", {.tp = 1, .ep = 1, .etp = world}}};
  if (world >= 4) out.push_back({"tp=2,etp=2,ep=world/4", {.tp = 2, .ep = world / 4, .etp = 2}});
  return out;
}

class MoELayerTpTest : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override { world_ = dist::WorldCommunicator(); }
  std::unique_ptr<dist::Communicator> world_;
};

TEST_P(MoELayerTpTest, WholeGroupRoutingEqualsOneRank) {
  const MoEConfig& config = GetParam().config;
  const int64_t d = config.d_model;
  for (const Layout& layout : Layouts(world_->size())) {
    SCOPED_TRACE(layout.name);
    auto mesh = dist::Mesh::Create(world_->size(), layout.sizes);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    auto pc_or = dist::ParallelContext::Create(*world_, *mesh);
    ASSERT_TRUE(pc_or.ok()) << pc_or.status();
    const dist::ParallelContext& pc = **pc_or;
    const int tp = pc.tp().size(), tr = pc.tp().rank();
    const int64_t groups = mesh->dp(), mine = mesh->Coord(world_->rank(), dist::View::kDense,
                                                          dist::Axis::kDp);
    const std::vector<float> bias = {0.02f, -0.01f, 0.0f, 0.03f, -0.02f, 0.01f, 0.0f, -0.03f};
    MoELayer layer = MoELayer::Init(config, 1, MoEParallel{&pc.ep(), &pc.tp(), &pc.etp()},
                                    kModelSeed, kInitStd);
    auto local = dist::MakeLocalCommunicator();
    MoELayer ref = MoELayer::Init(config, 1, local.get(), kModelSeed, kInitStd);
    for (MoELayer* l : {&layer, &ref}) {
      if (l->expert_bias().defined()) l->expert_bias().CopyFrom(Tensor::FromVector(bias, {8}));
    }
    // The parameters are boxes of the one-rank layer's.
    std::vector<parallel::Parameter> params = layer.Parameters(), whole = ref.Parameters();
    ASSERT_EQ(params.size(), whole.size());
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_EQ(params[i].name, whole[i].name);
      EXPECT_EQ(Box(whole[i].value, params[i]).ToVector<float>(), params[i].value.ToVector<float>())
          << params[i].Describe();
    }

    // The reference over every group: this rank's group's outputs and the summed gradients.
    const float daux[1] = {0.5f}, dz[1] = {0.25f};
    Tensor ref_y, ref_dh;
    MoEGroupValues ref_values;
    for (int64_t g = 0; g < groups; ++g) {
      Tensor h = GroupNormal(g, {kTokens, d}, 1), dy = GroupNormal(g, {kTokens, d}, 2);
      MoEForward f = ref.Forward(h, kTokens, true, 3, g * kTokens);
      Tensor dh = ref.Backward(f.acts, dy, daux, dz);
      if (g == mine) ref_y = f.y, ref_dh = dh, ref_values = f.groups;
    }
    // The layout: this rank's rows of its group.
    const int64_t rows = kTokens / tp;
    Tensor h = GroupNormal(mine, {kTokens, d}, 1).Slice(tr * rows, (tr + 1) * rows).Clone();
    Tensor dy = GroupNormal(mine, {kTokens, d}, 2).Slice(tr * rows, (tr + 1) * rows).Clone();
    MoEForward f = layer.Forward(h, rows, true, 3, mine * kTokens);
    Tensor dh = layer.Backward(f.acts, dy, daux, dz);

    int64_t dropped = 0;
    for (int64_t n : ref_values.dropped) dropped += n;
    EXPECT_GT(dropped, 0) << "the case should drop assignments at its capacity";
    EXPECT_EQ(f.groups.tokens_per_expert_kept, ref_values.tokens_per_expert_kept);
    EXPECT_EQ(f.groups.dropped, ref_values.dropped);
    EXPECT_EQ(f.groups.aux, ref_values.aux);
    EXPECT_EQ(f.groups.z, ref_values.z);
    ExpectClose(f.y, ref_y.Slice(tr * rows, (tr + 1) * rows), "y");
    ExpectClose(dh, ref_dh.Slice(tr * rows, (tr + 1) * rows), "dh");
    // Each gradient summed over its description's group is the reference's sum over groups.
    params = layer.Parameters();
    whole = ref.Parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].trainable) continue;
      Tensor g = params[i].grad.Clone();
      if (!params[i].grad_sum.empty()) {
        parallel::GroupOf(pc, params[i].view, params[i].grad_sum)
            .AllReduce(g, dist::ReduceOp::kSum);
      }
      ExpectClose(g, Box(whole[i].grad, params[i]), "grad " + params[i].Describe());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, MoELayerTpTest, testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace switchyard::moe
