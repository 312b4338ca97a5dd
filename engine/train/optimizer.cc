#include "engine/train/optimizer.h"

#include <map>

#include "engine/core/check.h"
#include "kernels/optimizer.h"

namespace switchyard::train {

OptimizerOptions OptimizerOptionsFor(const config::TrainConfig& t) {
  return {.kind = t.optimizer,
          .weight_decay = t.weight_decay,
          .beta1 = t.beta1,
          .beta2 = t.beta2,
          .eps = t.eps,
          .momentum = t.momentum};
}

Optimizer::Optimizer(parallel::ParameterRegistry& registry, const OptimizerOptions& options,
                     DeviceContext* ctx, const parallel::ZeroShards* zero)
    : registry_(registry), options_(options), ctx_(ctx),
      zero_(zero != nullptr && zero->stage() > 0 ? zero : nullptr) {
  const bool adamw = options_.kind == OptimizerKind::kAdamW;
  const std::vector<parallel::Parameter>& params = registry_.params();
  for (size_t i = 0; i < params.size(); ++i) {
    const parallel::Parameter& p = params[i];
    if (!p.trainable) continue;
    Slot slot;
    slot.param = i;
    // Without ZeRO the state has the parameter's shape; with it, the owned elements (1-D).
    const Shape shape = zero_ ? Shape{p.FlatEnd() - p.flat_begin} : p.value.shape();
    const Device device = options_.offload ? Device::Cpu() : p.value.device();
    auto state = [&] {
      Tensor t = Tensor::Zeros(shape, p.value.dtype(), device, ctx_);
      t.buffer().SetKind(MemoryKind::kOptimizer);
      return t;
    };
    if (adamw || options_.momentum != 0.0f) slot.exp_avg = state();
    if (adamw) slot.exp_avg_sq = state();
    if (options_.offload) {
      slot.host_value = state();
      slot.host_grad = state();
    }
    slots_.push_back(std::move(slot));
  }
  step_ = Tensor::Zeros({}, DType::kI64);
}

Tensor Optimizer::Value(const Slot& slot) const {
  return zero_ ? zero_->OwnedValue(slot.param) : registry_.params()[slot.param].value;
}

Tensor Optimizer::Grad(const Slot& slot) const {
  return zero_ ? zero_->OwnedGrad(slot.param) : registry_.params()[slot.param].grad;
}

int64_t Optimizer::step() const { return *step_.data<int64_t>(); }

void Optimizer::set_step(int64_t step) {
  SY_CHECK(step >= 0) << "optimizer step " << step;
  *step_.data<int64_t>() = step;
}

void Optimizer::Step(float lr, float grad_scale) {
  std::vector<parallel::Parameter>& params = registry_.params();
  const int64_t t = step() + 1;
  // AdamW: every parameter in one multi-tensor update per learning-rate scale (a few
  // launches on a GPU; one update unless moe.router_lr_scale sets another), with the same
  // per-element arithmetic as one AdamWUpdate per tensor at lr times its scale.
  std::map<float, std::vector<kernels::AdamWTensors>> adamw;
  // Offload: the owned gradients come down to the host, the update runs there (no device
  // context), the new values go back up.
  DeviceContext* update_ctx = options_.offload ? nullptr : ctx_;
  std::vector<Tensor> values;
  for (Slot& slot : slots_) {
    SY_CHECK(slot.param < params.size()) << "the registry lost parameters after the optimizer was built";
    parallel::Parameter& p = params[slot.param];
    Tensor value = Value(slot), grad = Grad(slot);
    if (value.numel() == 0) continue;  // ZeRO: this rank owns none of it
    if (options_.offload) {
      slot.host_value.CopyFrom(value, ctx_);
      slot.host_grad.CopyFrom(grad, ctx_);
      values.push_back(value);
      value = slot.host_value;
      grad = slot.host_grad;
    }
    const float wd = p.weight_decay ? options_.weight_decay : 0.0f;
    if (options_.kind == OptimizerKind::kAdamW) {
      // The weight's bf16 shadow, when products read one (bf16 at ZeRO stage 0): written in
      // the update's pass, so the next step converts nothing.
      Tensor shadow =
          update_ctx != nullptr ? update_ctx->weight_shadows().UpdateTarget(value) : Tensor();
      adamw[p.lr_scale].push_back({value, grad, slot.exp_avg, slot.exp_avg_sq, wd, shadow});
    } else {
      if (grad_scale != 1.0f) kernels::ScaleInPlace(grad, grad_scale, update_ctx);
      kernels::SgdUpdate(value, grad, slot.exp_avg, lr * p.lr_scale, options_.momentum, wd, update_ctx);
    }
  }
  for (auto& [scale, tensors] : adamw) {
    kernels::AdamWUpdateMany(tensors, {.lr = lr * scale, .beta1 = options_.beta1, .beta2 = options_.beta2,
                                       .eps = options_.eps, .step = t, .grad_scale = grad_scale},
                             update_ctx);
  }
  if (options_.offload) {
    size_t k = 0;
    for (Slot& slot : slots_)
      if (Value(slot).numel() > 0) values[k++].CopyFrom(slot.host_value, ctx_);
  }
  set_step(t);
}

std::vector<parallel::Parameter> Optimizer::State() const {
  const std::vector<parallel::Parameter>& params = registry_.params();
  std::vector<parallel::Parameter> state;
  auto add = [&](const parallel::Parameter& owner, const char* what, const Tensor& value) {
    if (!value.defined()) return;
    // The state has its parameter's layout: the same box of the same logical tensor (under
    // ZeRO only the owned elements of it).
    parallel::Parameter p = owner;
    if (zero_) {
      p.box_shape = owner.value.shape();
      p.flat_value = true;
    }
    p.name = StrCat("optimizer.", what, ".", owner.name);
    p.grad_sum = parallel::AxisSet();
    p.trainable = false;
    p.weight_decay = false;
    p.value = value;
    p.grad = Tensor();
    state.push_back(std::move(p));
  };
  const bool adamw = options_.kind == OptimizerKind::kAdamW;
  for (const Slot& slot : slots_) {
    const parallel::Parameter& owner = params[slot.param];
    add(owner, adamw ? "exp_avg" : "momentum", slot.exp_avg);
    add(owner, "exp_avg_sq", slot.exp_avg_sq);
  }
  parallel::Parameter step = parallel::Parameter::Dense("optimizer.step", step_, Tensor(), false);
  step.replicated = parallel::AxisSet{dist::Axis::kTp, dist::Axis::kCp, dist::Axis::kEp,
                                      dist::Axis::kDp};
  step.grad_sum = parallel::AxisSet();
  state.push_back(std::move(step));
  return state;
}

}  // namespace switchyard::train
