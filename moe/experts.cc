// The experts (moe/experts.h): grouped expert MLPs over contiguous row blocks, through
// kernels/gemm.h and kernels/activation.h on the experts' device.
#include "moe/experts.h"

#include <utility>

#include "engine/core/philox.h"
#include "kernels/activation.h"
#include "kernels/gemm.h"
#include "kernels/random.h"

namespace switchyard::moe {
namespace {

bool IsSwiglu(const ExpertsOptions& o) { return o.activation == Activation::kSwiglu; }

// The shapes of every parameter under `o`; empty where the parameter does not exist.
struct ParamShapes {
  Shape w1, w2, w3, b1, b2;
};

ParamShapes ShapesOf(const ExpertsOptions& o) {
  const int64_t l = o.num_local, d = o.d_model, f = o.d_hidden;
  ParamShapes s{{l, d, f}, {l, f, d}, {}, {}, {}};
  if (IsSwiglu(o)) s.w3 = {l, d, f};
  if (o.bias) {
    s.b1 = {l, f};
    s.b2 = {l, d};
  }
  return s;
}

// Checks one loaded parameter: absent when `shape` is empty, else that shape in f32 on
// `device`.
Status CheckParam(const char* name, const Tensor& t, const Shape& shape, Device device) {
  if (shape.empty()) {
    if (t.defined())
      return InvalidArgument("experts.", name, " given but not used by these options");
    return OkStatus();
  }
  if (!t.defined())
    return InvalidArgument("experts.", name, " is missing; expected ", ShapeString(shape));
  if (t.shape() != shape) {
    return InvalidArgument("experts.", name, " has shape ", ShapeString(t.shape()), ", expected ",
                           ShapeString(shape));
  }
  if (t.dtype() != DType::kF32) {
    return InvalidArgument("experts.", name, " is ", DTypeName(t.dtype()), ", expected f32");
  }
  if (t.device() != device) {
    return InvalidArgument("experts.", name, " is on ", t.device(), ", expected ", device);
  }
  return OkStatus();
}

// One parameter of Experts: its name, the dim of its hidden units (-1: none; the expert is
// dim 0 of every tensor) and whether it is a weight matrix (weight decay; drawn by Init).
struct Slot {
  const char* name;
  int hidden_dim;
  bool weight;
};
constexpr Slot kW1{"w1", 2, true}, kW2{"w2", 1, true}, kW3{"w3", 2, true};
constexpr Slot kB1{"b1", 1, false}, kB2{"b2", -1, false};

// The description of `value` (`slot` of experts with options o), in `view`.
parallel::Parameter BoxOf(const ExpertsOptions& o, const Slot& slot, const Tensor& value,
                          const Tensor& grad, dist::View view) {
  parallel::Parameter p =
      view == dist::View::kExpert
          ? parallel::Parameter::Expert(slot.name, value, grad, slot.weight)
          : parallel::Parameter::Dense(slot.name, value, grad, slot.weight);
  p.Split(0, o.first, o.experts_total());
  const bool hidden_split = o.hidden_whole() > o.d_hidden;
  if (slot.hidden_dim >= 0) {
    p.Split(slot.hidden_dim, o.hidden_offset, o.hidden_whole());
  } else if (hidden_split) {
    p.ReplicatedOver(dist::Axis::kTp, /*grad_summed=*/true);
  }
  return p;
}

Tensor ZerosOrUndefined(const Shape& shape, Device device, DeviceContext* ctx) {
  return shape.empty() ? Tensor() : Tensor::Zeros(shape, DType::kF32, device, ctx);
}

}  // namespace

Status ExpertsOptions::Validate() const {
  if (d_model <= 0) return InvalidArgument("experts.d_model=", d_model, " must be > 0");
  if (d_hidden <= 0) return InvalidArgument("experts.d_hidden=", d_hidden, " must be > 0");
  if (first < 0) return InvalidArgument("experts.first=", first, " must be >= 0");
  if (num_local < 1) return InvalidArgument("experts.num_local=", num_local, " must be >= 1");
  if (first + num_local > experts_total()) {
    return InvalidArgument("experts [", first, ", +", num_local, ") of ", experts_total());
  }
  if (hidden_offset < 0 || hidden_offset + d_hidden > hidden_whole()) {
    return InvalidArgument("experts: hidden units [", hidden_offset, ", +", d_hidden, ") of ",
                           hidden_whole());
  }
  return OkStatus();
}

ExpertsOptions RoutedExpertsOptions(const MoEConfig& config, int64_t first, int64_t num_local,
                                    Device device) {
  SY_CHECK(first >= 0 && num_local >= 1 && first + num_local <= config.num_experts)
      << "experts [" << first << ", " << first + num_local << ") of " << config.num_experts;
  return ExpertsOptions{.d_model = config.d_model,
                        .d_hidden = config.d_expert,
                        .activation = config.activation,
                        .bias = config.bias,
                        .first = first,
                        .num_local = num_local,
                        .device = device,
                        .num_experts = config.num_experts};
}

ExpertsOptions SharedExpertsOptions(const MoEConfig& config, Device device) {
  SY_CHECK_GT(config.num_shared_experts, 0) << "SharedExpertsOptions without shared experts";
  return ExpertsOptions{.d_model = config.d_model,
                        .d_hidden = config.num_shared_experts * config.shared_hidden(),
                        .activation = config.activation,
                        .bias = config.bias,
                        .first = 0,
                        .num_local = 1,
                        .device = device};
}

Experts::Experts(const ExpertsOptions& options, DeviceContext* ctx)
    : Experts(options, ExpertsParams{}, ctx) {
  const ParamShapes s = ShapesOf(options);
  const Device dev = options.device;
  w1_ = ZerosOrUndefined(s.w1, dev, ctx);
  w2_ = ZerosOrUndefined(s.w2, dev, ctx);
  w3_ = ZerosOrUndefined(s.w3, dev, ctx);
  b1_ = ZerosOrUndefined(s.b1, dev, ctx);
  b2_ = ZerosOrUndefined(s.b2, dev, ctx);
}

Experts::Experts(const ExpertsOptions& options, ExpertsParams params, DeviceContext* ctx)
    : options_(options),
      w1_(std::move(params.w1)),
      w2_(std::move(params.w2)),
      w3_(std::move(params.w3)),
      b1_(std::move(params.b1)),
      b2_(std::move(params.b2)) {
  SY_CHECK_OK(options.Validate());
  SY_CHECK(options.device.is_cpu() || (ctx != nullptr && ctx->device() == options.device))
      << "experts on " << options.device << " need that device's DeviceContext";
  const ParamShapes s = ShapesOf(options);
  const Device dev = options.device;
  grad_w1_ = ZerosOrUndefined(s.w1, dev, ctx);
  grad_w2_ = ZerosOrUndefined(s.w2, dev, ctx);
  grad_w3_ = ZerosOrUndefined(s.w3, dev, ctx);
  grad_b1_ = ZerosOrUndefined(s.b1, dev, ctx);
  grad_b2_ = ZerosOrUndefined(s.b2, dev, ctx);
}

Experts Experts::Init(const ExpertsOptions& options, uint64_t seed, const std::string& name,
                      float std, float out_std, DeviceContext* ctx) {
  Experts experts(options, ctx);
  auto draw = [&](const Slot& slot, const Tensor& w, float scale) {
    if (!w.defined()) return;
    parallel::Parameter p = BoxOf(options, slot, w, Tensor(), dist::View::kDense);
    parallel::InitNormal(p, seed, scale, ctx, name + "." + slot.name);
  };
  draw(kW1, experts.w1_, std);
  draw(kW2, experts.w2_, out_std);
  draw(kW3, experts.w3_, std);
  return experts;
}

StatusOr<Experts> Experts::FromTensors(const ExpertsOptions& options, ExpertsParams params,
                                       DeviceContext* ctx) {
  SY_RETURN_IF_ERROR(options.Validate());
  const ParamShapes s = ShapesOf(options);
  SY_RETURN_IF_ERROR(CheckParam("w1", params.w1, s.w1, options.device));
  SY_RETURN_IF_ERROR(CheckParam("w2", params.w2, s.w2, options.device));
  SY_RETURN_IF_ERROR(CheckParam("w3", params.w3, s.w3, options.device));
  SY_RETURN_IF_ERROR(CheckParam("b1", params.b1, s.b1, options.device));
  SY_RETURN_IF_ERROR(CheckParam("b2", params.b2, s.b2, options.device));
  return Experts(options, std::move(params), ctx);
}

namespace {

// The row groups of one Forward / Backward: host counts (with the CPU's schedule) or
// device offsets (kernels/gemm.h's device-sized products); each op picks its overload.
struct Groups {
  std::span<const int64_t> rows;
  Tensor offsets;
  kernels::GroupSchedule schedule = kernels::GroupSchedule::kAuto;

