// Linear: y = x @ W + b with W stored (in, out) as in MODEL.md (x (N, in), y (N, out)); any
// leading dimensions of x are flattened into N. The building block of the attention
// projections and the dense MLP.
//
// Tensor parallelism (Megatron-LM's ColumnParallelLinear / RowParallelLinear): the layer
// owns its split and describes it in Parameters(); the communication around it (the
// mappings of engine/parallel/tensor_parallel.h) belongs to the block that uses it, since
// q, k and v share one gathered input.
//   kColumn: W (in, out/tp), columns [r*out/tp, (r+1)*out/tp); b split the same way.
//   kRow:    W (in/tp, out), rows [r*in/tp, ...); y is a partial sum the caller reduces
//            over tp; b is whole and added by tp rank 0 only, so the reduced sum holds it
//            once; its gradient (rank 0's) is summed over tp.
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
#include "kernels/activation_storage.h"

namespace switchyard::dense {

// How a Linear's weight is split over the tensor-parallel group.
enum class LinearSplit { kNone, kColumn, kRow };

struct LinearOptions {
  int64_t in = 0;     // input features (of the whole layer); required
  int64_t out = 0;    // output features (of the whole layer); required
  bool bias = false;  // b (out)
  Device device = Device::Cpu();
  LinearSplit split = LinearSplit::kNone;
  int tp_rank = 0, tp_size = 1;  // this rank's place in the tensor-parallel group

  // The local weight's shape: (local_in, local_out).
  int64_t local_in() const { return split == LinearSplit::kRow ? in / tp_size : in; }
  int64_t local_out() const { return split == LinearSplit::kColumn ? out / tp_size : out; }

  // Names the field and the value it rejects ("linear.in=0 must be > 0").
  Status Validate() const;
};

// weight (in, out); bias (out) with options.bias, else undefined.
struct LinearParams {
  Tensor weight, bias;
};

// What Backward needs from one Forward.
struct LinearActivations {
  Tensor x;  // (..., in) the input, shared with the caller: keep it unchanged; under bf16
             // activation storage (kernels/activation_storage.h) the bf16 operand the
             // product read, unless Forward was told KeepInput::kAsGiven
  Tensor y;  // (..., out) the output
};

class Linear {
 public:
  // Parameters and gradients allocated and zeroed. Checks Validate().
  explicit Linear(const LinearOptions& options, DeviceContext* ctx = nullptr);
  // weight ~ N(0, std^2) keyed by RngKey{seed, StreamId(name + ".weight")}, element (i, j)
  // of the whole (in, out) weight at counter index i * out + j, whatever the split
  // (parallel::FillNormalBox); bias zero.
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

  // x (..., in) -> acts.y (..., out). add_bias = false leaves the bias out of acts.y, for a
  // caller that adds it itself in a fused kernel (dense::Mlp: bias + activation). keep: what
  // acts.x holds (kernels::KeptOperand): under bf16 activation storage the bf16 operand the
  // product reads (one conversion for the forward and the weight gradient's products; x
  // itself when x is bf16 already, e.g. an operand several projections share), or x as given
  // (kAsGiven, for an input another backward reads in f32). acts.y is the same bits either way.
  // y_dtype kBF16 (products in bf16 mode): acts.y is written in bf16, the f32 result rounded
  // once (kernels::Gemm's bf16 c), for a consumer that reads it as a bf16 operand (attention's
  // fused core): the bits of the f32 acts.y then KeepRounded, without the f32 tensor.
  LinearActivations Forward(const Tensor& x, DeviceContext* ctx = nullptr, bool add_bias = true,
                            kernels::KeepInput keep = kernels::KeepInput::kOperand,
                            DType y_dtype = DType::kF32) const;
  // dy (..., out) for acts.y. Adds into the gradients; returns dx (..., in). bias_grad =
  // false leaves the bias gradient to the caller (who computed it fused with dy).
  Tensor Backward(const LinearActivations& acts, const Tensor& dy, DeviceContext* ctx = nullptr,
                  bool bias_grad = true);
  // The same, writing dx = beta * dx + dy W^T into a caller's tensor of x's shape (beta = 1
  // sums the input gradients of several layers that read the same x).
  void BackwardInto(const LinearActivations& acts, const Tensor& dy, Tensor& dx, float beta,
                    DeviceContext* ctx = nullptr, bool bias_grad = true);
  // Whether this rank adds (and differentiates) the bias: options.bias, and not a
  // row-parallel rank other than 0.
  bool adds_bias() const;
  // Sets the gradients to zero.
  void ZeroGrad(DeviceContext* ctx = nullptr);

  const LinearOptions& options() const { return options_; }
  // Handles sharing storage with the parameters; bias ones undefined without options.bias.
  Tensor weight() const { return weight_; }
  Tensor bias() const { return bias_; }
  Tensor grad_weight() const { return grad_weight_; }
  Tensor grad_bias() const { return grad_bias_; }
  // "weight", then "bias" when it exists, each with its box in the whole layer's tensor.
  std::vector<Parameter> Parameters() const;

 private:
  Linear(const LinearOptions& options, LinearParams params, DeviceContext* ctx);

  LinearOptions options_;
  Tensor weight_, bias_;
  Tensor grad_weight_, grad_bias_;
};

}  // namespace switchyard::dense
