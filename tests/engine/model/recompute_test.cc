// Activation recompute (engine/model/recompute.h) on one rank:
//  - none, selective and full give bit for bit the same losses (ce, aux, z), MoE statistics
//    and routing, and the same gradient of every parameter, for a Switch-style decoder
//    (top-1, capacity drops, jitter, tied), a GShard-style one (top-2, the random second
//    choice, drops, jitter) and a Mixtral-style one (rope, swiglu, GQA, top-2, untied);
//    each mode keeps what it says (full: the block inputs alone; selective: no core
//    attention output or lse).
//  - under simulated ZeRO-3 hooks that poison a part's parameters (NaN) whenever it is
//    released, every mode still gives the same bits: the recompute forward in Backward
//    reads a block only while the block is acquired.
//  - pipeline stages under full recompute (the later ones reading DecoderInput::hidden)
//    chained give the whole decoder's gradients bit for bit.
//  - the workspace peak of Forward + Backward (engine/core/allocator.h's ledger) falls
//    strictly from none to selective to full.
#include "engine/model/recompute.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/allocator.h"
#include "engine/core/philox.h"
#include "engine/dist/communicator.h"
#include "engine/model/decoder.h"
#include "engine/model/stage.h"
#include "tests/engine/model/model_test_util.h"

namespace switchyard::model {
namespace {

using testing::LlamaLike;
using testing::BackwardChain;
using testing::ChainRun;
using testing::ForwardChain;
using testing::ForwardBackward;
using testing::MixtralLike;
using testing::Result;

using parallel::Parameter;

constexpr Recompute kModes[] = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};

struct Case {
  const char* name;
  ModelConfig model;
  moe::MoEConfig moe;
};

std::vector<Case> Cases() {
  // Switch: MoE every other layer, top-1, capacity 1 (drops), jitter, tied head.
  ModelConfig gpt{.vocab_size = 13, .seq_len = 6, .d_model = 8, .n_layers = 4, .n_heads = 2,
                  .d_ff = 12};
  moe::MoEConfig sw{.num_experts = 4, .layer_freq = 2, .top_k = 1, .d_expert = 6,
                    .jitter_eps = 0.1f, .capacity_factor = 1.0f, .eval_capacity_factor = 0.0f,
                    .aux_loss_coef = 0.1f, .z_loss_coef = 0.01f};
  // GShard: top-2 with the random second choice, every layer MoE, drops and jitter.
  moe::MoEConfig gshard = sw;
  gshard.layer_freq = 1;
  gshard.top_k = 2;
  gshard.second_expert_policy = moe::SecondExpertPolicy::kRandom;
  // Mixtral: rope, rmsnorm, swiglu, GQA, untied; top-2 with normalised gates, drops.
  const ModelConfig llama = LlamaLike(gpt);
  moe::MoEConfig mix = MixtralLike(sw);
  mix.jitter_eps = 0.0f;
  return {{"switch", gpt, sw}, {"gshard", gpt, gshard}, {"mixtral", llama, mix}};
}

DecoderInput Batch(const ModelConfig& m, int64_t batch) {
  const int64_t n = batch * m.seq_len;
  std::vector<int32_t> tokens(n), targets(n);
  for (int64_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<int32_t>(RandomBitsAt({11, 1}, i) % m.vocab_size);
    targets[i] = static_cast<int32_t>(RandomBitsAt({11, 2}, i) % m.vocab_size);
  }
  targets[3] = -1;  // a masked position
  DecoderInput in;
  in.tokens = Tensor::FromVector(tokens, {batch, m.seq_len});
  in.targets = Tensor::FromVector(targets, {batch, m.seq_len});
  in.first_token = 60;
  in.step = 5;
  in.ce_grad_scale = 1.0f / static_cast<float>(n - 1);
  in.aux_grad_scale = 0.5f;
  return in;
}

// got == want bit for bit: the numbers Forward reports and every gradient.
void ExpectSameBits(const Result& got, const Result& want) {
  EXPECT_EQ(got.out.ce_sum, want.out.ce_sum);
  EXPECT_EQ(got.out.ce_count, want.out.ce_count);
  EXPECT_EQ(got.out.aux_sum, want.out.aux_sum);
  EXPECT_EQ(got.out.z_sum, want.out.z_sum);
  ASSERT_EQ(got.out.moe_stats.size(), want.out.moe_stats.size());
  for (size_t l = 0; l < want.out.moe_stats.size(); ++l) {
    const moe::MoEStats &a = got.out.moe_stats[l], &b = want.out.moe_stats[l];
    EXPECT_EQ(a.tokens_per_expert, b.tokens_per_expert) << "MoE layer " << l;
    EXPECT_EQ(a.tokens_per_expert_kept, b.tokens_per_expert_kept) << "MoE layer " << l;
    EXPECT_EQ(a.entropy_sum, b.entropy_sum) << "MoE layer " << l;
    EXPECT_EQ(got.out.moe_indices[l].ToVector<int32_t>(), want.out.moe_indices[l].ToVector<int32_t>());
  }
  ASSERT_EQ(got.grads.size(), want.grads.size());
  int differ = 0;
  for (const auto& [name, g] : want.grads) {
    const std::vector<float>& mine = got.grads.at(name);
    const bool same = mine.size() == g.size() &&
                      std::memcmp(mine.data(), g.data(), g.size() * sizeof(float)) == 0;
    if (!same) ++differ;
    EXPECT_TRUE(same) << name << ": the gradient differs";
  }
  EXPECT_EQ(differ, 0);
}

std::unique_ptr<Decoder> Make(const Case& c, dist::Communicator* ep, Recompute mode,
                              const Stage& stage = Stage::Whole()) {
  auto dec = Decoder::Create(c.model, c.moe, 17, DecoderParallel{.ep = ep, .stage = stage});
  SY_CHECK_OK(dec.status());
  (*dec)->set_recompute(mode);
  return std::move(*dec);
}

TEST(RecomputeTest, ParseAndName) {
  for (Recompute mode : kModes) {
    auto parsed = ParseRecompute(RecomputeName(mode));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, mode);
  }
  auto bad = ParseRecompute("partial");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "train.recompute='partial' is not one of none, selective, full");
}

