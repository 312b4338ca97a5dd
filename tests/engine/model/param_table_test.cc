// The parameter table (engine/model/param_table.h) against the decoder's registry, exactly:
//  - every trainable parameter a whole-model decoder registers is in the table under its
//    name with its global shape, and the table holds nothing else; its totals are the
//    registry's element count, for dense, MoE (gelu + layernorm + learned positions + biases
//    + tied head), Mixtral-like (swiglu + rmsnorm + rope + grouped-query attention + untied
//    head) and shared-expert variants;
//  - the dry-run's per-rank counts (EstimateRankParams, read from the table) equal
//    CountRankParams of each pipeline stage's decoder under pp 2 and pp 3 meshes.
//  - a stage's decoder registers exactly ParamTable::StageParams in order (CheckRegistry,
//    which Decoder::Create runs), and a registry that differs in name, shape, part,
//    gradient group or tied flag is an error naming the parameter;
//  - the backward order of parts (model::BackwardParts), by hand for whole, first, middle
//    and tied last stages.
// Layouts over tp, ep and etp are checked the same way on several ranks by
// tests/dist/trainer_test.cc, zero_test.cc and pipeline_memory_test.cc.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/dist/communicator.h"
#include "engine/model/decoder.h"
#include "engine/model/param_table.h"
#include "engine/plan/dry_run.h"

