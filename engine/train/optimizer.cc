#include "engine/train/optimizer.h"

#include "engine/core/check.h"
#include "kernels/optimizer.h"

namespace switchyard::train {

StatusOr<OptimizerKind> ParseOptimizerKind(const std::string& name) {
  if (name == "adamw") return OptimizerKind::kAdamW;
  if (name == "sgd") return OptimizerKind::kSgd;
  return InvalidArgument("train.optimizer='", name, "' is not one of adamw, sgd");
}

const char* OptimizerKindName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdamW: return "adamw";
    case OptimizerKind::kSgd: return "sgd";
  }
  return "?";
}

Optimizer::Optimizer(model::ParameterRegistry& registry, const OptimizerOptions& options,
                     DeviceContext* ctx)
    : registry_(registry), options_(options), ctx_(ctx) {
  const bool adamw = options_.kind == OptimizerKind::kAdamW;
  const std::vector<model::Parameter>& params = registry_.params();
  for (size_t i = 0; i < params.size(); ++i) {
    const model::Parameter& p = params[i];
    if (!p.trainable) continue;
    Slot slot;
    slot.param = i;
    const Device device = p.value.device();
    if (adamw || options_.momentum != 0.0f) {
      slot.exp_avg = Tensor::Zeros(p.value.shape(), p.value.dtype(), device, ctx_);
    }
    if (adamw) slot.exp_avg_sq = Tensor::Zeros(p.value.shape(), p.value.dtype(), device, ctx_);
    slots_.push_back(std::move(slot));
  }
  step_ = Tensor::Zeros({}, DType::kI64);
}

int64_t Optimizer::step() const { return *step_.data<int64_t>(); }

void Optimizer::set_step(int64_t step) {
  SY_CHECK(step >= 0) << "optimizer step " << step;
  *step_.data<int64_t>() = step;
}

void Optimizer::Step(float lr) {
  std::vector<model::Parameter>& params = registry_.params();
  const int64_t t = step() + 1;
  // AdamW: every parameter in one multi-tensor update (a few launches on a GPU), with the
  // same per-element arithmetic as one AdamWUpdate per tensor.
  std::vector<kernels::AdamWTensors> adamw;
  for (Slot& slot : slots_) {
    SY_CHECK(slot.param < params.size()) << "the registry lost parameters after the optimizer was built";
    model::Parameter& p = params[slot.param];
    const float wd = p.weight_decay ? options_.weight_decay : 0.0f;
    if (options_.kind == OptimizerKind::kAdamW) {
      adamw.push_back({p.value, p.grad, slot.exp_avg, slot.exp_avg_sq, wd});
    } else {
      kernels::SgdUpdate(p.value, p.grad, slot.exp_avg, lr, options_.momentum, wd, ctx_);
    }
  }
  if (!adamw.empty()) {
    kernels::AdamWUpdateMany(adamw, {.lr = lr, .beta1 = options_.beta1, .beta2 = options_.beta2,
                                     .eps = options_.eps, .step = t},
                             ctx_);
  }
  set_step(t);
}

std::vector<model::Parameter> Optimizer::State() const {
  const std::vector<model::Parameter>& params = registry_.params();
  std::vector<model::Parameter> state;
  auto add = [&](const model::Parameter& owner, const char* what, const Tensor& value) {
    if (!value.defined()) return;
    state.push_back({.name = StrCat("optimizer.", what, ".", owner.name),
                     .global_shape = owner.global_shape,
                     .shard_dim = owner.shard_dim,
                     .shard_offset = owner.shard_offset,
                     .group = owner.group,
                     .trainable = false,
                     .weight_decay = false,
                     .value = value,
                     .grad = Tensor()});
  };
  const bool adamw = options_.kind == OptimizerKind::kAdamW;
  for (const Slot& slot : slots_) {
    const model::Parameter& owner = params[slot.param];
    add(owner, adamw ? "exp_avg" : "momentum", slot.exp_avg);
    add(owner, "exp_avg_sq", slot.exp_avg_sq);
  }
  state.push_back({.name = "optimizer.step",
                   .global_shape = {},
                   .group = model::GradGroup::kDense,
                   .trainable = false,
                   .weight_decay = false,
                   .value = step_,
                   .grad = Tensor()});
  return state;
}

}  // namespace switchyard::train
