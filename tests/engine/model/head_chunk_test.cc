// Head chunking (train.head_chunk_tokens, Decoder::set_head_chunk) on one rank:
//  - a chunk of at least the micro-batch's rows is the whole head: the same bits;
//  - chunks of 1, 5 and N-1 rows (an uneven last chunk included), for a tied head (GPT-2
//    style) and an untied head with a bias (Mixtral style, swiglu, GQA): everything before
//    the head is the same bits (the MoE statistics and routing), the target count is exact,
//    and the loss and every gradient agree with the whole head to rounding. The two differ
//    only in the order of the head's sums (the products' k-blocks for a chunk's rows, the
//    weight gradient's sum over rows chunk by chunk, the loss summed chunk by chunk), each
//    a relative change of a few k u (u = 2^-24, k <= 48 here) that backward carries
//    through a few layers: 1e-5 is a bound with room, and one wrong row breaks it by far
//    (SkippingARowIsCaught shows the scale). A key bias's gradient is exactly 0 (the
//    softmax removes it), so there both sides are noise, checked against the query bias's;
//  - a training Forward keeps no logits and records the chunk; an evaluation Forward
//    (training false) chunked gives the whole head's loss to rounding and keeps nothing;
//  - the workspace peak of Forward + Backward (the allocator's ledger) falls by at least
//    the logits it no longer keeps, (N - 2 chunk) V 4 bytes, on a model whose head dominates.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/allocator.h"
#include "engine/core/philox.h"
#include "engine/dist/communicator.h"
#include "engine/model/decoder.h"
#include "tests/engine/model/model_test_util.h"
#include "tests/testing/tolerance.h"