TEST(RecomputeTest, EveryModeGivesTheSameBits) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    auto ep = dist::MakeLocalCommunicator();
    const DecoderInput in = Batch(c.model, 4);
    std::unique_ptr<Decoder> none = Make(c, ep.get(), Recompute::kNone);
    const Result want = ForwardBackward(*none, in);
    // The case exercises what must be reproduced: drops, jitter, random second choices.
    int64_t dropped = 0, removed = 0;
    for (const moe::MoEStats& s : want.out.moe_stats) dropped += s.dropped();
    bool jitter = false;
    for (const BlockActivations& b : want.out.acts.blocks) {
      if (!b.moe) continue;
      const moe::RouterOutput& r = b.moe->acts.router[0];
      jitter = jitter || r.jitter.on;
      for (uint8_t k : r.keep.ToVector<uint8_t>()) removed += k == 0;
    }
    EXPECT_GT(dropped, 0) << "no assignment was dropped: capacity is not exercised";
    EXPECT_EQ(jitter, c.moe.jitter_eps > 0);
    EXPECT_EQ(removed > 0, c.moe.second_expert_policy == moe::SecondExpertPolicy::kRandom);
    std::printf("[%s] ce_sum %.9g aux_sum %.9g z_sum %.9g, %lld assignments dropped, %lld "
                "second choices removed\n",
                c.name, double(want.out.ce_sum), double(want.out.aux_sum), double(want.out.z_sum),
                static_cast<long long>(dropped), static_cast<long long>(removed));

    for (Recompute mode : {Recompute::kSelective, Recompute::kFull}) {
      SCOPED_TRACE(RecomputeName(mode));
      std::unique_ptr<Decoder> dec = Make(c, ep.get(), mode);
      DecoderOutput out = dec->Forward(in);
      // What the mode keeps.
      for (const BlockActivations& b : out.acts.blocks) {
        EXPECT_TRUE(b.x_in.defined());
        EXPECT_EQ(b.norm1.rstd.defined(), mode != Recompute::kFull);
        EXPECT_FALSE(b.norm1.y.defined());  // the projections keep their input themselves
        EXPECT_FALSE(b.attn.lse.defined());
        EXPECT_FALSE(b.attn.o.x.defined());
        EXPECT_EQ(b.attn.q.y.defined(), mode == Recompute::kSelective);
        EXPECT_FALSE(mode == Recompute::kFull && (b.mlp || b.moe));
      }
      dec->Backward(in, out);
      Result got;
      got.out = std::move(out);
      for (const Parameter& p : dec->registry().params())
        if (p.trainable) got.grads[p.name] = p.grad.ToVector<float>();
      ExpectSameBits(got, want);
    }
  }
}

