#include "engine/parallel/parameter.h"

#include <sstream>
#include <vector>

#include "engine/core/check.h"
#include "engine/core/philox.h"
#include "kernels/elementwise.h"
#include "kernels/random.h"

namespace switchyard::parallel {

std::string PartId::Name() const {
  switch (kind) {
    case Kind::kNone: return "";
    case Kind::kEmbed: return "embed";
    case Kind::kLayer: return StrCat("layers.", layer);
    case Kind::kNormF: return "norm_f";
    case Kind::kHead: return "head";
  }
  return "";
}

using dist::Axis;

AxisSet::AxisSet(std::initializer_list<Axis> axes) {
  for (Axis a : axes) bits_ |= static_cast<uint8_t>(1u << static_cast<int>(a));
}

AxisSet AxisSet::With(Axis axis) const {
  AxisSet out = *this;
  out.bits_ |= static_cast<uint8_t>(1u << static_cast<int>(axis));
  return out;
}

std::vector<Axis> AxisSet::Axes() const {
  std::vector<Axis> out;
  for (Axis a : dist::kAllAxes)
    if (Has(a)) out.push_back(a);
  return out;
}

std::string AxisSet::ToString(dist::View view) const {
  std::string out;
  // Data-parallel axes first: they are the common case.
  for (Axis a : {Axis::kDp, Axis::kCp, Axis::kTp, Axis::kEp, Axis::kPp}) {
    if (!Has(a)) continue;
    if (!out.empty()) out += ",";
    out += dist::AxisName(a, view);
  }
  return out.empty() ? "none" : out;
}

Parameter Parameter::Dense(std::string name, Tensor value, Tensor grad, bool weight_decay) {
  Parameter p;
  p.name = std::move(name);
  p.global_shape = value.shape();
  p.view = dist::View::kDense;
  p.replicated = p.grad_sum = AxisSet{Axis::kDp, Axis::kCp};
  p.weight_decay = weight_decay;
  p.trainable = grad.defined();
  p.value = std::move(value);
  p.grad = std::move(grad);
  return p;
}

Parameter Parameter::Expert(std::string name, Tensor value, Tensor grad, bool weight_decay) {
  Parameter p = Dense(std::move(name), std::move(value), std::move(grad), weight_decay);
  p.view = dist::View::kExpert;
  p.replicated = p.grad_sum = AxisSet{Axis::kDp};  // edp
  return p;
}

Parameter& Parameter::Split(int dim, int64_t at, int64_t global) {
  SY_CHECK(dim >= 0 && dim < static_cast<int>(global_shape.size()))
      << name << ": split dim " << dim << " of " << ShapeString(global_shape);
  if (offset.empty()) offset.assign(global_shape.size(), 0);
  offset[dim] = at;
  global_shape[dim] = global;
  return *this;
}

Parameter& Parameter::ReplicatedOver(Axis axis, bool grad_summed) {
  replicated = replicated.With(axis);
  if (grad_summed) grad_sum = grad_sum.With(axis);
  return *this;
}

std::string Parameter::Describe() const {
  std::ostringstream out;
  out << name << " " << ShapeString(BoxShape());
  if (!is_whole()) {
    out << " of " << ShapeString(global_shape) << " at [";
    for (size_t d = 0; d < global_shape.size(); ++d) out << (d ? ", " : "") << OffsetAt(d);
    out << "]";
  }
  if (flat_begin != 0 || flat_end >= 0) {
    out << ", elements [" << flat_begin << ", " << FlatEnd() << ")" << (flat_value ? " held" : " owned");
  }
  out << ", replicated over " << replicated.ToString(view);
  if (!(grad_sum == replicated)) out << " (gradient summed over " << grad_sum.ToString(view) << ")";
  return out.str();
}

void Parameter::CheckConsistent() const {
  SY_CHECK(value.defined()) << "parameter '" << name << "' has no value";
  const Shape& box = BoxShape();
  SY_CHECK(box.size() == global_shape.size())
      << name << ": box " << ShapeString(box) << " is not a box of " << ShapeString(global_shape);
  SY_CHECK(offset.empty() || offset.size() == global_shape.size())
      << name << ": " << offset.size() << " offsets for " << global_shape.size() << " dims";
  for (size_t d = 0; d < global_shape.size(); ++d) {
    SY_CHECK(OffsetAt(d) >= 0 && OffsetAt(d) + box[d] <= global_shape[d])
        << name << ": box [" << OffsetAt(d) << ", +" << box[d] << ") along dim " << d
        << " is outside " << ShapeString(global_shape);
  }
  SY_CHECK(grad_sum.SubsetOf(replicated))
      << name << ": gradient summed over " << grad_sum.ToString(view)
      << " but replicated only over " << replicated.ToString(view);
  SY_CHECK(flat_begin >= 0 && (flat_end < 0 || (flat_begin <= flat_end && flat_end <= NumElements(box))))
      << name << ": flat range [" << flat_begin << ", " << flat_end << ") of " << NumElements(box);
  SY_CHECK(!flat_value || (value.ndim() == 1 && value.numel() == FlatEnd() - flat_begin))
      << name << ": a flat value of elements [" << flat_begin << ", " << FlatEnd()
      << ") must be 1-D of that length, not " << ShapeString(value.shape());
  SY_CHECK(!trainable || (grad.defined() && grad.shape() == value.shape()))
      << name << ": a trainable parameter needs a gradient of its shape";
}

void AppendPrefixed(const std::string& prefix, std::vector<Parameter> params,
                    std::vector<Parameter>& out) {
  for (Parameter& p : params) {
    p.name = prefix + "." + p.name;
    out.push_back(std::move(p));
  }
}

void ParameterRegistry::Add(Parameter p) {
  SY_CHECK(Find(p.name) == nullptr) << "parameter '" << p.name << "' registered twice";
  p.CheckConsistent();
  params_.push_back(std::move(p));
}

Parameter* ParameterRegistry::Find(const std::string& name) {
  for (Parameter& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

const Parameter* ParameterRegistry::Find(const std::string& name) const {
  for (const Parameter& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

void ParameterRegistry::ZeroGrad(DeviceContext* ctx) {
  // One dispatch for all of them (on CUDA a launch for every 64, not a memset each).
  std::vector<Tensor> grads;
  for (Parameter& p : params_)
    if (p.grad.defined() && p.grad.buffer().resident()) grads.push_back(p.grad);
  kernels::ZeroMany(grads, ctx);
}

int64_t ParameterRegistry::GlobalElements(bool trainable_only) const {
  int64_t n = 0;
  for (const Parameter& p : params_)
    if (p.trainable || !trainable_only) n += NumElements(p.global_shape);
  return n;
}

void FillNormalBox(Tensor& box, const Shape& global, const std::vector<int64_t>& offset,
                   uint64_t seed, const std::string& stream_name, float mean, float std,
                   DeviceContext* ctx) {
  const int nd = static_cast<int>(global.size());
  SY_CHECK(box.ndim() == nd) << "FillNormalBox: box " << box.DebugString()
                                                     << " of " << ShapeString(global);
  const RngKey key{seed, StreamId(stream_name)};
  if (box.numel() == 0) return;
  if (nd == 0) {  // a scalar: the whole tensor
    kernels::FillNormal(box, key, 0, mean, std, ctx);
    return;
  }
  auto off = [&](int d) { return offset.empty() ? int64_t{0} : offset[d]; };
  // The box is a set of runs along its innermost dims that are whole in the global tensor:
  // find the outermost dim from which the box spans the global extents (a contiguous run).
  int inner = nd;  // dims [inner, nd) are whole
  while (inner > 0 && box.dim(inner - 1) == global[inner - 1] && off(inner - 1) == 0) --inner;
  // dims [run_dim, nd) form one contiguous run in both tensors.
  const int run_dim = inner > 0 ? inner - 1 : 0;
  int64_t run = 1;
  for (int d = run_dim; d < nd; ++d) run *= box.dim(d);
  std::vector<int64_t> gstride(nd, 1);
  for (int d = nd - 2; d >= 0; --d) gstride[d] = gstride[d + 1] * global[d + 1];
  int64_t runs = box.numel() / run;
  std::vector<int64_t> idx(run_dim, 0);  // index inside the box of the dims before run_dim
  Tensor flat = box.Reshape({box.numel()});
  for (int64_t r = 0; r < runs; ++r) {
    int64_t first = off(run_dim) * gstride[run_dim];
    for (int d = 0; d < run_dim; ++d) first += (idx[d] + off(d)) * gstride[d];
    Tensor piece = flat.View({run}, r * run);
    kernels::FillNormal(piece, key, first, mean, std, ctx);
    for (int d = run_dim - 1; d >= 0; --d) {  // odometer
      if (++idx[d] < box.dim(d)) break;
      idx[d] = 0;
    }
  }
}

void InitNormal(Parameter& p, uint64_t seed, float std, DeviceContext* ctx,
                const std::string& stream_name) {
  FillNormalBox(p.value, p.global_shape, p.offset, seed,
                stream_name.empty() ? p.name : stream_name, 0.0f, std, ctx);
}

}  // namespace switchyard::parallel