namespace switchyard::model {
namespace {

using parallel::Parameter;
using testing::LlamaLike;
using testing::ForwardBackward;
using testing::MixtralLike;
using testing::Result;

constexpr double kGradTol = 1e-5;

struct Case {
  const char* name;
  ModelConfig model;
  moe::MoEConfig moe;
};

std::vector<Case> Cases() {
  ModelConfig gpt{.vocab_size = 29, .seq_len = 6, .d_model = 8, .n_layers = 2, .n_heads = 2,
                  .d_ff = 12};
  moe::MoEConfig sw{.num_experts = 4, .layer_freq = 2, .top_k = 1, .d_expert = 6,
                    .jitter_eps = 0.1f, .capacity_factor = 1.0f, .eval_capacity_factor = 0.0f,
                    .aux_loss_coef = 0.1f, .z_loss_coef = 0.01f};
  ModelConfig llama = LlamaLike(gpt);
  llama.tie_embeddings = false;
  llama.bias = true;  // the untied head's bias gradient is summed chunk by chunk too
  moe::MoEConfig mix = MixtralLike(sw);
  mix.jitter_eps = 0.0f;
  return {{"tied", gpt, sw}, {"untied_bias", llama, mix}};
}

DecoderInput Batch(const ModelConfig& m, int64_t batch, bool training = true) {
  const int64_t n = batch * m.seq_len;
  std::vector<int32_t> tokens(n), targets(n);
  for (int64_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<int32_t>(RandomBitsAt({13, 1}, i) % m.vocab_size);
    targets[i] = static_cast<int32_t>(RandomBitsAt({13, 2}, i) % m.vocab_size);
  }
  targets[3] = -1;  // masked positions, one in the last chunk
  targets[n - 2] = -1;
  DecoderInput in;
  in.tokens = Tensor::FromVector(tokens, {batch, m.seq_len});
  in.targets = Tensor::FromVector(targets, {batch, m.seq_len});
  in.first_token = 24;
  in.step = 3;
  in.training = training;
  in.ce_grad_scale = 1.0f / static_cast<float>(n - 2);
  in.aux_grad_scale = 0.5f;
  return in;
}


std::unique_ptr<Decoder> Make(const Case& c, dist::Communicator* ep, int64_t chunk) {
  auto dec = Decoder::Create(c.model, c.moe, 21, DecoderParallel{.ep = ep});
  SY_CHECK_OK(dec.status());
  (*dec)->set_head_chunk(chunk);
  return std::move(*dec);
}

// The routing and statistics (computed before the head) are the same bits.
void ExpectSameRouting(const DecoderOutput& got, const DecoderOutput& want) {
  EXPECT_EQ(got.aux_sum, want.aux_sum);
  EXPECT_EQ(got.z_sum, want.z_sum);
  ASSERT_EQ(got.moe_stats.size(), want.moe_stats.size());
  for (size_t l = 0; l < want.moe_stats.size(); ++l) {
    EXPECT_EQ(got.moe_stats[l].tokens_per_expert, want.moe_stats[l].tokens_per_expert);
    EXPECT_EQ(got.moe_indices[l].ToVector<int32_t>(), want.moe_indices[l].ToVector<int32_t>());
  }
}

TEST(HeadChunkTest, ChunksAgreeWithTheWholeHead) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    auto ep = dist::MakeLocalCommunicator();
    const DecoderInput in = Batch(c.model, 4);
    const int64_t n = in.tokens.numel();
    const Result want = ForwardBackward(*Make(c, ep.get(), 0), in);
    EXPECT_TRUE(want.out.acts.dlogits.defined());
    EXPECT_EQ(want.out.acts.head_chunk, 0);
    for (int64_t chunk : {n, 2 * n}) {  // at least every row: the whole head, the same bits
      const Result got = ForwardBackward(*Make(c, ep.get(), chunk), in);
      EXPECT_EQ(got.out.ce_sum, want.out.ce_sum);
      EXPECT_EQ(got.out.ce_count, want.out.ce_count);
      ExpectSameRouting(got.out, want.out);
      for (const auto& [name, g] : want.grads) {
        const std::vector<float>& mine = got.grads.at(name);
        EXPECT_EQ(std::memcmp(mine.data(), g.data(), g.size() * sizeof(float)), 0) << name;
      }
    }
    for (int64_t chunk : {int64_t{1}, int64_t{5}, n - 1}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      std::unique_ptr<Decoder> dec = Make(c, ep.get(), chunk);
      Result got;
      got.out = dec->Forward(in);
      // What a chunked training Forward keeps: no logits, the chunk.
      EXPECT_FALSE(got.out.acts.dlogits.defined());
      EXPECT_EQ(got.out.acts.head_chunk, chunk);
      EXPECT_EQ(got.out.acts.head_in.ToVector<float>(), want.out.acts.head_in.ToVector<float>());
      dec->Backward(in, got.out);
      for (const Parameter& p : dec->registry().params())
        if (p.trainable) got.grads[p.name] = p.grad.ToVector<float>();
      EXPECT_EQ(got.out.ce_count, want.out.ce_count);
      EXPECT_EQ(got.out.ce_count, n - 2);
      ExpectSameRouting(got.out, want.out);
      const double ce = got.out.ce_sum, ce_want = want.out.ce_sum;
      EXPECT_LE(std::abs(ce - ce_want), 1e-6 * std::abs(ce_want)) << ce << " vs " << ce_want;
      ASSERT_EQ(got.grads.size(), want.grads.size());
      for (const auto& [name, g] : want.grads) {
        if (!(c.model.position == Position::kRope) && name.ends_with(".attn.k.bias")) continue;  // below
        test_util::ExpectRelativeNormWithin(got.grads.at(name), g, kGradTol, name);
      }
      // Without rope a key bias adds q.b to every score of a query's row, which the softmax
      // takes out: its exact gradient is 0 and both sides hold rounding noise, small
      // against the query bias's gradient.
      for (const char* layer : {"layers.0", "layers.1"}) {
        if ((c.model.position == Position::kRope)) break;
        const std::string k = std::string(layer) + ".attn.k.bias", q = std::string(layer) + ".attn.q.bias";
        double nk = 0, nq = 0;
        for (float v : got.grads.at(k)) nk += double(v) * v;
        for (float v : want.grads.at(q)) nq += double(v) * v;
        EXPECT_LE(std::sqrt(nk), kGradTol * std::sqrt(nq)) << k;
      }
    }
  }
}

