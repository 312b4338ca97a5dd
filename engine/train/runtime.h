// The runtime section made real: this rank's device and DeviceContext (runtime.device, with
// runtime.precision's matrix-product dtype), and — for a multi-rank GPU run — the mesh's
// groups over a device communicator (NCCL) for the tensors that live on the GPU. The host
// ParallelContext keeps the bookkeeping (losses, statistics, stop flags, checkpoints).
#pragma once

#include <memory>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/dist/parallel_context.h"
#include "engine/model/decoder.h"
#include "engine/config/config.h"
#include "engine/data/loader.h"

namespace switchyard::train {

// runtime.device as this rank's device: "cuda" takes GPU local_rank % GPUs (one rank per
// GPU under mpirun; OMPI_COMM_WORLD_LOCAL_RANK, else the world rank), "cuda:N" exactly GPU
// N. Errors name the key when the build has no CUDA backend or no GPU is visible.
StatusOr<Device> RankDevice(const config::RuntimeConfig& runtime, int world_rank);

struct Runtime {
  std::unique_ptr<DeviceContext> ctx;
  std::unique_ptr<dist::Communicator> device_world;  // GPU and world > 1 only
  std::unique_ptr<dist::ParallelContext> device_pc;  // likewise

  Device device() const { return ctx->device(); }
  // The groups device tensors travel in: device_pc when there is one, else `host`.
  dist::ParallelContext& data_pc(dist::ParallelContext& host) const {
    return device_pc ? *device_pc : host;
  }
};

// Collective over world (the device communicator is created on every rank).
StatusOr<Runtime> MakeRuntime(const config::RuntimeConfig& runtime, dist::Communicator& world,
                              const dist::Mesh& mesh);

// The decoders of `config` on this rank, one per model chunk (parallel.virtual_stages of
// them; chunk c of pipeline rank r is model stage c * pp + r, engine/model/stage.h; one
// holding every layer without pipeline parallelism): their layers communicate in the
// device groups of rt (tp with sequence parallelism as configured, ep, etp), and recompute
// activations as train.recompute says. Used by training and evaluation.
StatusOr<std::vector<std::unique_ptr<model::Decoder>>> MakeStageDecoders(
    const config::Config& config, const Runtime& rt, dist::ParallelContext& host_pc);

// Every token id of the host batch in [0, vocab) and every target too or -1 (masked); a
// fatal check naming the first that is not (the embedding's and the loss's messages). The
// loader checked the tokens against the data's vocabulary already (data.verify, or per
// read) and the config the vocabulary against model.vocab_size; this pass over host memory
// lets the decoder read them on the device without a readback per lookup
// (kernels/embedding.h, engine/core/step_readback.h).
void CheckBatchIds(const data::Batch& batch, int64_t vocab);

// A loader batch as a micro-batch of `decoder` on this rank (ids checked: CheckBatchIds): tokens and targets on the
// decoder's device, under context parallelism this rank's chunks of every sequence
// (engine/parallel/context_parallel.h's local layout), first_token the batch's first global token.
model::DecoderInput MicroBatchInput(const data::Batch& batch, const model::Decoder& decoder,
                                    const dist::ParallelContext& pc, int64_t step,
                                    bool training);

}  // namespace switchyard::train
