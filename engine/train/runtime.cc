#include "engine/train/runtime.h"

#include <cstdlib>

#include "engine/parallel/context_parallel.h"
#ifdef SY_HAVE_CUDA
#include "engine/core/cublas_api.h"
#endif
#include "kernels/cross_entropy.h"
#include "engine/dist/process.h"

namespace switchyard::train {

StatusOr<Device> RankDevice(const config::RuntimeConfig& runtime, int world_rank) {
  SY_RETURN_IF_ERROR(runtime.Validate());
  if (runtime.device.is_cpu()) return Device::Cpu();
  const int count = CudaDeviceCount();
  if (count == 0) {
#ifdef SY_HAVE_CUDA
    return FailedPrecondition("runtime.device=", runtime.device,
                              ": no CUDA device is visible on this machine");
#else
    return FailedPrecondition("runtime.device=", runtime.device,
                              ": this build has no CUDA backend (SWITCHYARD_CUDA=OFF or no nvcc)");
#endif
  }
#ifdef SY_HAVE_CUDA
  // cuBLAS is opened at first use (engine/core/cublas_api.h): a missing one is this line, not
  // an abort inside the first product.
  if (const auto& blas = LoadCublas(); !blas.ok()) {
    return FailedPrecondition("runtime.device=", runtime.device, ": ", blas.status().message());
  }
#endif
  if (runtime.device.is_local_cuda()) {
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    const int local_rank = local ? std::atoi(local) : world_rank;
    return Device::Cuda(local_rank % count);
  }
  if (runtime.device.index >= count) {
    return FailedPrecondition("runtime.device=", runtime.device, ": only ", count,
                              " CUDA device(s) visible");
  }
  return Device::Cuda(runtime.device.index);
}

StatusOr<Runtime> MakeRuntime(const config::RuntimeConfig& runtime, dist::Communicator& world,
                              const dist::Mesh& mesh) {
  SY_ASSIGN_OR_RETURN(const Device device, RankDevice(runtime, world.rank()));
  Runtime rt;
  rt.ctx = DeviceContext::Create(device);
  // auto: bf16 on a GPU (DESIGN.md: CUDA computes in bf16), f32 on the CPU.
  const bool bf16 = runtime.precision == config::Precision::kBf16 ||
                    (runtime.precision == config::Precision::kAuto && device.is_cuda());
  rt.ctx->set_matmul_dtype(bf16 ? DType::kBF16 : DType::kF32);
  // runtime.activation_dtype (Validate: bf16 only with bf16 products).
  rt.ctx->set_activation_dtype(runtime.activation_dtype == config::ActivationDtype::kBf16
                                   ? DType::kBF16
                                   : DType::kF32);
  if (device.is_cuda() && world.size() > 1) {
    rt.device_world = dist::WorldCommunicator(device, rt.ctx.get());
    SY_ASSIGN_OR_RETURN(rt.device_pc, dist::ParallelContext::Create(*rt.device_world, mesh));
  }
  return rt;
}

StatusOr<std::vector<std::unique_ptr<model::Decoder>>> MakeStageDecoders(
    const config::Config& config, const Runtime& rt, dist::ParallelContext& host_pc) {
  dist::ParallelContext& pc = rt.data_pc(host_pc);
  const config::ParallelConfig& p = config.parallel;
  SY_ASSIGN_OR_RETURN(const std::vector<model::Stage> stages,
                      model::PartitionLayers(config.model, config.moe, p.pp * p.virtual_stages,
                                             p.pipeline_layers));
  // moe.dispatcher: the token exchange flat over ep, or hierarchical over the nodes.
  dist::Communicator* ep = &pc.ep();
  if (config.moe.dispatcher == moe::Dispatcher::kHierarchical) {
    SY_ASSIGN_OR_RETURN(ep, pc.ep_hierarchical());
  }
  std::vector<std::unique_ptr<model::Decoder>> chunks;
  for (int c = 0; c < p.virtual_stages; ++c) {
    const model::DecoderParallel parallel{.ep = ep,
                                          .tp = &pc.tp(),
                                          .sequence_parallel = p.tp > 1 && p.sequence_parallel,
                                          .etp = &pc.etp(),
                                          .stage = stages[c * p.pp + host_pc.pp().rank()],
                                          .cp = &pc.cp(),
                                          .tp_cp = &pc.tp_cp()};
    SY_ASSIGN_OR_RETURN(std::unique_ptr<model::Decoder> chunk,
                        model::Decoder::Create(config.model, config.moe, config.train.seed,
                                               parallel, rt.ctx.get()));
    chunk->set_recompute(config.train.recompute);
    chunk->set_head_chunk(config.train.head_chunk_tokens);
    chunks.push_back(std::move(chunk));
  }
  return chunks;
}

void CheckBatchIds(const data::Batch& batch, int64_t vocab) {
  const Tensor& in = batch.inputs;
  const Tensor& tg = batch.targets;
  SY_CHECK(in.device().is_cpu() && tg.device().is_cpu() && in.dtype() == DType::kI32 &&
           tg.dtype() == DType::kI32)
      << "a loader batch is i32 on the host";
  const int32_t* ids = in.data<int32_t>();
  for (int64_t i = 0; i < in.numel(); ++i) {
    SY_CHECK(ids[i] >= 0 && ids[i] < vocab)
        << "EmbeddingForward: id " << ids[i] << " at " << i << " is outside the table of "
        << vocab << " rows";
  }
  const int32_t* t = tg.data<int32_t>();
  for (int64_t i = 0; i < tg.numel(); ++i) {
    SY_CHECK(t[i] == kernels::kIgnoreIndex || (t[i] >= 0 && t[i] < vocab))
        << "CrossEntropyForwardBackward: target " << t[i] << " at row " << i
        << " is outside the vocabulary of " << vocab << " (ignore_index="
        << kernels::kIgnoreIndex << ")";
  }
}

model::DecoderInput MicroBatchInput(const data::Batch& batch, const model::Decoder& decoder,
                                    const dist::ParallelContext& pc, int64_t step,
                                    bool training) {
  const int cp = pc.cp().size(), rank = pc.cp().rank();
  CheckBatchIds(batch, decoder.config().vocab_size);
  return model::DecoderInput{
      .tokens = parallel::ShardSequences(batch.inputs, cp, rank).To(decoder.device(), decoder.ctx()),
      .targets = parallel::ShardSequences(batch.targets, cp, rank).To(decoder.device(), decoder.ctx()),
      .first_token = batch.sequences[0] * decoder.config().seq_len,
      .valid_rows = batch.padding > 0 ? batch.inputs.dim(0) - batch.padding : -1,
      .step = step,
      .training = training,
      .ids_checked = true};
}

}  // namespace switchyard::train