// The scale of kGradTol: the whole head on a batch whose one row has another target (one
// row's loss term of N-2 changes) moves the head's gradient by far more than the bound.
TEST(HeadChunkTest, SkippingARowIsCaught) {
  const Case c = Cases()[1];
  auto ep = dist::MakeLocalCommunicator();
  const DecoderInput in = Batch(c.model, 4);
  DecoderInput other = in;
  std::vector<int32_t> t = in.targets.ToVector<int32_t>();
  t[7] = (t[7] + 1) % static_cast<int32_t>(c.model.vocab_size);
  other.targets = Tensor::FromVector(t, in.targets.shape());
  const Result a = ForwardBackward(*Make(c, ep.get(), 5), in);
  const Result b = ForwardBackward(*Make(c, ep.get(), 5), other);
  const double rel = test_util::RelativeNormError(b.grads.at("head.weight"), a.grads.at("head.weight"));
  std::printf("  one target changed: head.weight relative norm change %.3g (bound %.0g)\n", rel,
              kGradTol);
  EXPECT_GT(rel, 100 * kGradTol);
}

TEST(HeadChunkTest, EvaluationChunksAgreeWithTheWholeHead) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    auto ep = dist::MakeLocalCommunicator();
    const DecoderInput in = Batch(c.model, 4, /*training=*/false);
    const DecoderOutput want = Make(c, ep.get(), 0)->Forward(in);
    const DecoderOutput got = Make(c, ep.get(), 5)->Forward(in);
    EXPECT_EQ(got.acts.head_chunk, 0);  // nothing kept for a Backward
    EXPECT_FALSE(got.acts.dlogits.defined());
    EXPECT_EQ(got.ce_count, want.ce_count);
    const double ce = got.ce_sum, ce_want = want.ce_sum;
    EXPECT_LE(std::abs(ce - ce_want), 1e-6 * std::abs(ce_want)) << ce << " vs " << ce_want;
  }
}

// The workspace (activations and scratch) peak over one Forward + Backward.
int64_t WorkspacePeak(Decoder& dec, const DecoderInput& in) {
  const Device cpu = Device::Cpu();
  const int64_t before = MemoryUseOf(cpu).in_use[static_cast<int>(MemoryKind::kWorkspace)];
  ResetMemoryPeaks(cpu);
  DecoderOutput out = dec.Forward(in);
  dec.Backward(in, out);
  return MemoryUseOf(cpu).peak[static_cast<int>(MemoryKind::kWorkspace)] - before;
}

TEST(HeadChunkTest, PeakWorkspaceFallsByTheLogits) {
  Case c = Cases()[0];
  c.model.vocab_size = 512;  // the logits dominate the workspace
  auto ep = dist::MakeLocalCommunicator();
  const DecoderInput in = Batch(c.model, 8);
  const int64_t n = in.tokens.numel(), chunk = 4;
  std::unique_ptr<Decoder> whole = Make(c, ep.get(), 0);
  std::unique_ptr<Decoder> chunked = Make(c, ep.get(), chunk);
  const int64_t peak_whole = WorkspacePeak(*whole, in);
  const int64_t peak_chunked = WorkspacePeak(*chunked, in);
  const int64_t logits = n * c.model.vocab_size * 4, kept_chunk = chunk * c.model.vocab_size * 4;
  std::printf("  workspace peak over Forward + Backward: whole %lld B, chunks of %lld rows %lld B "
              "(N %lld, logits %lld B)\n",
              static_cast<long long>(peak_whole), static_cast<long long>(chunk),
              static_cast<long long>(peak_chunked), static_cast<long long>(n),
              static_cast<long long>(logits));
  EXPECT_GE(peak_whole - peak_chunked, logits - 2 * kept_chunk);
}

}  // namespace
}  // namespace switchyard::model
