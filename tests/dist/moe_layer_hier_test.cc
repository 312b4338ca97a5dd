// moe.dispatcher=hierarchical against flat (run with 4 and 8 ranks): the MoE layer's Forward
// and Backward with its token exchange over ParallelContext::ep_hierarchical() equal the
// same layer over ParallelContext::ep() bit for bit (memcmp): y, dh, every parameter
// gradient, and the rows each rank's experts received. Virtual nodes of 2 and 4 ranks
// (parallel.ranks_per_node): 2x2 on 4 ranks, 4x2 and 2x4 on 8, with ep = world and with
// ep = world / 2 (edp = 2, the ep group a strided subset of the world: on 8 ranks with
// nodes of 4 it is 2 nodes of 2 members, with nodes of 2 it is 4 nodes of 1 (flat)).
// Routings: top-1 with drops, top-2 dropless, and a skewed one where a router column
// dominates so that nearly every row goes to expert 0 and most sends are empty.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/dist/parallel_context.h"
#include "engine/dist/process.h"
#include "kernels/random.h"
#include "moe/moe_layer.h"

namespace switchyard::moe {
namespace {

constexpr uint64_t kModelSeed = 31;
constexpr int64_t kLayer = 1, kGroupTokens = 12, kGroups = 2;

struct Routing {
  std::string name;
  MoEConfig config;
  bool skewed = false;
};

std::vector<Routing> Routings() {
  MoEConfig base;
  base.d_model = 8;
  base.num_experts = 16;
  base.d_expert = 6;
  base.aux_loss_coef = 0.01f;
  base.z_loss_coef = 0.001f;
  base.num_shared_experts = 1;
  std::vector<Routing> out;
  Routing top1{"top1_drops", base};
  top1.config.top_k = 1;
  top1.config.capacity_factor = 1.0f;
  out.push_back(top1);
  Routing top2{"top2_dropless", base};
  top2.config.top_k = 2;
  top2.config.capacity_factor = 0.0f;
  top2.config.activation = Activation::kSwiglu;
  top2.config.normalize_gates = true;
  out.push_back(top2);
  Routing skewed{"skewed_dropless", base};
  skewed.config.top_k = 1;
  skewed.config.capacity_factor = 0.0f;
  skewed.skewed = true;
  out.push_back(skewed);
  return out;
}

// An exact copy check: same shape and the same bytes.
void ExpectSameBytes(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const Tensor g = got.To(Device::Cpu()), w = want.To(Device::Cpu());
  EXPECT_EQ(std::memcmp(g.raw_data(), w.raw_data(), g.nbytes()), 0) << what << " differs";
}

MoELayer MakeLayer(const Routing& r, dist::Communicator* ep) {
  MoELayer layer = MoELayer::Init(r.config, kLayer, ep, kModelSeed, 0.3f);
  if (r.skewed) {  // router column 0 dominates: expert 0 takes nearly every row
    float* w = layer.router_weight().data<float>();
    for (int64_t i = 0; i < r.config.d_model; ++i) w[i * r.config.num_experts] += 2.0f;
  }
  return layer;
}

struct Result {
  MoEForward forward;
  Tensor dh;
};

Result ForwardBackward(MoELayer& layer, const Tensor& h, const Tensor& dy) {
  Result r{layer.Forward(h, kGroupTokens, /*training=*/true, /*step=*/3,
                         /*first_token=*/dist::WorldRank() * kGroups * kGroupTokens),
           Tensor()};
  const std::vector<float> ones(kGroups, 1.0f);
  r.dh = layer.Backward(r.forward.acts, dy, ones, ones);
  return r;
}

struct Layout {
  int ranks_per_node;
  int ep;
};

std::vector<Layout> Layouts(int n) {
  std::vector<Layout> out;
  for (int per_node : {2, 4}) {
    if (per_node >= n || n % per_node != 0) continue;
    out.push_back({per_node, n});
    out.push_back({per_node, n / 2});
  }
  return out;
}

TEST(MoELayerHierarchicalTest, EqualsFlatBitForBit) {
  auto world = dist::WorldCommunicator();
  const int n = world->size();
  if (n < 4) GTEST_SKIP() << "needs nodes of 2 or more ranks, and 2 or more nodes";
  for (const Layout& layout : Layouts(n)) {
    auto mesh = dist::Mesh::Create(n, {.ep = layout.ep, .ranks_per_node = layout.ranks_per_node});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    auto pc = dist::ParallelContext::Create(*world, *mesh);
    ASSERT_TRUE(pc.ok()) << pc.status();
    auto hier = (*pc)->ep_hierarchical();
    ASSERT_TRUE(hier.ok()) << hier.status();
    const dist::NodeLayout& nodes =
        static_cast<dist::HierarchicalCommunicator*>(*hier)->layout();
    for (const Routing& routing : Routings()) {
      const std::string what = StrCat(mesh->Summary(), ", ep nodes ", nodes.nodes, "x",
                                      nodes.per_node, ", ", routing.name);
      SCOPED_TRACE(what);
      const int64_t rows = kGroups * kGroupTokens, d = routing.config.d_model;
      Tensor h = Tensor::Empty({rows, d}, DType::kF32);
      // Skewed: inputs with a positive mean meet the boosted router column 0.
      kernels::FillNormal(h, RngKey{777, 1}, world->rank() * rows * d, routing.skewed ? 2.0f : 0.0f,
                          1.0f);
      Tensor dy = Tensor::Empty({rows, d}, DType::kF32);
      kernels::FillNormal(dy, RngKey{777, 2}, world->rank() * rows * d, 0.0f, 1.0f);

      MoELayer flat_layer = MakeLayer(routing, &(*pc)->ep());
      MoELayer hier_layer = MakeLayer(routing, *hier);
      const Result flat = ForwardBackward(flat_layer, h, dy);
      const Result got = ForwardBackward(hier_layer, h, dy);
      ExpectSameBytes(got.forward.y, flat.forward.y, "y");
      ExpectSameBytes(got.dh, flat.dh, "dh");
      EXPECT_EQ(got.forward.acts.plan->recv_rows(), flat.forward.acts.plan->recv_rows());
      const auto flat_params = flat_layer.Parameters(), hier_params = hier_layer.Parameters();
      ASSERT_EQ(flat_params.size(), hier_params.size());
      for (size_t i = 0; i < flat_params.size(); ++i) {
        if (!flat_params[i].grad.defined()) continue;
        ExpectSameBytes(hier_params[i].grad, flat_params[i].grad, "grad " + flat_params[i].name);
      }
      if (routing.skewed) {
        // Most sends are empty: every rank sends nearly all rows to ep rank 0.
        const auto& send = flat.forward.acts.plan->send_rows();
        int64_t to_zero = send[0], total = 0;
        for (int64_t s : send) total += s;
        EXPECT_GE(to_zero * 10, total * 9) << "the skewed routing is not skewed";
      }
    }
  }
}

}  // namespace
}  // namespace switchyard::moe
