// One whole training step on a CUDA device against the same step on the CPU, and
// checkpoints crossing between the two. The decoder is a tiny MoE model of every part the
// trainer uses (rope + GQA attention, rmsnorm, swiglu experts, top-2 routing with capacity
// drops, jitter, z-loss, a dense MLP block); both devices start from the same weights
// (copied, so initialisation rounding cannot differ) and see the same tokens.
//
//  - f32 matrix products: losses to 1e-5 relative, routing counts exact, every gradient
//    to 1e-4 of the tensor's largest magnitude (sums run in another order on the GPU), and
//    every weight after one AdamW step within the bound those gradients allow
//    (ExpectSameFirstAdamStep: AdamW's first step moves each weight by about lr whatever the
//    gradient's size, so a gradient that is rounding noise moves it either way by lr).
//  - bf16 matrix products (DeviceContext::set_matmul_dtype on both devices; the CPU rounds
//    the operands the same way): losses to 1e-3 relative.
//  - The head in chunks on the GPU against the CPU's whole head, to the f32 bounds.
//  - A checkpoint saved from the GPU loads on the CPU bit for bit, and the other way round.
//  - One micro-batch captured into a CUDA graph and replayed on another batch equals an
//    eager step on that batch, bit for bit (runtime.cuda_graphs).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/captured_work.h"
#include "engine/core/device_context.h"
#include "engine/core/step_readback.h"
#include "engine/dist/communicator.h"
#include "engine/dist/mesh.h"
#include "engine/model/decoder.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/config/config.h"
#include "engine/train/optimizer.h"
#include "moe/router.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard::train {
namespace {

namespace fs = std::filesystem;

constexpr char kTinyMoE[] = R"(
model: {vocab_size: 96, seq_len: 16, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2,
        d_ff: 64, norm: rmsnorm, position: rope, activation: swiglu, tie_embeddings: false}
moe: {num_experts: 4, layer_freq: 2, top_k: 2, d_expert: 48, activation: swiglu,
      normalize_gates: true, jitter_eps: 0.01, capacity_factor: 1.0, z_loss_coef: 0.001,
      aux_loss_coef: 0.01}
train: {lr: 0.001, weight_decay: 0.1}
)";

constexpr int64_t kBatch = 4, kSeq = 16;

// One device's model, with the context and size-1 communicator it runs on.
struct Replica {
  std::unique_ptr<DeviceContext> ctx;
  std::unique_ptr<dist::Communicator> ep;
  std::unique_ptr<model::Decoder> decoder;
};

Replica MakeReplica(const config::Config& config, Device device) {
  Replica r;
  r.ctx = DeviceContext::Create(device);
  r.ep = dist::MakeLocalCommunicator(device, 0, r.ctx.get());
  auto dec = model::Decoder::Create(config.model, config.moe, 7, r.ep.get(), r.ctx.get());
  SY_CHECK_OK(dec.status());
  r.decoder = std::move(*dec);
  return r;
}

// Copies every parameter of `from` into `to` (same names, same order).
void CopyWeights(model::Decoder& from, Replica& to) {
  auto& src = from.registry().params();
  auto& dst = to.decoder->registry().params();
  ASSERT_EQ(src.size(), dst.size());
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(src[i].name, dst[i].name);
    dst[i].value.CopyFrom(src[i].value, to.ctx.get());
  }
  to.ctx->Synchronize();
}

// Random tokens and targets (a few masked), the same on every device.
std::pair<Tensor, Tensor> Batch(int64_t vocab, uint32_t seed = 12345) {
  std::vector<int32_t> tokens(kBatch * kSeq), targets(kBatch * kSeq);
  uint32_t state = seed;
  for (size_t i = 0; i < tokens.size(); ++i) {
    state = state * 1664525u + 1013904223u;
    tokens[i] = static_cast<int32_t>((state >> 8) % vocab);
    state = state * 1664525u + 1013904223u;
    targets[i] = (i % 11 == 5) ? -1 : static_cast<int32_t>((state >> 8) % vocab);
  }
  return {Tensor::FromVector(tokens, {kBatch, kSeq}), Tensor::FromVector(targets, {kBatch, kSeq})};
}

model::DecoderOutput Step(Replica& r, const Tensor& tokens, const Tensor& targets) {
  const Device device = r.ctx->device();
  model::DecoderInput in{.tokens = tokens.To(device, r.ctx.get()),
                         .targets = targets.To(device, r.ctx.get()),
                         .first_token = 0,
                         .step = 3,
                         .training = true,
                         .ce_grad_scale = 1.0f / static_cast<float>(kBatch * kSeq),
                         .aux_grad_scale = 1.0f};
  r.decoder->registry().ZeroGrad(r.ctx.get());
  model::DecoderOutput out = r.decoder->Forward(in);
  r.decoder->Backward(in, out);
  r.ctx->Synchronize();
  return out;
}

