// Linear: y = x @ W + b with W stored (in, out) as in MODEL.md (x (N, in), y (N, out)); any
// leading dimensions of x are flattened into N. The building block of the attention
// projections and the dense MLP; the tensor-parallel (column / row) variants will slice it.
//
// Forward returns a LinearActivations that the caller keeps (llm.c style, so several
// micro-batches can be in flight); Backward adds dW = x^T dy and db = column sums of dy into
// the gradients and returns dx = dy W^T.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dense/parameter.h"
#include "engine/core/device_context.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"

namespace switchyard::dense {

struct LinearOptions {
  int64_t in = 0;     // input features; required
  int64_t out = 0;    // output features; required
  bool bias = false;  // b (out)
  Device device = Device::Cpu();

  // Names the field and the value it rejects ("linear.in=0 must be > 0").
  Status Validate() const;
};

// weight (in, out); bias (out) with options.bias, else undefined.
struct LinearParams {
  Tensor weight, bias;
};

// What Backward needs from one Forward.
struct LinearActivations {
  Tensor x;  // (..., in) the input, shared with the caller: keep it unchanged
  Tensor y;  // (..., out) the output
};

class Linear {
 public:
  // Parameters and gradients allocated and zeroed. Checks Validate().
  explicit Linear(const LinearOptions& options, DeviceContext* ctx = nullptr);
  // weight ~ N(0, std^2) from kernels::FillNormal keyed by RngKey{seed, StreamId(name +
  // ".weight")} at element offset 0 (element (i, j) is global index i * out + j); bias zero.
  static Linear Init(const LinearOptions& options, uint64_t seed, const std::string& name,
                     float std = 0.02f, DeviceContext* ctx = nullptr);
  // Takes (shares, does not copy) the given parameters. Errors name the tensor and what
  // is wrong with it.
  static StatusOr<Linear> FromTensors(const LinearOptions& options, LinearParams params,
                                      DeviceContext* ctx = nullptr);

  Linear(Linear&&) = default;
  Linear& operator=(Linear&&) = default;
  Linear(const Linear&) = delete;  // a copy would silently share the parameters
  Linear& operator=(const Linear&) = delete;

  // x (..., in) -> acts.y (..., out).
  LinearActivations Forward(const Tensor& x, DeviceContext* ctx = nullptr) const;
  // dy (..., out) for acts.y. Adds into the gradients; returns dx (..., in).
  Tensor Backward(const LinearActivations& acts, const Tensor& dy, DeviceContext* ctx = nullptr);
  // The same, writing dx = beta * dx + dy W^T into a caller's tensor of x's shape (beta = 1
  // sums the input gradients of several layers that read the same x).
  void BackwardInto(const LinearActivations& acts, const Tensor& dy, Tensor& dx, float beta,
                    DeviceContext* ctx = nullptr);
  // Sets the gradients to zero.
  void ZeroGrad(DeviceContext* ctx = nullptr);

  const LinearOptions& options() const { return options_; }
  // Handles sharing storage with the parameters; bias ones undefined without options.bias.
  Tensor weight() const { return weight_; }
  Tensor bias() const { return bias_; }
  Tensor grad_weight() const { return grad_weight_; }
  Tensor grad_bias() const { return grad_bias_; }
  // "weight", then "bias" when it exists.
  std::vector<NamedParameter> Parameters() const;

 private:
  Linear(const LinearOptions& options, LinearParams params, DeviceContext* ctx);

  LinearOptions options_;
  Tensor weight_, bias_;
  Tensor grad_weight_, grad_bias_;
};

}  // namespace switchyard::dense