// ZeRO-3 as the decoder sees it: a part's parameters hold NaN except between its acquire
// and its release, so a read outside that window poisons the loss or the gradients.
class PoisonedParts {
 public:
  explicit PoisonedParts(Decoder& dec) {
    for (Parameter& p : dec.registry().params()) {
      const std::string& name = p.name;
      const size_t dot = name.rfind("layers.", 0) == 0 ? name.find('.', 7) : name.find('.');
      parts_[name.substr(0, dot)].push_back({&p, p.value.Clone()});
    }
    for (auto& [part, ps] : parts_) Release(part);
    dec.set_parameter_hooks(
        {.acquire = [this](const parallel::PartId& part,
                           const parallel::PartId&) { Acquire(part.Name()); },
         .release = [this](const parallel::PartId& part) { Release(part.Name()); },
         .gradients = nullptr});
  }
  int acquires() const { return acquires_; }

 private:
  struct Held {
    Parameter* p;
    Tensor value;
  };
  void Acquire(const std::string& part) {
    ++acquires_;
    for (Held& h : parts_.at(part)) h.p->value.CopyFrom(h.value);
  }
  void Release(const std::string& part) {
    for (Held& h : parts_.at(part)) {
      float* v = h.p->value.data<float>();
      for (int64_t i = 0; i < h.p->value.numel(); ++i) v[i] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  std::map<std::string, std::vector<Held>> parts_;
  int acquires_ = 0;
};

TEST(RecomputeTest, ParameterHooksAreHonoured) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    auto ep = dist::MakeLocalCommunicator();
    const DecoderInput in = Batch(c.model, 4);
    std::unique_ptr<Decoder> none = Make(c, ep.get(), Recompute::kNone);
    const Result want = ForwardBackward(*none, in);
    ASSERT_TRUE(std::isfinite(want.out.ce_sum));
    for (Recompute mode : kModes) {
      SCOPED_TRACE(RecomputeName(mode));
      std::unique_ptr<Decoder> dec = Make(c, ep.get(), mode);
      PoisonedParts parts(*dec);
      ExpectSameBits(ForwardBackward(*dec, in), want);
      // embed, the layers, norm_f and the head (or the tied table), in Forward and Backward.
      const int parts_per_pass = 1 + static_cast<int>(c.model.n_layers) + 2;
      EXPECT_EQ(parts.acquires(), 2 * parts_per_pass);
    }
  }
}

