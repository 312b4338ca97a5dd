// runtime.cuda_graphs on the CPU, where the capture is emulated (engine/core/captured_work.h):
// every kernel and tensor copy of the micro-batches is recorded once, at the second step,
// and replayed at the later ones with their batches copied into the captured inputs. A
// replayed step runs no host code of the forward or backward, so any value the device work
// took from the host at capture and that changes from step to step (a batch, a step count, a
// size read back) would show as a difference here.
//
//  - ReplayedStepsAreBitIdentical: the tiny config (tests/data/train-tiny.yaml: jitter) at
//    capacity 1.25 and dropless, f32 and bf16 (with its weight shadows), top-2 with GShard's
//    random second expert, without any draws, with the gradient sync's buckets marked
//    during the backward (unordered accumulation), with one micro-batch, with bf16
//    activation storage, full recompute and the head in chunks, and with swiglu experts
//    with biases under rope and rmsnorm, with validation between steps, and with the
//    sequence and global aux-loss scopes (their terms on the device; the global scope's
//    load, which each step's update changes, read from its buffer at replay): the losses of 6 steps, every weight after them and the routing-by-
//    language counts (recorded in the run's second half from the choices a replay leaves)
//    are the same with and without the graph, and 5 of the 6 steps were replays (the first
//    warms up). The router's per-step keys are read from device memory in graph mode
//    (moe::RouterRngValues), from host arguments in eager mode: the same numbers.
//  - AResumedGraphedRunContinuesAsTheEagerOne: saved after 3 graphed steps and resumed
//    graphed (captured again), the last 3 losses are the uninterrupted eager run's bits.
//  - ConfigChecks: the switch refuses, each with one error naming its key, what a replay
//    cannot repeat: more than one rank, host dispatch counts, overlapped exchanges.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <memory>
#include <string>
#include <vector>

#include "tests/dist/train_fixture.h"

