// The dense MLP of the decoder's non-MoE layers (MODEL.md section 1), x (..., d) -> y (..., d):
//   gelu / relu:  y = act(x W1 + b1) W2 + b2
//   swiglu:       y = (silu(x W1 + b1) * (x W3)) W2 + b2
// W1, W3 (d, f), W2 (f, d); biases only with `bias`, and none on the W3 branch (the same
// function as one moe::Experts expert, so a shared expert and a dense MLP agree). Built from
// dense::Linear ("w1", "w2", "w3") and the kernels of kernels/activation.h; moe/ keeps its
// own grouped Experts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dense/linear.h"
#include "dense/tp_block.h"
#include "dense/parameter.h"
#include "engine/core/device_context.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"

namespace switchyard::dense {

// gelu is the tanh approximation (MODEL.md).
enum class Activation { kGelu, kRelu, kSwiglu };

// Parses "gelu", "relu" or "swiglu"; the error names `key` ("moe.activation='tanh' is not
// one of gelu, relu, swiglu"). The one activation enum of dense and MoE layers.
StatusOr<Activation> ParseActivation(const std::string& name,
                                     std::string_view key = "activation");
const char* ActivationName(Activation activation);

struct MlpOptions {
  int64_t d_model = 0;   // d; required
  int64_t d_hidden = 0;  // f; required (GPT-2: 4 d; Llama swiglu: ~8/3 d)
  Activation activation = Activation::kGelu;
  bool bias = false;  // b1 (f) and b2 (d)
  Device device = Device::Cpu();
  // Tensor parallelism (Megatron-LM): W1 and W3 column-parallel (the hidden units
  // [r*f/tp, (r+1)*f/tp) of each, so swiglu's gate and up halves stay paired), W2
  // row-parallel. Under sequence parallelism x and y are this rank's rows.
  TensorParallel tp;

  // Names the field and the value it rejects ("mlp.d_hidden=0 must be > 0").
  Status Validate() const;
};

// What Backward needs from one Forward; N rows.
// Under bf16 activation storage (kernels/activation_storage.h) the inputs x (shared by fc1
// and fc3) and h are the bf16 operands the products read, and a and b are kept rounded to
// bf16 (the forward computed h from their f32 values).
struct MlpActivations {
  LinearActivations fc1;  // x -> a = x W1 (+ b1 unless fused into the activation) (..., f)
  LinearActivations fc3;  // x -> b = x W3 (..., f); swiglu only
  LinearActivations fc2;  // h = act(a) or silu(a) * b (..., f) -> y (..., d)
  Tensor out;             // y after leaving the tensor-parallel region (= fc2.y without tp)

  // The MLP's output y (..., d).
  const Tensor& y() const { return out; }
};

class Mlp {
 public:
  // Weights allocated and zeroed. Checks Validate().
  explicit Mlp(const MlpOptions& options, DeviceContext* ctx = nullptr);
  // Each weight from Linear::Init under name + ".w1" (".w2", ".w3"): N(0, std^2), W2 (the
  // residual projection) N(0, out_std^2); biases zero.
  static Mlp Init(const MlpOptions& options, uint64_t seed, const std::string& name,
                  float std = 0.02f, float out_std = 0.02f, DeviceContext* ctx = nullptr);

  Mlp(Mlp&&) = default;
  Mlp& operator=(Mlp&&) = default;

  // x (..., d) -> acts.y() (..., d).
  MlpActivations Forward(const Tensor& x, DeviceContext* ctx = nullptr) const;
  // dy (..., d). Adds into the gradients; returns dx (..., d).
  Tensor Backward(const MlpActivations& acts, const Tensor& dy, DeviceContext* ctx = nullptr);
  void ZeroGrad(DeviceContext* ctx = nullptr);

  const MlpOptions& options() const { return options_; }
  Linear& w1() { return w1_; }
  Linear& w2() { return w2_; }
  // Only with swiglu.
  Linear& w3() { return *w3_; }
  // "w1.weight", ("w1.bias",) "w2.weight", ("w2.bias",) ("w3.weight" with swiglu).
  std::vector<Parameter> Parameters() const;

 private:
  // W1's bias is added (and differentiated) inside the activation's kernel.
  bool FusesBias() const;

  Mlp(const MlpOptions& options, Linear w1, Linear w2, std::optional<Linear> w3);

  MlpOptions options_;
  Linear w1_, w2_;
  std::optional<Linear> w3_;
};

}  // namespace switchyard::dense
