// Pipeline stages (engine/model/stage.h) on one process:
//  - PartitionLayers: an explicit split is taken as given; the automatic split's most
//    expensive stage is no worse than that of any other contiguous split (brute force), and
//    identical layers split evenly; impossible settings get one message naming them.
//  - A chain of stage decoders (the first with the embedding, the last with the head; each
//    reading the previous stage's output and handing back the gradient of its input) is the
//    whole decoder: the same parameters with the same initial values, the same loss and
//    aux/z sums, and bit for bit the same gradients — except the tied token table, held by
//    the first and the last stage, whose two gradients sum to the whole one's up to the
//    order of that sum.
#include "engine/model/stage.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/philox.h"
#include "engine/dist/communicator.h"
#include "engine/model/decoder.h"
#include "kernels/elementwise.h"
#include "tests/engine/model/model_test_util.h"
#include "tests/testing/tolerance.h"

namespace switchyard::model {
namespace {

using testing::LlamaLike;
using testing::BackwardChain;
using testing::ChainRun;
using testing::ForwardChain;
using testing::MixtralLike;

using parallel::Parameter;

ModelConfig Gpt(int64_t layers) {
  return ModelConfig{.vocab_size = 13, .seq_len = 5, .d_model = 8, .n_layers = layers,
                     .n_heads = 2, .d_ff = 12};
}

moe::MoEConfig Switch() {
  return moe::MoEConfig{.num_experts = 4, .layer_freq = 2, .top_k = 1, .d_expert = 6,
                        .capacity_factor = 1.0f, .eval_capacity_factor = 0.0f,
                        .aux_loss_coef = 0.1f, .z_loss_coef = 0.01f};
}

std::vector<int64_t> Counts(const std::vector<Stage>& stages, int64_t n_layers) {
  std::vector<int64_t> out;
  for (const Stage& s : stages) out.push_back(s.End(n_layers) - s.first_layer);
  return out;
}

TEST(PartitionLayersTest, ExplicitSplitIsTakenAsGiven) {
  const ModelConfig m = Gpt(6);
  auto stages = PartitionLayers(m, Switch(), 3, std::vector<int64_t>{1, 3, 2});
  ASSERT_TRUE(stages.ok()) << stages.status();
  ASSERT_EQ(stages->size(), 3u);
  EXPECT_EQ((*stages)[0], (Stage{.first_layer = 0, .end_layer = 1, .embedding = true, .head = false}));
  EXPECT_EQ((*stages)[1], (Stage{.first_layer = 1, .end_layer = 4, .embedding = false, .head = false}));
  EXPECT_EQ((*stages)[2], (Stage{.first_layer = 4, .end_layer = 6, .embedding = false, .head = true}));
  EXPECT_EQ((*stages)[0].Describe(6), "embedding + layers 0-0");
  EXPECT_EQ((*stages)[2].Describe(6), "layers 4-5 + head");
}

TEST(PartitionLayersTest, ImpossibleSettingsNameTheSetting) {
  const ModelConfig m = Gpt(4);
  struct Bad {
    int stages;
    std::vector<int64_t> counts;
    std::string says;
  };
  const Bad bad[] = {{5, {}, "5 pipeline stages"},
                     {0, {}, "must be >= 1"},
                     {2, {1, 1, 2}, "lists 3 stages, the layout has 2"},
                     {2, {1, 2}, "sums to 3 layers"},
                     {2, {0, 4}, "stage 0 0 layers"}};
  for (const Bad& b : bad) {
    auto got = PartitionLayers(m, Switch(), b.stages, b.counts);
    ASSERT_FALSE(got.ok()) << b.says;
    EXPECT_NE(std::string(got.status().message()).find(b.says), std::string::npos)
        << got.status();
  }
  EXPECT_FALSE((Stage{.first_layer = 2, .end_layer = 2}).Validate(4).ok());
  EXPECT_FALSE((Stage{.first_layer = 0, .end_layer = 5}).Validate(4).ok());
}

// Every contiguous split of `layers` into `stages` non-empty parts.
void AllSplits(int64_t layers, int stages, std::vector<int64_t>& prefix,
               std::vector<std::vector<int64_t>>& out) {
  if (stages == 1) {
    prefix.push_back(layers);
    out.push_back(prefix);
    prefix.pop_back();
    return;
  }
  for (int64_t first = 1; first <= layers - (stages - 1); ++first) {
    prefix.push_back(first);
    AllSplits(layers - first, stages - 1, prefix, out);
    prefix.pop_back();
  }
}

double Bottleneck(const ModelConfig& m, const moe::MoEConfig& e, const std::vector<Stage>& stages) {
  const std::vector<double> costs = StageCosts(m, e, stages);
  return *std::max_element(costs.begin(), costs.end());
}

// The automatic split's most expensive stage is no worse than any other split's (all of
// them enumerated), over models whose MoE layers (16 experts: many parameters, little
// compute per token) sit every 1st, 2nd or 3rd layer; and identical layers with a
// negligible embedding and head split evenly.
TEST(PartitionLayersTest, AutomaticSplitMinimisesTheMostExpensiveStage) {
  for (int64_t layers : {4, 7, 10}) {
    for (int64_t freq : {1, 2, 3}) {
      ModelConfig m = Gpt(layers);
      m.vocab_size = 500;  // a head worth about a layer
      moe::MoEConfig e = Switch();
      e.layer_freq = freq;
      e.num_experts = 16;
      for (int stages = 2; stages <= std::min<int64_t>(layers, 5); ++stages) {
        SCOPED_TRACE(::testing::Message() << layers << " layers, MoE every " << freq << ", "
                                        << stages << " stages");
        auto got = PartitionLayers(m, e, stages);
        ASSERT_TRUE(got.ok()) << got.status();
        const double mine = Bottleneck(m, e, *got);
        std::vector<std::vector<int64_t>> splits;
        std::vector<int64_t> prefix;
        AllSplits(layers, stages, prefix, splits);
        double best = INFINITY;
        for (const auto& split : splits) {
          auto fixed = PartitionLayers(m, e, stages, split);
          ASSERT_TRUE(fixed.ok()) << fixed.status();
          best = std::min(best, Bottleneck(m, e, *fixed));
        }
        EXPECT_EQ(mine, best);
      }
    }
  }
  ModelConfig dense = Gpt(8);
  dense.vocab_size = 2;
  moe::MoEConfig no_moe = Switch();
  no_moe.layer_freq = 100;  // no layer of 8 is MoE
  for (int stages : {2, 4, 8}) {
    auto got = PartitionLayers(dense, no_moe, stages);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(Counts(*got, 8), std::vector<int64_t>(stages, 8 / stages)) << stages << " stages";
  }
}

struct ChainCase {
  const char* name;
  ModelConfig model;
  moe::MoEConfig moe;
};

std::vector<ChainCase> ChainCases() {
  ModelConfig gpt = Gpt(4);  // tied embedding, learned positions, gelu, biases
  const ModelConfig llama = LlamaLike(Gpt(4));
  moe::MoEConfig mix = MixtralLike(Switch());
  mix.jitter_eps = 0.1f;
  return {{"switch_tied", gpt, Switch()}, {"mixtral_untied", llama, mix}};
}

DecoderInput ChainBatch(int64_t vocab) {
  std::vector<int32_t> tokens(3 * 5), targets(3 * 5);
  for (int i = 0; i < 15; ++i) {
    tokens[i] = static_cast<int32_t>(RandomBitsAt({6, 1}, i) % vocab);
    targets[i] = static_cast<int32_t>(RandomBitsAt({6, 2}, i) % vocab);
  }
  targets[4] = -1;
  DecoderInput in;
  in.tokens = Tensor::FromVector(tokens, {3, 5});
  in.targets = Tensor::FromVector(targets, {3, 5});
  in.first_token = 40;
  in.step = 3;
  in.ce_grad_scale = 1.0f / 14;
  in.aux_grad_scale = 0.5f;
  return in;
}

TEST(StageChainTest, StagesChainedAreTheWholeDecoder) {
  const std::vector<std::vector<int64_t>> splits = {{1, 3}, {2, 2}, {3, 1}, {1, 1, 2}, {1, 1, 1, 1}};
  for (const ChainCase& c : ChainCases()) {
    auto ep = dist::MakeLocalCommunicator();
    auto whole = Decoder::Create(c.model, c.moe, 7, ep.get());
    ASSERT_TRUE(whole.ok()) << whole.status();
    const DecoderInput in = ChainBatch(c.model.vocab_size);
    DecoderOutput want = (*whole)->Forward(in);
    (*whole)->Backward(in, want);
    std::map<std::string, const Parameter*> by_name;
    for (const Parameter& p : (*whole)->registry().params()) by_name[p.name] = &p;
    // The tied table's lookup terms: the gradient of layer 0's input per token, from the
    // model without its embedding run on the whole model's embedding output.
    std::vector<float> lookups;  // (B S, d)
    if (c.model.tie_embeddings) {
      auto rest = Decoder::Create(
          c.model, c.moe, 7,
          DecoderParallel{.ep = ep.get(), .stage = Stage{.embedding = false, .head = true}});
      ASSERT_TRUE(rest.ok()) << rest.status();
      DecoderInput rin = in;
      rin.hidden = want.acts.blocks[0].x_in;
      DecoderOutput rout = (*rest)->Forward(rin);
      (*rest)->Backward(rin, rout);
      lookups = rout.grad_input.ToVector<float>();
    }

    for (const std::vector<int64_t>& split : splits) {
      SCOPED_TRACE(::testing::Message() << c.name << ", layers per stage " << ::testing::PrintToString(split));
      auto stages = PartitionLayers(c.model, c.moe, static_cast<int>(split.size()), split);
      ASSERT_TRUE(stages.ok()) << stages.status();
      std::vector<std::unique_ptr<Decoder>> chain;
      for (const Stage& st : *stages) {
        auto dec = Decoder::Create(c.model, c.moe, 7, DecoderParallel{.ep = ep.get(), .stage = st});
        ASSERT_TRUE(dec.ok()) << dec.status();
        chain.push_back(std::move(*dec));
      }
      // Forward through the chain, then backward in reverse handing gradients back.
      ChainRun run = ForwardChain(chain, in);
      for (size_t s = 0; s + 1 < chain.size(); ++s) {
        EXPECT_EQ(run.outs[s].hidden.shape(), (Shape{3, 5, c.model.d_model}));
      }
      EXPECT_EQ(run.outs.back().ce_sum, want.ce_sum);
      EXPECT_EQ(run.outs.back().ce_count, want.ce_count);
      EXPECT_EQ(run.aux, want.aux_sum);
      EXPECT_EQ(run.z, want.z_sum);
      BackwardChain(chain, in, run);
      for (size_t s = 0; s < chain.size(); ++s) {
        EXPECT_EQ(run.outs[s].grad_input.defined(), s > 0);
      }
      // Every parameter once (the tied table twice), equal values, equal gradients.
      std::map<std::string, std::vector<const Parameter*>> held;
      for (const auto& dec : chain)
        for (const Parameter& p : dec->registry().params()) held[p.name].push_back(&p);
      EXPECT_EQ(held.size(), by_name.size());
      for (const auto& [name, copies] : held) {
        ASSERT_TRUE(by_name.count(name)) << name << " is not a parameter of the whole model";
        const Parameter& w = *by_name[name];
        const bool tied_table = name == "embed.wte" && c.model.tie_embeddings && chain.size() > 1;
        ASSERT_EQ(copies.size(), tied_table ? 2u : 1u) << name;
        for (const Parameter* p : copies) {
          EXPECT_EQ(p->value.ToVector<float>(), w.value.ToVector<float>()) << name;
        }
        if (!w.trainable) continue;
        if (!tied_table) {
          EXPECT_EQ(copies[0]->grad.ToVector<float>(), w.grad.ToVector<float>()) << name;
          continue;
        }
        // The first stage's lookups plus the last stage's head: the whole model added the
        // head's product H first and the lookups l_p (in token order) onto it; the chain adds
        // the lookups from 0 and then H. A sum of n_v = 1 + (lookups of row v) terms in two
        // orders: |whole - chain| <= 2 (n_v - 1) u (|H| + sum_p |l_p|) (x 1.01: second order).
        Tensor sum = copies[0]->grad.Clone();
        kernels::Axpy(1.0f, copies[1]->grad, sum);
        const int64_t d = c.model.d_model, vocab = c.model.vocab_size;
        const std::vector<int32_t> tokens = in.tokens.ToVector<int32_t>();
        const std::vector<float> head = copies[1]->grad.ToVector<float>();
        std::vector<double> terms(head.begin(), head.end()), bound(vocab * d);
        for (double& t : terms) t = std::abs(t);
        std::vector<int64_t> n(vocab, 1);
        for (size_t p = 0; p < tokens.size(); ++p) {
          ++n[tokens[p]];
          for (int64_t j = 0; j < d; ++j) terms[tokens[p] * d + j] += std::abs(lookups[p * d + j]);
        }
        for (int64_t v = 0; v < vocab; ++v)
          for (int64_t j = 0; j < d; ++j)
            bound[v * d + j] = 1.01 * 2 * (n[v] - 1) * test_util::kF32Unit * terms[v * d + j];
        const test_util::BoundUsed used =
            test_util::WorstFractionOfBound(sum.ToVector<float>(), w.grad.ToVector<float>(), bound, 1.0);
        EXPECT_LE(used.fraction, 1.0) << name << " element " << used.index;
        std::printf("  %-40s summation bound used %.3f\n", name.c_str(), used.fraction);
      }
    }
  }
}

}  // namespace
}  // namespace switchyard::model