namespace switchyard::train::testing {
namespace {

class CudaGraphsTest : public TrainFixture {};

std::unique_ptr<Trainer> TrainTiny(std::vector<std::string> overrides, const std::string& out,
                                   int64_t steps) {
  overrides.push_back("train.max_steps=" + std::to_string(steps));
  static std::unique_ptr<dist::Communicator> local =
      dist::MakeLocalCommunicator(Device::Cpu(), 0);
  auto trainer = TrainFixture::Train(TrainFixture::TinyConfig(overrides), out, *local);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  return trainer.ok() ? std::move(*trainer) : nullptr;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST_F(CudaGraphsTest, ReplayedStepsAreBitIdentical) {
  if (!is_root()) return;
  constexpr int64_t kSteps = 6;
  const std::vector<std::vector<std::string>> cases = {
      {},                                   // capacity 1.25, jitter, fp32
      {"moe.capacity_factor=0"},            // dropless
      {"runtime.precision=bf16"},           // bf16 products, weight shadows
      {"moe.capacity_factor=0", "runtime.precision=bf16", "train.eval_every=2",
       "train.eval_batches=2"},
      {"moe.top_k=2", "moe.second_expert_policy=random"},  // GShard's random second expert
      {"moe.jitter_eps=0"},                 // no draws at all
      {"train.ordered_grad_accum=false"},   // gradients reduced during the last backward
      {"train.grad_accum=1", "train.micro_batch_size=16"},  // one micro-batch
      {"runtime.precision=bf16", "runtime.activation_dtype=bf16", "train.recompute=full",
       "train.head_chunk_tokens=5"},        // bf16 storage, recompute, the head in chunks
      {"moe.activation=swiglu", "model.activation=swiglu", "model.norm=rmsnorm",
       "model.position=rope", "moe.bias=true"},  // swiglu experts with biases, rope
      {"moe.aux_loss_scope=sequence"},      // each sequence's terms, on the device
      {"moe.aux_loss_scope=global", "moe.capacity_factor=0"},  // the load, read at replay
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE("case " + std::to_string(c));
    std::vector<std::string> graphed = cases[c];
    graphed.push_back("runtime.cuda_graphs=true");
    auto eager = TrainTiny(cases[c], dir("eager" + std::to_string(c)), kSteps);
    auto graph = TrainTiny(graphed, dir("graph" + std::to_string(c)), kSteps);
    ASSERT_NE(eager, nullptr);
    ASSERT_NE(graph, nullptr);
    EXPECT_EQ(graph->graph_replays(), kSteps - 1);
    EXPECT_GT(graph->graph_operations(), 100);
    ASSERT_EQ(eager->losses().size(), static_cast<size_t>(kSteps));
    ExpectSameBits(*graph, *eager);
    // The run's second half records routing by language: after a replay, from the choices
    // the captured forwards left. The same counts as the eager forwards'.
    const std::string routing = ReadFile(dir("eager" + std::to_string(c)) + "/routing_by_language.json");
    EXPECT_FALSE(routing.empty());
    EXPECT_EQ(ReadFile(dir("graph" + std::to_string(c)) + "/routing_by_language.json"), routing);
  }
}

// A graphed run saved at step 3 and resumed graphed (the resume captures again) continues as
// the uninterrupted eager run does: the same losses, bit for bit.
TEST_F(CudaGraphsTest, AResumedGraphedRunContinuesAsTheEagerOne) {
  if (!is_root()) return;
  constexpr int64_t kTotal = 6, kFirst = 3;
  auto eager = TrainTiny({}, dir("resume_eager"), kTotal);
  ASSERT_NE(eager, nullptr);
  const std::vector<std::string> graphed = {"runtime.cuda_graphs=true",
                                            "train.max_steps=" + std::to_string(kTotal)};
  static std::unique_ptr<dist::Communicator> local =
      dist::MakeLocalCommunicator(Device::Cpu(), 0);
  {
    auto first = Train(TinyConfig(graphed), dir("resume_graph"), *local, kFirst);
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_EQ((*first)->graph_replays(), kFirst - 1);
  }
  QuietStdout quiet;
  auto resumed = Trainer::Create(TinyConfig(graphed), dir("resume_graph2"), *local);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  const Status loaded = (*resumed)->Resume(dir("resume_graph"));
  ASSERT_TRUE(loaded.ok()) << loaded;
  const Status ran = (*resumed)->Run(0);
  ASSERT_TRUE(ran.ok()) << ran;
  EXPECT_EQ((*resumed)->graph_replays(), kTotal - kFirst - 1);
  const std::vector<double>& got = (*resumed)->losses();
  ASSERT_EQ(got.size(), static_cast<size_t>(kTotal - kFirst));
  for (int64_t s = kFirst; s < kTotal; ++s) {
    EXPECT_EQ(std::memcmp(&got[s - kFirst], &eager->losses()[s], sizeof(double)), 0)
        << "step " << s << ": " << got[s - kFirst] << " vs " << eager->losses()[s];
  }
}

TEST_F(CudaGraphsTest, ConfigChecks) {
  if (!is_root()) return;
  struct Case {
    std::vector<std::string> overrides;
    int world;
    std::string names;
  };
  const std::vector<Case> cases = {
      {{}, 2, "runs on one rank"},
      {{"moe.dispatch_counts=host"}, 1, "moe.dispatch_counts=device"},
      {{"moe.overlap_chunks=2"}, 1, "moe.overlap_chunks=1"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> overrides = c.overrides;
    overrides.push_back("runtime.cuda_graphs=true");
    const config::Config config = TinyConfig(overrides);
    const Status s = config.Validate(c.world);
    ASSERT_FALSE(s.ok()) << c.names;
    EXPECT_NE(std::string(s.message()).find(c.names), std::string::npos) << s;
    EXPECT_NE(std::string(s.message()).find("runtime.cuda_graphs"), std::string::npos) << s;
    // Without the switch the same config is fine (on one rank).
    overrides.back() = "runtime.cuda_graphs=false";
    EXPECT_TRUE(TinyConfig(overrides).Validate(1).ok()) << c.names;
  }
}

}  // namespace
}  // namespace switchyard::train::testing