namespace switchyard::plan {
namespace {

constexpr char kTiny[] = R"(
model:
  vocab_size: 100
  seq_len: 16
  d_model: 32
  n_layers: 4
  n_heads: 4
  d_ff: 48
moe:
  num_experts: 4
  layer_freq: 2
  top_k: 2
  d_expert: 24
train:
  micro_batch_size: 2
  grad_accum: 4
)";

struct Variant {
  std::string name;
  std::vector<std::string> overrides;
};

std::vector<Variant> Variants() {
  return {
      {"dense", {"moe.layer_freq=100"}},
      {"moe_gelu_layernorm", {"moe.bias=true"}},
      {"mixtral_like",
       {"model.norm=rmsnorm", "model.position=rope", "model.activation=swiglu",
        "model.n_kv_heads=2", "model.bias=false", "model.tie_embeddings=false",
        "moe.activation=swiglu", "moe.layer_freq=1", "moe.normalize_gates=true"}},
      {"shared_experts_bias", {"moe.num_shared_experts=2", "moe.d_shared=8", "moe.bias=true"}},
  };
}

config::Config Tiny(const std::vector<std::string>& overrides) {
  auto c = config::ParseConfig(kTiny, "tiny.yaml", overrides);
  SY_CHECK_OK(c.status());
  SY_CHECK_OK(c->Validate(static_cast<int>(c->parallel.SmallestWorld())));
  return *c;
}

std::unique_ptr<model::Decoder> Build(const config::Config& c, dist::Communicator* ep,
                                      model::Stage stage = model::Stage::Whole()) {
  auto d = model::Decoder::Create(c.model, c.moe, 7, model::DecoderParallel{.ep = ep, .stage = stage});
  SY_CHECK_OK(d.status());
  return std::move(*d);
}

TEST(ParamTableTest, EveryRegisteredTensorByNameAndShape) {
  auto ep = dist::MakeLocalCommunicator();
  for (const Variant& v : Variants()) {
    SCOPED_TRACE(v.name);
    const config::Config c = Tiny(v.overrides);
    const std::unique_ptr<model::Decoder> decoder = Build(c, ep.get());
    std::map<std::string, Shape> registered;
    int64_t total = 0;
    for (const parallel::Parameter& p : decoder->registry().params()) {
      if (!p.trainable) continue;
      registered[p.name] = p.global_shape;
      total += p.value.numel();
    }
    const model::ParamTable table = model::ParamTable::Build(c.model, c.moe);
    std::map<std::string, Shape> listed;
    for (const model::ParamShape& p : table.params()) {
      if (p.tied_copy) continue;  // the same tensor as embed.wte on one stage
      listed[p.Name()] = Shape(p.shape.begin(), p.shape.begin() + p.dims);
    }
    EXPECT_EQ(listed, registered);
    EXPECT_EQ(table.Total().params, total);
    EXPECT_EQ(EstimateCost(c).total_params, total);
    auto one = dist::Mesh::Create(1, c.parallel.MeshSizes(), c.parallel.order);
    ASSERT_TRUE(one.ok());
    EXPECT_EQ(EstimateRankParams(c, *one, 0), CountRankParams(decoder->registry()));
  }
}

TEST(ParamTableTest, PipelineRanksHoldTheirStagesTensors) {
  auto ep = dist::MakeLocalCommunicator();
  for (const Variant& v : Variants()) {
    for (int pp : {2, 3}) {
      SCOPED_TRACE(v.name + " pp " + std::to_string(pp));
      std::vector<std::string> o = v.overrides;
      o.push_back("parallel.pp=" + std::to_string(pp));
      const config::Config c = Tiny(o);
      auto mesh = dist::Mesh::Create(pp, c.parallel.MeshSizes(), c.parallel.order);
      ASSERT_TRUE(mesh.ok()) << mesh.status();
      for (int rank = 0; rank < pp; ++rank) {
        const std::vector<model::Stage> stages = RankStages(c, rank);
        ASSERT_EQ(stages.size(), 1u);
        const std::unique_ptr<model::Decoder> decoder = Build(c, ep.get(), stages[0]);
        EXPECT_EQ(EstimateRankParams(c, *mesh, rank), CountRankParams(decoder->registry()))
            << "rank " << rank << ": " << stages[0].Describe(c.model.n_layers);
      }
    }
  }
}

// The tensor-parallel splits: this rank's box of each tensor, by hand for tp 2, ep 2, etp 1
// (vocab 100 = 50 + 50 rows; 4 heads of 8 over tp; experts 4 over ep; kv heads 2 of 8
// split; with tp 4, 2 kv heads are whole on every rank).
TEST(ParamTableTest, LocalBoxesUnderTensorAndExpertParallelism) {
  const config::Config c = Tiny({"model.n_kv_heads=2", "moe.bias=true"});
  const model::ParamTable t2 =
      model::ParamTable::Build(c.model, c.moe, {.tp = 2, .etp = 1, .ep = 2});
  std::map<std::string, int64_t> local;
  std::map<std::string, bool> replicated;
  for (const model::ParamShape& p : t2.params()) {
    if (p.tied_copy) continue;
    local[p.Name()] = t2.LocalNumel(p, 1);
    replicated[p.Name()] = t2.Replicated(p);
  }
  EXPECT_EQ(local["embed.wte"], 50 * 32);
  EXPECT_EQ(local["embed.wpe"], 16 * 32);
  EXPECT_TRUE(replicated["embed.wpe"]);
  EXPECT_EQ(local["layers.0.attn.q.weight"], 32 * 16);
  EXPECT_EQ(local["layers.0.attn.k.weight"], 32 * 8);
  EXPECT_FALSE(replicated["layers.0.attn.k.weight"]);
  EXPECT_TRUE(replicated["layers.0.attn.o.bias"]);
  EXPECT_EQ(local["layers.0.mlp.w2.weight"], 24 * 32);
  EXPECT_EQ(local["layers.1.moe.experts.w1"], 2 * 32 * 24);
  EXPECT_FALSE(replicated["layers.1.moe.experts.b2"]);  // etp 1: the expert group's own
  EXPECT_TRUE(replicated["layers.1.moe.router.weight"]);
  const model::ParamTable t4 =
      model::ParamTable::Build(c.model, c.moe, {.tp = 4, .etp = 2, .ep = 1});
  for (const model::ParamShape& p : t4.params()) {
    if (p.Name() == "layers.0.attn.k.weight") {
      EXPECT_TRUE(t4.Replicated(p));
      EXPECT_EQ(t4.LocalNumel(p, 3), 32 * 16);
    }
    if (p.Name() == "layers.1.moe.experts.w2") {
      EXPECT_EQ(t4.LocalNumel(p, 0), 4 * 12 * 32);
    }
    if (p.Name() == "layers.1.moe.experts.b2") {
      EXPECT_TRUE(t4.Replicated(p));
    }
  }
}

TEST(ParamTableTest, RegistryCheckNamesTheFirstDifference) {
  auto ep = dist::MakeLocalCommunicator();
  const config::Config c = Tiny({"parallel.pp=2"});
  const std::vector<model::Stage> stages = RankStages(c, 1);  // the last stage: tied copy
  const std::unique_ptr<model::Decoder> decoder = Build(c, ep.get(), stages[0]);
  const model::ParamTable table = model::ParamTable::Build(c.model, c.moe);
  const parallel::ParameterRegistry& registry = decoder->registry();
  ASSERT_TRUE(table.CheckRegistry(registry, stages[0], false, 0, true).ok());
  // The copy of the tied table comes first, as the decoder registers it.
  EXPECT_EQ(table.StageParams(stages[0]).front().Name(), "embed.wte");
  EXPECT_TRUE(table.StageParams(stages[0]).front().tied_copy);
  const int64_t layer = stages[0].first_layer;
  const std::string q = StrCat("layers.", layer, ".attn.q.weight");
  auto broken = [&](const std::function<void(parallel::Parameter&)>& change) {
    parallel::ParameterRegistry copy;
    for (parallel::Parameter p : registry.params()) {
      if (p.name == q) change(p);
      copy.Add(std::move(p));
    }
    return table.CheckRegistry(copy, stages[0], false, 0, true);
  };
  const Status sum = broken([](parallel::Parameter& p) { p.ReplicatedOver(dist::Axis::kTp, true); });
  EXPECT_FALSE(sum.ok());
  EXPECT_NE(sum.message().find(q + "'s gradient group"), std::string::npos) << sum;
  const Status part = broken([&](parallel::Parameter& p) { p.part = parallel::PartId::Layer(layer + 1); });
  EXPECT_NE(part.message().find(StrCat("part is layers.", layer + 1)), std::string::npos) << part;
  const Status shape = broken([](parallel::Parameter& p) { p.global_shape[1] *= 2; });
  EXPECT_NE(shape.message().find("logical shape"), std::string::npos) << shape;
  const Status tied = broken([](parallel::Parameter& p) { p.tied = true; });
  EXPECT_NE(tied.message().find("tied flag"), std::string::npos) << tied;
  // Without the tie, the last stage has no table copy: the registry holds one tensor more.
  const Status untied = table.CheckRegistry(registry, stages[0], false, 0, false);
  EXPECT_FALSE(untied.ok());
}

TEST(ParamTableTest, BackwardPartsByHand) {
  using parallel::PartId;
  const model::Stage whole = model::Stage::Whole();
  EXPECT_EQ(model::BackwardParts({&whole, 1}, 3, false),
            (std::vector<PartId>{PartId::Head(), PartId::NormF(), PartId::Layer(2),
                                 PartId::Layer(1), PartId::Layer(0), PartId::Embed()}));
  EXPECT_EQ(model::BackwardParts({&whole, 1}, 2, true),
            (std::vector<PartId>{PartId::NormF(), PartId::Layer(1), PartId::Layer(0),
                                 PartId::Embed()}));
  const model::Stage first{.first_layer = 0, .end_layer = 2, .embedding = true, .head = false};
  const model::Stage last{.first_layer = 2, .end_layer = 4, .embedding = false, .head = true};
  EXPECT_EQ(model::BackwardParts({&first, 1}, 4, true),
            (std::vector<PartId>{PartId::Layer(1), PartId::Layer(0), PartId::Embed()}));
  // A tied head without the embedding: the table's copy is final right after the norm.
  EXPECT_EQ(model::BackwardParts({&last, 1}, 4, true),
            (std::vector<PartId>{PartId::NormF(), PartId::Embed(), PartId::Layer(3),
                                 PartId::Layer(2)}));
  // Two chunks of one rank: the later chunk's parts first.
  const std::vector<model::Stage> chunks = {first, last};
  EXPECT_EQ(model::BackwardParts(chunks, 4, false),
            (std::vector<PartId>{PartId::Head(), PartId::NormF(), PartId::Layer(3),
                                 PartId::Layer(2), PartId::Layer(1), PartId::Layer(0),
                                 PartId::Embed()}));
}

}  // namespace
}  // namespace switchyard::plan
