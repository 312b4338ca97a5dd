// Embedding (dense/embedding.h) over kernels/embedding.h.
#include "dense/embedding.h"

#include <utility>

#include "engine/core/philox.h"
#include "kernels/embedding.h"
#include "kernels/random.h"

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
  return OkStatus();
}

Embedding::Embedding(const EmbeddingOptions& options, DeviceContext* ctx)
    : Embedding(options,
                EmbeddingParams{Tensor::Zeros({options.vocab_size, options.d_model}, DType::kF32,
                                              options.device, ctx),
                                ZerosOrUndefined(options.max_positions > 0,
                                                 {options.max_positions, options.d_model},
                                                 options.device, ctx)},
                ctx) {}

Embedding::Embedding(const EmbeddingOptions& options, EmbeddingParams params, DeviceContext* ctx)
    : options_(options), wte_(std::move(params.wte)), wpe_(std::move(params.wpe)) {
  SY_CHECK_OK(options.Validate());
  grad_wte_ =
      Tensor::Zeros({options.vocab_size, options.d_model}, DType::kF32, options.device, ctx);
  grad_wpe_ = ZerosOrUndefined(options.max_positions > 0, {options.max_positions, options.d_model},
                               options.device, ctx);
}

Embedding Embedding::Init(const EmbeddingOptions& options, uint64_t seed, const std::string& name,
                          float std, DeviceContext* ctx) {
  Embedding e(options, ctx);
  kernels::FillNormal(e.wte_, RngKey{seed, StreamId(name + ".wte")}, 0, 0.0f, std, ctx);
  if (e.wpe_.defined()) {
    kernels::FillNormal(e.wpe_, RngKey{seed, StreamId(name + ".wpe")}, 0, 0.0f, std, ctx);
  }
  return e;
}

StatusOr<Embedding> Embedding::FromTensors(const EmbeddingOptions& options, EmbeddingParams params,
                                           DeviceContext* ctx) {
  SY_RETURN_IF_ERROR(options.Validate());
  SY_RETURN_IF_ERROR(CheckParameter("embedding.wte", params.wte,
                                    {options.vocab_size, options.d_model}, options.device));
  if (options.max_positions > 0) {
    SY_RETURN_IF_ERROR(CheckParameter("embedding.wpe", params.wpe,
                                      {options.max_positions, options.d_model}, options.device));
  } else if (params.wpe.defined()) {
    return InvalidArgument("embedding.wpe given but embedding.max_positions=0");
  }
  return Embedding(options, std::move(params), ctx);
}

EmbeddingActivations Embedding::Forward(const Tensor& tokens, DeviceContext* ctx) const {
  SY_CHECK_EQ(tokens.ndim(), 2) << "Embedding::Forward: tokens are (B, S), got "
                                << ShapeString(tokens.shape());
  EmbeddingActivations acts;
  acts.tokens = tokens;
  acts.y =
      Tensor::Empty({tokens.dim(0), tokens.dim(1), options_.d_model}, DType::kF32, tokens.device());
  kernels::EmbeddingForward(tokens, wte_, acts.y, ctx);
  if (wpe_.defined()) kernels::AddPositionEmbedding(acts.y, wpe_, 0, ctx);
  return acts;
}

void Embedding::Backward(const EmbeddingActivations& acts, const Tensor& dy, DeviceContext* ctx) {
  SY_CHECK(dy.shape() == acts.y.shape()) << "Embedding::Backward: dy " << ShapeString(dy.shape())
                                         << " for y " << ShapeString(acts.y.shape());
  kernels::EmbeddingBackward(acts.tokens, dy, grad_wte_, ctx);
  if (grad_wpe_.defined()) kernels::PositionEmbeddingBackward(dy, grad_wpe_, 0, ctx);
}

void Embedding::ZeroGrad(DeviceContext* ctx) {
  grad_wte_.SetZero(ctx);
  if (grad_wpe_.defined()) grad_wpe_.SetZero(ctx);
}

std::vector<NamedParameter> Embedding::Parameters() const {
  std::vector<NamedParameter> out = {{"wte", wte_, grad_wte_}};
  if (wpe_.defined()) out.push_back({"wpe", wpe_, grad_wpe_});
  return out;
}

}  // namespace switchyard::dense