  static Groups Of(const ExpertsActivations& acts) {
    return Groups{acts.rows, acts.offsets, acts.schedule};
  }
  void Gemm(const Tensor& x, const Tensor& w, bool trans_w, Tensor& out, float beta,
            DeviceContext* ctx) const {
    if (offsets.defined()) {
      kernels::GroupedGemm(x, offsets, w, trans_w, out, 1.0f, beta, ctx);
    } else {
      kernels::GroupedGemm(x, rows, w, trans_w, out, 1.0f, beta, ctx, schedule);
    }
  }
  void WeightGrad(const Tensor& x, const Tensor& dy, Tensor& dw, DeviceContext* ctx) const {
    if (offsets.defined()) {
      kernels::GroupedGemmWeightGrad(x, dy, offsets, dw, 1.0f, /*beta=*/1.0f, ctx);
    } else {
      kernels::GroupedGemmWeightGrad(x, dy, rows, dw, 1.0f, /*beta=*/1.0f, ctx, schedule);
    }
  }
  void AddBias(Tensor& out, const Tensor& bias, DeviceContext* ctx) const {
    if (offsets.defined()) {
      kernels::GroupedAddBias(out, offsets, bias, ctx);
    } else {
      kernels::GroupedAddBias(out, rows, bias, ctx);
    }
  }
  void BiasGrad(const Tensor& dy, Tensor& dbias, DeviceContext* ctx) const {
    if (offsets.defined()) {
      kernels::GroupedBiasGrad(dy, offsets, dbias, /*beta=*/1.0f, ctx);
    } else {
      kernels::GroupedBiasGrad(dy, rows, dbias, /*beta=*/1.0f, ctx);
    }
  }
  kernels::RowGroups Kernel() const { return kernels::RowGroups{rows, offsets}; }
};

}  // namespace

ExpertsActivations Experts::Forward(const Tensor& x, std::span<const int64_t> rows_per_expert,
                                    DeviceContext* ctx, kernels::GroupSchedule schedule,
                                    kernels::KeepInput keep) const {
  SY_CHECK_EQ(static_cast<int64_t>(rows_per_expert.size()), options_.num_local)
      << "Experts::Forward: one row count per local expert";
  ExpertsActivations acts;
  acts.rows.assign(rows_per_expert.begin(), rows_per_expert.end());
  acts.schedule = schedule;
  ForwardInto(x, acts, ctx, keep);
  return acts;
}

ExpertsActivations Experts::Forward(const Tensor& x, const Tensor& offsets, DeviceContext* ctx,
                                    bool zero_past_groups) const {
  SY_CHECK(offsets.defined() && offsets.numel() == options_.num_local + 1)
      << "Experts::Forward: offsets must hold num_local + 1 = " << options_.num_local + 1
      << " entries, got " << offsets.DebugString();
  ExpertsActivations acts;
  acts.offsets = offsets;
  ForwardInto(x, acts, ctx, kernels::KeepInput::kOperand, zero_past_groups);
  return acts;
}

void Experts::ForwardInto(const Tensor& x, ExpertsActivations& acts, DeviceContext* ctx,
                          kernels::KeepInput keep, bool zero_past_groups) const {
  const int64_t d = options_.d_model, f = options_.d_hidden;
  SY_CHECK(x.ndim() == 2 && x.dim(1) == d)
      << "Experts::Forward: x " << ShapeString(x.shape()) << " for d_model=" << d;
  SY_CHECK(x.device() == options_.device)
      << "Experts::Forward: x on " << x.device() << ", the experts on " << options_.device;
  const int64_t r = x.dim(0);
  const Device dev = x.device();
  const Groups groups = Groups::Of(acts);

  // What the products read and Backward keeps: under bf16 activation storage x's bf16
  // operand (kernels/activation_storage.h), converted once for the forward and the weight
  // gradients' products.
  acts.x = kernels::KeptOperand(x, ctx, keep);
  // swiglu's two products read x: in bf16 mode it is converted once for both.
  const Tensor x_mm = options_.activation == Activation::kSwiglu
                          ? kernels::MatmulOperand(acts.x, ctx)
                          : acts.x;
  // a += b1 and the activation: one pass (the fused grouped ops, the same bits; without b1
  // the flat fused op with no bias), but relu's. Under bf16 storage they write h and what
  // backward keeps of a (and b) in bf16 in that pass (kernels::KeptRounded): the bits of the
  // f32 op, then KeptOperand / KeepRounded.
  const bool fuse = options_.activation != Activation::kRelu;
  const bool kept16 = fuse && kernels::StoresBf16(ctx);
  Tensor h = Tensor::Empty({r, f}, kept16 ? DType::kBF16 : DType::kF32, dev);  // (R, f)
  Tensor kept_a = kept16 ? Tensor::Empty({r, f}, DType::kBF16, dev) : Tensor(), kept_b;
  if (kept16 && options_.activation == Activation::kGelu && options_.bias &&
      groups.offsets.defined()) {
    // Device-sized GELU experts with b1: the product writes h and the kept a itself
    // (kernels::GroupedGemmBiasGelu, the same bits; no f32 a in memory on CUDA).
    kernels::GroupedGemmBiasGelu(x_mm, groups.offsets, w1_, b1_, h, kept_a, ctx);
    acts.a = kept_a;
    acts.h = kernels::KeptOperand(h, ctx);
    return ForwardOutput(acts, zero_past_groups, ctx);
  }
  acts.a = Tensor::Empty({r, f}, DType::kF32, dev);  // (R, f)
  groups.Gemm(x_mm, w1_, /*trans_w=*/false, acts.a, 0.0f, ctx);
  switch (options_.activation) {
    case Activation::kGelu:
      if (options_.bias) {
        kernels::GroupedBiasGeluForward(acts.a, groups.Kernel(), b1_, h, ctx,
                                        {.a = kept16 ? &kept_a : nullptr});
      } else {
        kernels::BiasGeluForward(acts.a, Tensor(), h, ctx, {.a = kept16 ? &kept_a : nullptr});
      }
      break;
    case Activation::kRelu:
      if (options_.bias) groups.AddBias(acts.a, b1_, ctx);
      kernels::ReluForward(acts.a, h, ctx);
      break;
    case Activation::kSwiglu:
      acts.b = Tensor::Empty({r, f}, DType::kF32, dev);  // (R, f)
      groups.Gemm(x_mm, w3_, /*trans_w=*/false, acts.b, 0.0f, ctx);
      if (kept16) kept_b = Tensor::Empty({r, f}, DType::kBF16, dev);
      if (options_.bias) {
        kernels::GroupedBiasSwigluForward(acts.a, groups.Kernel(), b1_, acts.b, h, ctx,
                                          {.a = kept16 ? &kept_a : nullptr,
                                           .b = kept16 ? &kept_b : nullptr});
      } else {
        kernels::BiasSwigluForward(acts.a, Tensor(), acts.b, h, ctx,
                                   {.a = kept16 ? &kept_a : nullptr,
                                    .b = kept16 ? &kept_b : nullptr});
      }
      break;
  }
  // The activation's backward reads a (and b): kept rounded to bf16 under bf16 storage, once
  // h has been computed from their f32 values. h is kept as W2's operand.
  if (kept16) {
    acts.a = kept_a;
    if (acts.b.defined()) acts.b = kept_b;
  } else {
    acts.a = kernels::KeepRounded(acts.a, ctx);
    if (acts.b.defined()) acts.b = kernels::KeepRounded(acts.b, ctx);
  }
  acts.h = kernels::KeptOperand(h, ctx);
  ForwardOutput(acts, zero_past_groups, ctx);
}

// y = h W2 (+ b2), from the kept h.
void Experts::ForwardOutput(ExpertsActivations& acts, bool zero_past_groups,
                            DeviceContext* ctx) const {
  const Groups groups = Groups::Of(acts);
  const int64_t r = acts.h.dim(0), d = options_.d_model;
  acts.y = zero_past_groups ? Tensor::Zeros({r, d}, DType::kF32, acts.h.device(), ctx)
                           : Tensor::Empty({r, d}, DType::kF32, acts.h.device());  // (R, d)
  groups.Gemm(acts.h, w2_, /*trans_w=*/false, acts.y, 0.0f, ctx);
  if (options_.bias && options_.adds_output_bias) groups.AddBias(acts.y, b2_, ctx);
}

Tensor Experts::Backward(const ExpertsActivations& acts, const Tensor& dy, DeviceContext* ctx) {
  // The output itself is not read (the MoE layer lets it go once combined).
  // Device-sized groups: every row of x (those past the groups included); else the counts.
  int64_t rows_total = 0;
  if (acts.offsets.defined()) {
    rows_total = acts.x.dim(0);
  } else {
    for (int64_t n : acts.rows) rows_total += n;
  }
  SY_CHECK(acts.h.defined() && dy.shape() == (Shape{rows_total, options_.d_model}))
      << "Experts::Backward: dy " << ShapeString(dy.shape()) << " for " << rows_total
      << " rows of width " << options_.d_model;
  const int64_t r = dy.dim(0), f = options_.d_hidden;
  const Device dev = dy.device();
  const Groups groups = Groups::Of(acts);

  // y = h @ W2 + b2.
  if (options_.bias && options_.adds_output_bias) groups.BiasGrad(dy, grad_b2_, ctx);
  // An operand two products read is converted once for both in bf16 mode (MatmulOperand).
  const Tensor dy_mm = kernels::MatmulOperand(dy, ctx);
  groups.WeightGrad(acts.h, dy_mm, grad_w2_, ctx);
  Tensor dh = Tensor::Empty({r, f}, DType::kF32, dev);  // (R, f)
  groups.Gemm(dy_mm, w2_, /*trans_w=*/true, dh, 0.0f, ctx);

  // h = act(a), or silu(a) * b; a and b as kept (bf16 under bf16 storage: the kernels read
  // their rounded values as f32). With b1's gradient in the same pass (the fused grouped
  // ops), but relu's, which reads da after. The pass writes da (and db) as W1's (W3's)
  // products read them, bf16 in bf16 mode (no conversion), but for relu's bias gradient;
  // in f32 in place of dh.
  const bool bias = options_.bias;
  const bool grads16 =
      kernels::HiddenGradsInBf16(kernels::MatmulOperandDType(ctx) == DType::kBF16,
                                 options_.activation == Activation::kRelu && bias);
  const DType grad_dtype = grads16 ? DType::kBF16 : DType::kF32;
  Tensor da = grads16 ? Tensor::Empty({r, f}, grad_dtype, dev) : dh;
  Tensor db;
  const Tensor& a = acts.a;
  const Tensor& b = acts.b;
  switch (options_.activation) {
    case Activation::kGelu:
      if (bias) {
        kernels::GroupedGeluBackwardBiasGrad(a, dh, da, groups.Kernel(), grad_b1_, 1.0f, ctx);
      } else {
        kernels::GeluBackward(a, dh, da, ctx);
      }
      break;
    case Activation::kRelu:
      kernels::ReluBackward(a, dh, da, ctx);
      if (bias) groups.BiasGrad(da, grad_b1_, ctx);
      break;
    case Activation::kSwiglu:
      db = Tensor::Empty({r, f}, grad_dtype, dev);  // (R, f)
      if (bias) {
        kernels::GroupedSwigluBackwardBiasGrad(a, b, dh, da, db, groups.Kernel(), grad_b1_, 1.0f,
                                               ctx);
      } else {
        kernels::SwigluBackward(a, b, dh, da, db, ctx);
      }
      break;
  }
  dh = Tensor();  // da holds it now, or replaced it

  // a = x @ W1 + b1 (and b = x @ W3).
  const Tensor x_mm = db.defined() ? kernels::MatmulOperand(acts.x, ctx) : acts.x;
  const Tensor da_mm = kernels::MatmulOperand(da, ctx);
  groups.WeightGrad(x_mm, da_mm, grad_w1_, ctx);
  Tensor dx = Tensor::Empty({r, options_.d_model}, DType::kF32, dev);  // (R, d)
  groups.Gemm(da_mm, w1_, /*trans_w=*/true, dx, 0.0f, ctx);
  if (db.defined()) {
    const Tensor db_mm = kernels::MatmulOperand(db, ctx);
    groups.WeightGrad(x_mm, db_mm, grad_w3_, ctx);
    groups.Gemm(db_mm, w3_, /*trans_w=*/true, dx, /*beta=*/1.0f, ctx);
  }
  return dx;
}

void Experts::ZeroGrad(DeviceContext* ctx) {
  for (Tensor* g : {&grad_w1_, &grad_w2_, &grad_w3_, &grad_b1_, &grad_b2_}) {
    if (g->defined()) g->SetZero(ctx);
  }
}

std::vector<parallel::Parameter> Experts::Parameters(dist::View view) const {
  std::vector<parallel::Parameter> out;
  auto add = [&](const Slot& slot, const Tensor& value, const Tensor& grad) {
    if (value.defined()) out.push_back(BoxOf(options_, slot, value, grad, view));
  };
  add(kW1, w1_, grad_w1_);
  add(kW2, w2_, grad_w2_);
  add(kW3, w3_, grad_w3_);
  add(kB1, b1_, grad_b1_);
  add(kB2, b2_, grad_b2_);
  return out;
}

DenseMlp::DenseMlp(Experts experts) : experts_(std::move(experts)) {
  SY_CHECK_EQ(experts_.options().num_local, 1) << "a DenseMlp is one expert";
}

ExpertsActivations DenseMlp::Forward(const Tensor& x, DeviceContext* ctx) const {
  SY_CHECK_EQ(x.ndim(), 2) << "DenseMlp::Forward: x " << ShapeString(x.shape());
  const int64_t rows[1] = {x.dim(0)};
  return experts_.Forward(x, rows, ctx, kernels::GroupSchedule::kAuto,
                          kernels::KeepInput::kAsGiven);
}

Tensor DenseMlp::Backward(const ExpertsActivations& acts, const Tensor& dy, DeviceContext* ctx) {
  return experts_.Backward(acts, dy, ctx);
}

}  // namespace switchyard::moe