// max |a - b| / max(max |a|, tiny), over two tensors of one shape on any devices.
double RelMaxDiff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.ToVector<float>(), y = b.ToVector<float>();
  EXPECT_EQ(x.size(), y.size());
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    diff = std::max(diff, std::fabs(double(x[i]) - double(y[i])));
    scale = std::max(scale, std::fabs(double(x[i])));
  }
  return diff / scale;
}

// After one AdamW step (bias-corrected: each weight moves by lr g / (|g| + eps), plus the decay)
// from gradients that differ by at most delta (measured over the tensor), a weight's two
// updates differ by at most lr delta / (|g| - delta) where |g| > delta (same sign:
// |a/(a+e) - b/(b+e)| <= |a - b| / min(a, b)), else by at most 2 lr (the sign may differ: a
// gradient that is zero in exact arithmetic, such as a key bias's, is rounding noise on both
// devices). Plus f32 rounding of the weight and of the update.
void ExpectSameFirstAdamStep(const parallel::Parameter& cpu, const parallel::Parameter& gpu,
                             float lr) {
  const std::vector<float> gc = cpu.grad.ToVector<float>(), gg = gpu.grad.ToVector<float>();
  const std::vector<float> pc = cpu.value.ToVector<float>(), pg = gpu.value.ToVector<float>();
  ASSERT_EQ(gc.size(), gg.size());
  ASSERT_EQ(pc.size(), pg.size());
  double delta = 0;
  for (size_t j = 0; j < gc.size(); ++j) delta = std::max(delta, std::fabs(double(gc[j]) - gg[j]));
  int64_t bad = 0;
  for (size_t j = 0; j < pc.size(); ++j) {
    const double g = std::fabs(double(gc[j]));
    const double moved = g > delta ? std::min(2.0, delta / (g - delta)) : 2.0;
    const double bound = lr * moved + 1e-6 * (std::fabs(double(pc[j])) + lr);
    if (std::fabs(double(pc[j]) - pg[j]) > bound && bad++ < 3) {
      ADD_FAILURE() << cpu.name << "[" << j << "]: cpu " << pc[j] << ", gpu " << pg[j]
                    << " (gradients " << gc[j] << ", " << gg[j] << "; bound " << bound << ")";
    }
  }
  EXPECT_EQ(bad, 0) << "weights of " << cpu.name << " outside the bound";
}

class TrainGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SY_REQUIRE_GPU();
    auto config = config::ParseConfig(kTinyMoE, "<train_gpu_test>");
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
  }
  config::Config config_;
};

TEST_F(TrainGpuTest, OneStepMatchesTheCpuInF32) {
  Replica cpu = MakeReplica(config_, Device::Cpu());
  Replica gpu = MakeReplica(config_, Device::Cuda(0));
  CopyWeights(*cpu.decoder, gpu);
  auto [tokens, targets] = Batch(config_.model.vocab_size);

  model::DecoderOutput c = Step(cpu, tokens, targets);
  model::DecoderOutput g = Step(gpu, tokens, targets);
  EXPECT_EQ(g.ce_count, c.ce_count);
  EXPECT_NEAR(g.ce_sum, c.ce_sum, 1e-5 * std::fabs(c.ce_sum));
  EXPECT_NEAR(g.aux_sum, c.aux_sum, 1e-5 * std::fabs(c.aux_sum) + 1e-9);
  EXPECT_NEAR(g.z_sum, c.z_sum, 1e-5 * std::fabs(c.z_sum) + 1e-9);
  ASSERT_EQ(g.moe_stats.size(), c.moe_stats.size());
  for (size_t l = 0; l < c.moe_stats.size(); ++l) {
    EXPECT_EQ(g.moe_stats[l].tokens_per_expert, c.moe_stats[l].tokens_per_expert) << "layer " << l;
    EXPECT_EQ(g.moe_stats[l].dropped(), c.moe_stats[l].dropped()) << "layer " << l;
  }
  auto& cp = cpu.decoder->registry().params();
  auto& gp = gpu.decoder->registry().params();
  for (size_t i = 0; i < cp.size(); ++i) {
    if (!cp[i].grad.defined()) continue;
    EXPECT_LT(RelMaxDiff(gp[i].grad, cp[i].grad), 1e-4) << "gradient of " << cp[i].name;
  }

  // One AdamW step on each device from those gradients.
  Optimizer cpu_opt(cpu.decoder->registry(), train::OptimizerOptionsFor(config_.train), cpu.ctx.get());
  Optimizer gpu_opt(gpu.decoder->registry(), train::OptimizerOptionsFor(config_.train), gpu.ctx.get());
  cpu_opt.Step(1e-3f);
  gpu_opt.Step(1e-3f);
  gpu.ctx->Synchronize();
  for (size_t i = 0; i < cp.size(); ++i) {
    if (!cp[i].grad.defined()) continue;
    ExpectSameFirstAdamStep(cp[i], gp[i], 1e-3f);
  }
}