// A chain of pipeline stages under full recompute (every stage after the first reads the
// previous one's output from DecoderInput::hidden and keeps it as its first block's input)
// equals the whole decoder without recompute, bit for bit.
TEST(RecomputeTest, StagesUnderFullRecompute) {
  const Case c = Cases()[2];  // untied: each parameter lives on one stage
  auto ep = dist::MakeLocalCommunicator();
  const DecoderInput in = Batch(c.model, 4);
  std::unique_ptr<Decoder> whole = Make(c, ep.get(), Recompute::kNone);
  const Result want = ForwardBackward(*whole, in);
  for (Recompute mode : {Recompute::kSelective, Recompute::kFull}) {
    SCOPED_TRACE(RecomputeName(mode));
    auto stages = PartitionLayers(c.model, c.moe, 3, std::vector<int64_t>{1, 2, 1});
    ASSERT_TRUE(stages.ok()) << stages.status();
    std::vector<std::unique_ptr<Decoder>> chain;
    for (const Stage& st : *stages) chain.push_back(Make(c, ep.get(), mode, st));
    ChainRun run = ForwardChain(chain, in);
    if (mode == Recompute::kFull) {  // a later stage's first block keeps the received input
      for (size_t s = 1; s < chain.size(); ++s) {
        EXPECT_EQ(run.outs[s].acts.blocks[0].x_in.data<float>(),
                  run.outs[s - 1].hidden.data<float>());
      }
    }
    EXPECT_EQ(run.outs.back().ce_sum, want.out.ce_sum);
    EXPECT_EQ(run.aux, want.out.aux_sum);
    EXPECT_EQ(run.z, want.out.z_sum);
    BackwardChain(chain, in, run);
    size_t seen = 0;
    for (const auto& dec : chain) {
      for (const Parameter& p : dec->registry().params()) {
        if (!p.trainable) continue;
        ++seen;
        EXPECT_EQ(p.grad.ToVector<float>(), want.grads.at(p.name)) << p.name;
      }
    }
    EXPECT_EQ(seen, want.grads.size());
  }
}

// The workspace (activations and scratch) peak over one Forward + Backward, above what was
// in use before (the parameters and gradients are created untagged, as workspace).
int64_t WorkspacePeak(Decoder& dec, const DecoderInput& in) {
  const Device cpu = Device::Cpu();
  const int64_t before = MemoryUseOf(cpu).in_use[static_cast<int>(MemoryKind::kWorkspace)];
  ResetMemoryPeaks(cpu);
  {
    DecoderOutput out = dec.Forward(in);
    dec.Backward(in, out);
  }
  return MemoryUseOf(cpu).peak[static_cast<int>(MemoryKind::kWorkspace)] - before;
}

TEST(RecomputeTest, PeakActivationMemoryFalls) {
  // A small Switch-style model with enough tokens that the blocks' activations dominate.
  Case c = Cases()[0];
  c.model.seq_len = 32;
  c.model.d_model = 32;
  c.model.n_heads = 4;
  c.model.d_ff = 64;
  c.moe.d_expert = 32;
  c.moe.capacity_factor = 1.25f;
  auto ep = dist::MakeLocalCommunicator();
  const DecoderInput in = Batch(c.model, 8);
  std::unique_ptr<Decoder> dec = Make(c, ep.get(), Recompute::kNone);
  std::map<Recompute, int64_t> peak;
  for (Recompute mode : kModes) {
    dec->set_recompute(mode);
    peak[mode] = WorkspacePeak(*dec, in);
    std::printf("[%s] workspace peak over Forward + Backward: %lld bytes (%d layers, batch 8 x "
                "%lld tokens, d_model %lld)\n",
                RecomputeName(mode), static_cast<long long>(peak[mode]),
                static_cast<int>(c.model.n_layers), static_cast<long long>(c.model.seq_len),
                static_cast<long long>(c.model.d_model));
  }
  EXPECT_LT(peak[Recompute::kFull], peak[Recompute::kSelective]);
  EXPECT_LT(peak[Recompute::kSelective], peak[Recompute::kNone]);
  EXPECT_GT(peak[Recompute::kFull], 0);
}

}  // namespace
}  // namespace switchyard::model
