// The optimizer over a ParameterRegistry: AdamW (the default) or SGD with momentum, one
// fused kernel per parameter (kernels/optimizer.h has the formulas).
//
// State lives beside each trainable parameter with the SAME shape and sharding (a slice of
// an expert's exp_avg is held where that slice of the expert is), so State() describes it
// as parameters the checkpoint code saves and loads like the model's. Under ZeRO
// (engine/parallel/zero.h) a rank keeps state only for the elements it owns
// (flat_begin..flat_end of the box, 1-D, described with flat_value) and updates only those:
//   "optimizer.exp_avg.<param>", "optimizer.exp_avg_sq.<param>"   (AdamW)
//   "optimizer.momentum.<param>"                                    (SGD, momentum != 0)
//   "optimizer.step"            the number of updates taken, a 0-d i64 host tensor
// Parameters with trainable == false are skipped (no state, never updated); weight decay
// applies only where Parameter::weight_decay is true. AdamW also writes the bf16 weight
// shadow of each weight whose shadow the context holds (engine/core/weight_shadows.h).
//
//   Optimizer opt(model.registry(), OptimizerOptionsFor(config.train));
//   ... backward, grad sync, clip ...
//   opt.Step(schedule.LrAt(opt.step()));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/status.h"
#include "engine/config/train_config.h"
#include "engine/parallel/parameter.h"
#include "engine/parallel/zero.h"

namespace switchyard::train {

using config::OptimizerKind;  // adamw | sgd, the config's train.optimizer

// Hyper-parameters other than the learning rate (which the schedule gives per step).
struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kAdamW;
  float weight_decay = 0.1f;  // AdamW: decoupled; SGD: L2 added to the gradient (PyTorch)
  float beta1 = 0.9f;         // AdamW
  float beta2 = 0.95f;        // AdamW
  float eps = 1e-8f;          // AdamW
  float momentum = 0.9f;      // SGD; 0: plain SGD, no buffer
  // ZeRO-Offload (Ren et al. 2021): the state lives in host memory and the update runs on
  // the host (the owned gradients copied down, the new values copied back). Results equal
  // the update on the device's own kernels up to their arithmetic (the CPU and CUDA AdamW
  // round identically).
  bool offload = false;
};

// The optimizer's options from the config's train section.
OptimizerOptions OptimizerOptionsFor(const config::TrainConfig& train);

class Optimizer {
 public:
  // Allocates zeroed state for every trainable parameter of `registry`, on the parameter's
  // device. The registry must outlive the optimizer and keep its parameter list.
  // zero (may be null: every parameter owned whole) says which elements this rank owns and
  // where their values and summed gradients are; it must outlive the optimizer.
  Optimizer(parallel::ParameterRegistry& registry, const OptimizerOptions& options,
            DeviceContext* ctx = nullptr, const parallel::ZeroShards* zero = nullptr);

  // One update of every trainable parameter from its grad times grad_scale (the gradient
  // clip's factor, ClipScale; the gradients themselves are not changed by AdamW) with
  // learning rate `lr`; then step() grows by one. AdamW's bias correction uses
  // t = step() + 1 (before the update).
  void Step(float lr, float grad_scale = 1.0f);

  // Updates taken so far (0 before the first Step); read from the "optimizer.step" tensor,
  // so loading a checkpoint into State() restores it.
  int64_t step() const;
  void set_step(int64_t step);

  // The state as parameters (see the file comment): value shares storage with the state,
  // so writing into it (a checkpoint load) sets the state. trainable = false,
  // weight_decay = false, grad undefined; the layout (global shape, box, view, replicated
  // axes) is that of the owning parameter ("optimizer.step": whole, replicated everywhere).
  std::vector<parallel::Parameter> State() const;

  const OptimizerOptions& options() const { return options_; }

 private:
  struct Slot {
    size_t param;          // index into registry_.params()
    Tensor exp_avg;        // AdamW m; SGD momentum buffer (undefined when momentum == 0)
    Tensor exp_avg_sq;     // AdamW v; undefined for SGD
    Tensor host_value, host_grad;  // offload: the owned values and gradients on the host
  };
  // The owned values and summed gradients of a slot (the whole parameter without ZeRO).
  Tensor Value(const Slot& slot) const;
  Tensor Grad(const Slot& slot) const;

  parallel::ParameterRegistry& registry_;
  OptimizerOptions options_;
  DeviceContext* ctx_;
  const parallel::ZeroShards* zero_;
  std::vector<Slot> slots_;
  Tensor step_;  // 0-d i64 on the host
};

}  // namespace switchyard::train