// The head in chunks of 5 rows on the GPU (train.head_chunk_tokens: each chunk's logits a
// slice of its rows, computed again in backward) against the whole head on the CPU: the
// same bounds as the f32 step above.
TEST_F(TrainGpuTest, ChunkedHeadMatchesTheCpusWholeHead) {
  Replica cpu = MakeReplica(config_, Device::Cpu());
  Replica gpu = MakeReplica(config_, Device::Cuda(0));
  CopyWeights(*cpu.decoder, gpu);
  gpu.decoder->set_head_chunk(5);
  auto [tokens, targets] = Batch(config_.model.vocab_size);
  model::DecoderOutput c = Step(cpu, tokens, targets);
  model::DecoderOutput g = Step(gpu, tokens, targets);
  EXPECT_EQ(g.acts.head_chunk, 5);
  EXPECT_EQ(g.ce_count, c.ce_count);
  EXPECT_NEAR(g.ce_sum, c.ce_sum, 1e-5 * std::fabs(c.ce_sum));
  auto& cp = cpu.decoder->registry().params();
  auto& gp = gpu.decoder->registry().params();
  for (size_t i = 0; i < cp.size(); ++i) {
    if (!cp[i].grad.defined()) continue;
    EXPECT_LT(RelMaxDiff(gp[i].grad, cp[i].grad), 1e-4) << "gradient of " << cp[i].name;
  }
}

TEST_F(TrainGpuTest, OneStepMatchesTheCpuInBf16) {
  Replica cpu = MakeReplica(config_, Device::Cpu());
  Replica gpu = MakeReplica(config_, Device::Cuda(0));
  CopyWeights(*cpu.decoder, gpu);
  cpu.ctx->set_matmul_dtype(DType::kBF16);
  gpu.ctx->set_matmul_dtype(DType::kBF16);
  auto [tokens, targets] = Batch(config_.model.vocab_size);
  model::DecoderOutput c = Step(cpu, tokens, targets);
  model::DecoderOutput g = Step(gpu, tokens, targets);
  EXPECT_EQ(g.ce_count, c.ce_count);
  // Same bf16 operands on both sides; only f32 summation order differs, but a routing
  // decision can flip where two probabilities are within that rounding.
  EXPECT_NEAR(g.ce_sum, c.ce_sum, 1e-3 * std::fabs(c.ce_sum));
}

