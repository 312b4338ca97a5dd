// The norm layers of the decoder (MODEL.md section 1, `norm`): layernorm with a weight and a
// bias, or rmsnorm with a weight only, over the last dimension, with eps (default 1e-5).
// One class for both kinds so the model can hold Norm1/Norm2/NormF whatever the config
// says. The math and its backward are kernels/norm.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dense/parameter.h"
#include "engine/core/device_context.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "kernels/norm.h"

namespace switchyard::dense {

enum class NormKind { kLayerNorm, kRmsNorm };

// Parses "layernorm" or "rmsnorm".
StatusOr<NormKind> ParseNormKind(const std::string& name);
// "layernorm" or "rmsnorm".
const char* NormKindName(NormKind kind);

struct NormOptions {
  NormKind kind = NormKind::kLayerNorm;
  int64_t dim = 0;    // d, the normalised (last) dimension; required
  float eps = 1e-5f;  // added to the variance (mean square for rmsnorm); > 0
  Device device = Device::Cpu();

  // Names the field and the value it rejects ("norm.dim=0 must be > 0").
  Status Validate() const;
};

// weight (d); bias (d) for layernorm, undefined for rmsnorm.
struct NormParams {
  Tensor weight, bias;
};

// What Backward needs from one Forward; N rows of x (..., d).
struct NormActivations {
  Tensor x;     // (..., d) the input, shared with the caller: keep it unchanged
  Tensor mean;  // (N) layernorm only
  Tensor rstd;  // (N)
  Tensor y;     // (..., d) the output
};

class Norm {
 public:
  // weight = 1, bias = 0 (the standard initialisation), gradients zero. Checks Validate().
  explicit Norm(const NormOptions& options, DeviceContext* ctx = nullptr);
  // Takes (shares) the given parameters; errors name the tensor and what is wrong.
  static StatusOr<Norm> FromTensors(const NormOptions& options, NormParams params,
                                    DeviceContext* ctx = nullptr);

  Norm(Norm&&) = default;
  Norm& operator=(Norm&&) = default;
  Norm(const Norm&) = delete;
  Norm& operator=(const Norm&) = delete;

  // x (..., d) -> acts.y (..., d). y_dtype bf16: y written as the bf16 operand of the
  // products that read it (bf16 activation storage; the f32 y rounded, kernels/norm.h).
  NormActivations Forward(const Tensor& x, DeviceContext* ctx = nullptr,
                          DType y_dtype = DType::kF32) const;
  // The residual add and this norm in one kernel (kernels::AddLayerNormForward /
  // AddRmsNormForward): acts.x = x + r (a new tensor, the residual stream the caller goes on
  // with), acts.y = norm(acts.x). Bit-identical to kernels::Add(x, r) then Forward.
  NormActivations AddForward(const Tensor& x, const Tensor& r, DeviceContext* ctx = nullptr,
                             DType y_dtype = DType::kF32) const;
  // dy (..., d). Adds into the gradients; returns dx (..., d).
  Tensor Backward(const NormActivations& acts, const Tensor& dy, DeviceContext* ctx = nullptr);
  // The same, with dx added into `into` (the residual stream's gradient, as many elements as
  // x, not dy's memory) in the kernel that computes it: bit-identical to Backward and then
  // kernels::Axpy(1, dx, into), one pass over the rows fewer.
  void BackwardInto(const NormActivations& acts, const Tensor& dy, Tensor& into,
                    DeviceContext* ctx = nullptr);
  void ZeroGrad(DeviceContext* ctx = nullptr);

  const NormOptions& options() const { return options_; }
  Tensor weight() const { return weight_; }
  Tensor bias() const { return bias_; }
  Tensor grad_weight() const { return grad_weight_; }
  Tensor grad_bias() const { return grad_bias_; }
  // "weight", then "bias" for layernorm.
  std::vector<Parameter> Parameters() const;

 private:
  Norm(const NormOptions& options, NormParams params, DeviceContext* ctx);
  void RunBackward(const NormActivations& acts, const Tensor& dy, Tensor& dx,
                   kernels::Write write, DeviceContext* ctx);

  NormOptions options_;
  Tensor weight_, bias_;
  Tensor grad_weight_, grad_bias_;
};

}  // namespace switchyard::dense
