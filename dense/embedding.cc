// Embedding (dense/embedding.h) over kernels/embedding.h.
#include "dense/embedding.h"

#include <algorithm>
#include <utility>

#include "engine/core/philox.h"
#include "kernels/embedding.h"
#include "kernels/random.h"
#include "kernels/vocab_parallel.h"

namespace switchyard::dense {
namespace {

Tensor ZerosOrUndefined(bool present, const Shape& shape, Device device, DeviceContext* ctx) {
  return present ? Tensor::Zeros(shape, DType::kF32, device, ctx) : Tensor();
}

}  // namespace

Status EmbeddingOptions::Validate() const {
  if (vocab_size <= 0) return InvalidArgument("embedding.vocab_size=", vocab_size, " must be > 0");
  if (d_model <= 0) return InvalidArgument("embedding.d_model=", d_model, " must be > 0");
  if (max_positions < 0) {
    return InvalidArgument("embedding.max_positions=", max_positions, " must be >= 0");
  }
  if (valid_rows() <= 0) {
    return InvalidArgument("model.vocab_size=", vocab_size, " is too small for tp=", tp.size(),
                           ": tensor-parallel rank ", tp.rank(), " would hold no vocabulary");
  }
  return OkStatus();
}


Embedding::Embedding(const EmbeddingOptions& options, DeviceContext* ctx)
    : Embedding(options,
                EmbeddingParams{Tensor::Zeros({options.local_rows(), options.d_model}, DType::kF32,
                                              options.device, ctx),
                                ZerosOrUndefined(options.max_positions > 0,
                                                 {options.max_positions, options.d_model},
                                                 options.device, ctx)},
                ctx) {}

Embedding::Embedding(const EmbeddingOptions& options, EmbeddingParams params, DeviceContext* ctx)
    : options_(options), wte_(std::move(params.wte)), wpe_(std::move(params.wpe)) {
  SY_CHECK_OK(options.Validate());
  grad_wte_ = Tensor::Zeros(wte_.shape(), DType::kF32, options.device, ctx);
  grad_wpe_ = ZerosOrUndefined(options.max_positions > 0, {options.max_positions, options.d_model},
                               options.device, ctx);
}

Embedding Embedding::Init(const EmbeddingOptions& options, uint64_t seed, const std::string& name,
                          float std, DeviceContext* ctx) {
  Embedding e(options, ctx);
  for (Parameter& p : e.Parameters()) parallel::InitNormal(p, seed, std, ctx, name + "." + p.name);
  return e;
}

StatusOr<Embedding> Embedding::FromTensors(const EmbeddingOptions& options, EmbeddingParams params,
                                           DeviceContext* ctx) {
  SY_RETURN_IF_ERROR(options.Validate());
  if (options.tp.active()) {
    return InvalidArgument("embedding: loading a vocabulary-parallel table is not supported");
  }
  SY_RETURN_IF_ERROR(CheckParameter("embedding.wte", params.wte,
                                    {options.local_rows(), options.d_model}, options.device));
  if (options.max_positions > 0) {
    SY_RETURN_IF_ERROR(CheckParameter("embedding.wpe", params.wpe,
                                      {options.max_positions, options.d_model}, options.device));
  } else if (params.wpe.defined()) {
    return InvalidArgument("embedding.wpe given but embedding.max_positions=0");
  }
  return Embedding(options, std::move(params), ctx);
}

namespace {

// Learned positions added to (or their gradient taken from) x (B, S, d): position s, or under
// cp the global position of each chunk's rows.
void AddPositions(const parallel::ContextParallel& cp, Tensor& x, const Tensor& wpe, DeviceContext* ctx) {
  if (!cp.active()) return kernels::AddPositionEmbedding(x, wpe, 0, ctx);
  const int64_t b = x.dim(0) / 2;
  for (int h = 0; h < 2; ++h) {
    Tensor rows = x.Slice(h * b, (h + 1) * b);
    kernels::AddPositionEmbedding(rows, wpe, cp.chunk_start(h), ctx);
  }
}

void PositionsBackward(const parallel::ContextParallel& cp, const Tensor& dx, Tensor& dwpe,
                       DeviceContext* ctx) {
  if (!cp.active()) return kernels::PositionEmbeddingBackward(dx, dwpe, 0, ctx);
  const int64_t b = dx.dim(0) / 2;
  for (int h = 0; h < 2; ++h) {
    kernels::PositionEmbeddingBackward(dx.Slice(h * b, (h + 1) * b), dwpe, cp.chunk_start(h), ctx);
  }
}

}  // namespace

EmbeddingActivations Embedding::Forward(const Tensor& tokens, DeviceContext* ctx,
                                        kernels::IdCheck id_check) const {
  SY_CHECK_EQ(tokens.ndim(), 2) << "Embedding::Forward: tokens are (B, S), got "
                                << ShapeString(tokens.shape());
  EmbeddingActivations acts;
  acts.tokens = tokens;
  acts.id_check = id_check;
  Tensor y =
      Tensor::Empty({tokens.dim(0), tokens.dim(1), options_.d_model}, DType::kF32, tokens.device());
  const TensorParallel& tp = options_.tp;
  if (!tp.active()) {
    kernels::EmbeddingForward(tokens, wte_, y, ctx, id_check);
    if (wpe_.defined()) AddPositions(options_.cp, y, wpe_, ctx);
    acts.y = y;
    return acts;
  }
  kernels::VocabShardEmbeddingForward(tokens, wte_, options_.vocab_start(), y, ctx);
  if (wpe_.defined() && tp.rank() == 0) AddPositions(options_.cp, y, wpe_, ctx);
  acts.y = LeaveTensorParallel(tp, y.Reshape({y.numel() / options_.d_model, options_.d_model}), ctx);
  if (!tp.sequence_parallel) acts.y = acts.y.Reshape(y.shape());
  return acts;
}

void Embedding::Backward(const EmbeddingActivations& acts, const Tensor& dy, DeviceContext* ctx) {
  SY_CHECK(dy.shape() == acts.y.shape()) << "Embedding::Backward: dy " << ShapeString(dy.shape())
                                         << " for y " << ShapeString(acts.y.shape());
  const TensorParallel& tp = options_.tp;
  if (!tp.active()) {
    kernels::EmbeddingBackward(acts.tokens, dy, grad_wte_, ctx, acts.id_check);
    if (grad_wpe_.defined()) PositionsBackward(options_.cp, dy, grad_wpe_, ctx);
    return;
  }
  const Tensor dfull =
      LeaveTensorParallelBackward(tp, dy.Reshape({dy.numel() / options_.d_model, options_.d_model}), ctx)
          .Reshape({acts.tokens.dim(0), acts.tokens.dim(1), options_.d_model});
  kernels::VocabShardEmbeddingBackward(acts.tokens, dfull, options_.vocab_start(), grad_wte_,
                                       ctx);
  if (grad_wpe_.defined() && tp.rank() == 0) PositionsBackward(options_.cp, dfull, grad_wpe_, ctx);
}

void Embedding::ZeroGrad(DeviceContext* ctx) {
  grad_wte_.SetZero(ctx);
  if (grad_wpe_.defined()) grad_wpe_.SetZero(ctx);
}

std::vector<Parameter> Embedding::Parameters() const {
  const EmbeddingOptions& o = options_;
  const int64_t valid = o.valid_rows();
  Parameter wte = Parameter::Dense("wte", wte_.Slice(0, valid), grad_wte_.Slice(0, valid), true);
  if (o.tp.active()) wte.Split(0, o.vocab_start(), o.vocab_size);
  std::vector<Parameter> out = {std::move(wte)};
  if (wpe_.defined()) {
    Parameter wpe = Parameter::Dense("wpe", wpe_, grad_wpe_, true);
    if (o.tp.active()) wpe.ReplicatedOver(dist::Axis::kTp, /*grad_summed=*/true);
    out.push_back(std::move(wpe));
  }
  return out;
}

}  // namespace switchyard::dense