// runtime.cuda_graphs' mechanism on a GPU (engine/core/captured_work.h): one micro-batch's
// forward and backward captured into a CUDA graph (bf16 products, capacity routing with
// jitter, the step's readback window open as in training) on one batch at step 2, then
// replayed on another batch and step 3's router keys copied into the captured inputs: the
// readback slots, the loss sum and every gradient equal an eager step 3 on that batch with
// the keys passed from the host, bit for bit (the same kernels in the same order).
TEST_F(TrainGpuTest, ReplayedCudaGraphEqualsAnEagerStep) {
  const Device cuda = Device::Cuda(0);
  Replica gpu = MakeReplica(config_, cuda);
  gpu.ctx->set_matmul_dtype(DType::kBF16);
  DeviceContext* ctx = gpu.ctx.get();
  const int64_t vocab = config_.model.vocab_size, layers = config_.model.n_layers;
  auto [tokens1, targets1] = Batch(vocab, 12345);
  auto [tokens2, targets2] = Batch(vocab, 777);
  auto rng_values = [&](int64_t step) {
    return Tensor::FromVector(moe::RouterRngValues(config_.moe.seed, step, layers, 0),
                              {4 * layers})
        .To(cuda, ctx);
  };
  model::DecoderInput in{.tokens = tokens2.To(cuda, ctx),
                         .targets = targets2.To(cuda, ctx),
                         .step = 3,
                         .training = true,
                         .ids_checked = true,
                         .ce_grad_scale = 1.0f / static_cast<float>(kBatch * kSeq),
                         .aux_grad_scale = 1.0f};
  auto run = [&](StepReadback& readback) {
    ctx->set_step_readback(&readback);
    gpu.decoder->registry().ZeroGrad(ctx);
    model::DecoderOutput out = gpu.decoder->Forward(in);
    gpu.decoder->Backward(in, out);
    ctx->set_step_readback(nullptr);
    return out;
  };
  auto grads = [&] {
    std::vector<std::vector<float>> all;
    for (const auto& p : gpu.decoder->registry().params()) all.push_back(p.grad.ToVector<float>());
    return all;
  };
  // The eager reference (which also warms the allocator and cuBLAS): step 3, batch 2, keys
  // from the host.
  StepReadback eager_rb;
  model::DecoderOutput eager = run(eager_rb);
  const std::vector<double> eager_slots = eager_rb.ReadBack(ctx);
  const std::vector<std::vector<float>> eager_grads = grads();
  // Captured at step 2 on batch 1 with the keys in device memory ...
  in.tokens.CopyFrom(tokens1.To(cuda, ctx), ctx);
  in.targets.CopyFrom(targets1.To(cuda, ctx), ctx);
  in.step = 2;
  in.rng_values = rng_values(2);
  StepReadback captured;
  ctx->BeginCapture();
  model::DecoderOutput graphed = run(captured);
  std::unique_ptr<CapturedWork> work = ctx->EndCapture();
  EXPECT_GT(work->operations(), 50);
  // ... replayed as step 3 on batch 2.
  in.tokens.CopyFrom(tokens2.To(cuda, ctx), ctx);
  in.targets.CopyFrom(targets2.To(cuda, ctx), ctx);
  in.rng_values.CopyFrom(rng_values(3), ctx);
  work->Replay(ctx);
  const std::vector<double> graph_slots = captured.ReadBack(ctx);
  ASSERT_EQ(graph_slots.size(), eager_slots.size());
  for (size_t i = 0; i < graph_slots.size(); ++i) {
    EXPECT_EQ(graph_slots[i], eager_slots[i]) << "readback slot " << i;
  }
  PendingSum ce_eager = eager.ce_sum, ce_graph = graphed.ce_sum;
  ce_eager.Resolve(eager_slots);
  ce_graph.Resolve(graph_slots);
  EXPECT_EQ(static_cast<double>(ce_graph), static_cast<double>(ce_eager));
  const std::vector<std::vector<float>> graph_grads = grads();
  ASSERT_EQ(graph_grads.size(), eager_grads.size());
  for (size_t i = 0; i < graph_grads.size(); ++i) {
    EXPECT_EQ(graph_grads[i], eager_grads[i]) << gpu.decoder->registry().params()[i].name;
  }
}

TEST_F(TrainGpuTest, CheckpointsCrossBetweenGpuAndCpu) {
  const fs::path root = fs::path(::testing::TempDir()) / ("sy_train_gpu_" + std::to_string(::getpid()));
  fs::remove_all(root);
  auto host_world = dist::MakeLocalCommunicator();
  auto mesh = dist::Mesh::Create(1, {});
  ASSERT_TRUE(mesh.ok()) << mesh.status();

  for (bool gpu_first : {true, false}) {
    Replica from = MakeReplica(config_, gpu_first ? Device::Cuda(0) : Device::Cpu());
    Replica to = MakeReplica(config_, gpu_first ? Device::Cpu() : Device::Cuda(0));
    // Make `from` differ from a fresh init: one step of training.
    auto [tokens, targets] = Batch(config_.model.vocab_size);
    Step(from, tokens, targets);
    Optimizer opt(from.decoder->registry(), train::OptimizerOptionsFor(config_.train), from.ctx.get());
    opt.Step(1e-2f);
    from.ctx->Synchronize();

    const std::string out = (root / (gpu_first ? "from_gpu" : "from_cpu")).string();
    checkpoint::CheckpointContents contents{.params = &from.decoder->registry(),
                                .optimizer_state = opt.State(),
                                .trainer_state_json = "{}",
                                .config_yaml = config_.ToYaml()};
    ASSERT_TRUE(checkpoint::SaveCheckpoint(out, 1, contents, *host_world, *mesh).ok());

    Optimizer to_opt(to.decoder->registry(), train::OptimizerOptionsFor(config_.train), to.ctx.get());
    std::vector<parallel::Parameter> state = to_opt.State();
    auto loaded = checkpoint::LoadCheckpoint(out, to.decoder->registry(), &state, *host_world);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(to_opt.step(), 1);
    auto& fp = from.decoder->registry().params();
    auto& tp = to.decoder->registry().params();
    for (size_t i = 0; i < fp.size(); ++i) {
      EXPECT_EQ(tp[i].value.device(), to.ctx->device());
      EXPECT_EQ(tp[i].value.ToVector<float>(), fp[i].value.ToVector<float>())
          << fp[i].name << (gpu_first ? " GPU -> CPU" : " CPU -> GPU");
    }
    const std::vector<parallel::Parameter> from_state = opt.State();
    for (size_t i = 0; i + 1 < state.size(); ++i) {  // the last entry is the step counter
      EXPECT_EQ(state[i].value.ToVector<float>(), from_state[i].value.ToVector<float>())
          << state[i].name;
    }
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace switchyard::train
