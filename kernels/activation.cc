// Argument checks and device dispatch for kernels/activation.h.
#include "kernels/check.h"
#include "kernels/activation.h"

#include <initializer_list>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/elementwise.h"

namespace switchyard::kernels {
namespace {

using Named = std::pair<const Tensor*, const char*>;

// Every tensor f32 on the device of `out` with the shape of `out`.
void CheckElementwise(const char* op, const Tensor& out, std::initializer_list<Named> tensors) {
  SY_CHECK(out.defined()) << op << ": the output is undefined";
  for (const auto& [t, what] : tensors) {
    CheckTensorOn(*t, DType::kF32, out.device(), op, what);
    SY_CHECK(t->shape() == out.shape()) << op << ": " << what << " " << ShapeString(t->shape())
                                        << ", output " << ShapeString(out.shape());
  }
}

// Each tensor defined, f32 or bf16, all of one dtype (`others` names the rest in the
// message), on ref's device with ref's shape (`ref_name`).
void CheckF32OrBf16(const char* op, const Tensor& ref, const char* ref_name,
                    std::initializer_list<Named> tensors, const char* others) {
  const DType dtype = tensors.begin()->first->dtype();
  for (const auto& [t, what] : tensors) {
    SY_CHECK(t->defined()) << op << ": " << what << " is undefined";
    SY_CHECK(t->dtype() == DType::kF32 || t->dtype() == DType::kBF16)
        << op << ": " << what << " is " << DTypeName(t->dtype()) << ", not f32 or bf16";
    SY_CHECK(t->dtype() == dtype) << op << ": " << what << " is " << DTypeName(t->dtype())
                                  << ", " << others << " " << DTypeName(dtype);
    CheckTensorOn(*t, t->dtype(), ref.device(), op, what);
    SY_CHECK(t->shape() == ref.shape()) << op << ": " << what << " " << ShapeString(t->shape())
                                        << ", " << ref_name << " " << ShapeString(ref.shape());
  }
}

// The forward's inputs a backward op reads (x; a and b): each f32 or bf16 (the values kept
// under bf16 activation storage), all of one dtype, on out's device with out's shape.
void CheckSaved(const char* op, const Tensor& out, std::initializer_list<Named> tensors) {
  SY_CHECK(out.defined()) << op << ": the output is undefined";
  CheckF32OrBf16(op, out, "output", tensors, "the other saved input");
}

// A backward op's gradients (dx; swiglu's da and db), of dy's shape on its device: f32 (and
// then possibly dy's memory), or all bf16, the operands of the products that read them next:
// the f32 results rounded to nearest even as they are stored (not dy's memory then).
void CheckGrads(const char* op, const Tensor& dy, std::initializer_list<Named> grads) {
  CheckF32OrBf16(op, dy, "dy", grads, "the other gradient");
  for (const auto& [t, what] : grads) {
    SY_CHECK(t->dtype() == DType::kF32 || t->numel() == 0 || t->raw_data() != dy.raw_data())
        << op << ": a bf16 " << what << " cannot be dy's memory";
  }
}

// rowwise (R, n) against a per-group bias (G, n) and rows (G counts summing to R).
// `out` is whichever of the two the op writes.
void CheckGroupedBias(const char* op, const Tensor& rowwise, std::span<const int64_t> rows,
                      const Tensor& bias, const Tensor& out) {
  SY_CHECK(out.defined()) << op << ": the output is undefined";
  CheckTensorOn(rowwise, DType::kF32, out.device(), op, "the row tensor");
  CheckTensorOn(bias, DType::kF32, out.device(), op, "the bias");
  SY_CHECK(rowwise.ndim() == 2 && bias.ndim() == 2 &&
           bias.dim(0) == static_cast<int64_t>(rows.size()) && bias.dim(1) == rowwise.dim(1))
      << op << " shapes: rows-tensor " << ShapeString(rowwise.shape()) << ", bias "
      << ShapeString(bias.shape()) << ", " << rows.size() << " groups";
  int64_t total = 0;
  for (int64_t r : rows) {
    SY_CHECK_GE(r, 0) << op << ": negative group size";
    total += r;
  }
  SY_CHECK_EQ(total, rowwise.dim(0)) << op << ": rows do not cover the tensor";
}

}  // namespace

void GeluForward(const Tensor& x, Tensor& y, DeviceContext* ctx) {
  CheckElementwise("GeluForward", y, {{&x, "x"}, {&y, "y"}});
  SY_DISPATCH_DEVICE(y, ctx, cpu::GeluForward(x, y), cuda::GeluForward(x, y, ctx));
}

void GeluBackward(const Tensor& x, const Tensor& dy, Tensor& dx, DeviceContext* ctx) {
  CheckElementwise("GeluBackward", dy, {{&dy, "dy"}});
  CheckGrads("GeluBackward", dy, {{&dx, "dx"}});
  CheckSaved("GeluBackward", dx, {{&x, "x"}});
  SY_DISPATCH_DEVICE(dx, ctx, cpu::GeluBackward(x, dy, dx), cuda::GeluBackward(x, dy, dx, ctx));
}

void ReluForward(const Tensor& x, Tensor& y, DeviceContext* ctx) {
  CheckElementwise("ReluForward", y, {{&x, "x"}, {&y, "y"}});
  SY_DISPATCH_DEVICE(y, ctx, cpu::ReluForward(x, y), cuda::ReluForward(x, y, ctx));
}

void ReluBackward(const Tensor& x, const Tensor& dy, Tensor& dx, DeviceContext* ctx) {
  CheckElementwise("ReluBackward", dy, {{&dy, "dy"}});
  CheckGrads("ReluBackward", dy, {{&dx, "dx"}});
  CheckSaved("ReluBackward", dx, {{&x, "x"}});
  SY_DISPATCH_DEVICE(dx, ctx, cpu::ReluBackward(x, dy, dx), cuda::ReluBackward(x, dy, dx, ctx));
}

void SwigluForward(const Tensor& a, const Tensor& b, Tensor& out, DeviceContext* ctx) {
  CheckElementwise("SwigluForward", out, {{&a, "a"}, {&b, "b"}, {&out, "out"}});
  SY_DISPATCH_DEVICE(out, ctx, cpu::SwigluForward(a, b, out), cuda::SwigluForward(a, b, out, ctx));
}

void SwigluBackward(const Tensor& a, const Tensor& b, const Tensor& dout, Tensor& da, Tensor& db,
                    DeviceContext* ctx) {
  CheckElementwise("SwigluBackward", dout, {{&dout, "dout"}});
  CheckGrads("SwigluBackward", dout, {{&da, "da"}, {&db, "db"}});
  CheckSaved("SwigluBackward", da, {{&a, "a"}, {&b, "b"}});
  SY_CHECK(da.numel() == 0 || da.raw_data() != db.raw_data())
      << "SwigluBackward: da and db are the same memory";
  SY_DISPATCH_DEVICE(da, ctx, cpu::SwigluBackward(a, b, dout, da, db),
                     cuda::SwigluBackward(a, b, dout, da, db, ctx));
}

void AddBias(Tensor& out, const Tensor& bias, DeviceContext* ctx) {
  SY_CHECK(out.defined() && bias.defined()) << "AddBias: undefined tensor";
  SY_CHECK_EQ(bias.ndim(), 1) << "AddBias: bias " << ShapeString(bias.shape());
  SY_CHECK_EQ(out.ndim(), 2) << "AddBias: out " << ShapeString(out.shape());
  const int64_t rows[1] = {out.dim(0)};
  CheckGroupedBias("AddBias", out, rows, bias.Reshape({1, bias.dim(0)}), out);
  SY_DISPATCH_DEVICE(out, ctx, cpu::AddBias(out, bias), cuda::AddBias(out, bias, ctx));
}

void BiasGrad(const Tensor& dy, Tensor& dbias, float beta, DeviceContext* ctx) {
  SY_CHECK(dy.defined() && dbias.defined()) << "BiasGrad: undefined tensor";
  SY_CHECK_EQ(dbias.ndim(), 1) << "BiasGrad: dbias " << ShapeString(dbias.shape());
  SY_CHECK_EQ(dy.ndim(), 2) << "BiasGrad: dy " << ShapeString(dy.shape());
  const int64_t rows[1] = {dy.dim(0)};
  CheckGroupedBias("BiasGrad", dy, rows, dbias.Reshape({1, dbias.dim(0)}), dbias);
  SY_DISPATCH_DEVICE(dbias, ctx, cpu::BiasGrad(dy, dbias, beta),
                     cuda::BiasGrad(dy, dbias, beta, ctx));
}

void BiasGradCast(const Tensor& dy, Tensor& dbias, float beta, Tensor& dy16,
                  DeviceContext* ctx) {
  SY_CHECK(dy.defined() && dbias.defined() && dy16.defined())
      << "BiasGradCast: undefined tensor";
  SY_CHECK_EQ(dbias.ndim(), 1) << "BiasGradCast: dbias " << ShapeString(dbias.shape());
  SY_CHECK_EQ(dy.ndim(), 2) << "BiasGradCast: dy " << ShapeString(dy.shape());
  SY_CHECK(dy16.dtype() == DType::kBF16 && dy16.shape() == dy.shape() &&
           dy16.device() == dy.device())
      << "BiasGradCast: dy16 must be bf16 of dy's shape and device, got " << dy16.DebugString();
  const int64_t rows[1] = {dy.dim(0)};
  CheckGroupedBias("BiasGradCast", dy, rows, dbias.Reshape({1, dbias.dim(0)}), dbias);
  auto on_cpu = [dy, dbias, beta, dy16]() mutable {
    cpu::BiasGrad(dy, dbias, beta);
    cpu::Cast(dy, dy16);
  };
  SY_DISPATCH_DEVICE(dbias, ctx, on_cpu(), cuda::BiasGradCast(dy, dbias, beta, dy16, ctx));
  if (dy.numel() > 0) counters::CountConversion(DType::kF32, DType::kBF16, dy.numel());
}

void GroupedAddBias(Tensor& out, std::span<const int64_t> rows, const Tensor& bias,
                    DeviceContext* ctx) {
  CheckGroupedBias("GroupedAddBias", out, rows, bias, out);
  // Host arguments the CPU op reads go into the recorded closure by value (kernels/dispatch.h).
  const std::vector<int64_t> host_rows(rows.begin(), rows.end());
  SY_DISPATCH_DEVICE(out, ctx, cpu::GroupedAddBias(out, host_rows, bias),
                     cuda::GroupedAddBias(out, rows, bias, ctx));
}

void GroupedBiasGrad(const Tensor& dy, std::span<const int64_t> rows, Tensor& dbias, float beta,
                     DeviceContext* ctx) {
  CheckGroupedBias("GroupedBiasGrad", dy, rows, dbias, dbias);
  // Host arguments the CPU op reads go into the recorded closure by value (kernels/dispatch.h).
  const std::vector<int64_t> host_rows(rows.begin(), rows.end());
  SY_DISPATCH_DEVICE(dbias, ctx, cpu::GroupedBiasGrad(dy, host_rows, dbias, beta),
                     cuda::GroupedBiasGrad(dy, rows, dbias, beta, ctx));
}

// The device-sized ops: the (G + 1) offsets checked (their values too on the CPU, where the
// host-sized op then runs on the grouped rows).
namespace {
void CheckOffsetArgs(const char* op, const Tensor& rowwise, const Tensor& offsets,
                     const Tensor& bias, const Tensor& out) {
  SY_CHECK(out.defined()) << op << ": the output is undefined";
  CheckTensorOn(rowwise, DType::kF32, out.device(), op, "the row tensor");
  CheckTensorOn(bias, DType::kF32, out.device(), op, "the bias");
  CheckTensorOn(offsets, DType::kI64, out.device(), op, "the offsets");
  SY_CHECK(rowwise.ndim() == 2 && bias.ndim() == 2 && bias.dim(1) == rowwise.dim(1) &&
           offsets.ndim() == 1 && offsets.numel() == bias.dim(0) + 1)
      << op << " shapes: rows-tensor " << ShapeString(rowwise.shape()) << ", bias "
      << ShapeString(bias.shape()) << ", offsets " << ShapeString(offsets.shape());
}

// The CPU's rows per group from the offsets' values, checked when the op runs (a recorded op
// reads them at replay).
std::vector<int64_t> OffsetCounts(const char* op, const Tensor& rowwise, const Tensor& offsets,
                                  int64_t groups) {
  std::vector<int64_t> counts;
  const int64_t* o = offsets.data<int64_t>();
  SY_CHECK_EQ(o[0], 0) << op << ": offsets[0] = " << o[0];
  for (int64_t g = 0; g < groups; ++g) {
    SY_CHECK(o[g + 1] >= o[g] && o[g + 1] <= rowwise.dim(0))
        << op << ": offsets[" << g + 1 << "] = " << o[g + 1] << " after " << o[g];
    counts.push_back(o[g + 1] - o[g]);
  }
  return counts;
}
}  // namespace

void GroupedAddBias(Tensor& out, const Tensor& offsets, const Tensor& bias, DeviceContext* ctx) {
  CheckOffsetArgs("GroupedAddBias", out, offsets, bias, out);
  auto on_cpu = [=]() mutable {
    const std::vector<int64_t> rows = OffsetCounts("GroupedAddBias", out, offsets, bias.dim(0));
    Tensor used = out.Slice(0, offsets.data<int64_t>()[bias.dim(0)]);
    cpu::GroupedAddBias(used, rows, bias);
  };
  SY_DISPATCH_DEVICE(out, ctx, on_cpu(), cuda::GroupedAddBias(out, offsets, bias, ctx));
}

void GroupedBiasGrad(const Tensor& dy, const Tensor& offsets, Tensor& dbias, float beta,
                     DeviceContext* ctx) {
  CheckOffsetArgs("GroupedBiasGrad", dy, offsets, dbias, dbias);
  auto on_cpu = [=]() mutable {
    const std::vector<int64_t> rows = OffsetCounts("GroupedBiasGrad", dy, offsets, dbias.dim(0));
    cpu::GroupedBiasGrad(dy.Slice(0, offsets.data<int64_t>()[dbias.dim(0)]), rows, dbias, beta);
  };
  SY_DISPATCH_DEVICE(dbias, ctx, on_cpu(),
                     cuda::GroupedBiasGrad(dy, offsets, dbias, beta, ctx));
}

namespace {
// The fused ops: 2-D (R, n) row tensors of one shape, a bias (n), all f32 on one device.
void CheckBiasRows(const char* op, const Tensor& rowwise, const Tensor& bias) {
  SY_CHECK(rowwise.defined() && bias.defined()) << op << ": undefined tensor";
  SY_CHECK(rowwise.ndim() == 2 && bias.ndim() == 1 && bias.dim(0) == rowwise.dim(1))
      << op << ": rows " << ShapeString(rowwise.shape()) << ", bias " << ShapeString(bias.shape());
  CheckTensorOn(bias, DType::kF32, rowwise.device(), op, "the bias");
}
}  // namespace

namespace {
// A forward op's outputs: the activation h (f32 or bf16) and the KeptRounded tensors (bf16),
// each of a's shape on a's device; b only for swiglu. Returns the kept tensors as values
// (undefined when not asked for) for the CPU's recorded closure.
struct KeptValues {
  Tensor a, b;
};
KeptValues CheckForwardOutputs(const char* op, const Tensor& a, const Tensor& h,
                               KeptRounded kept, bool swiglu) {
  CheckTensorOn(a, DType::kF32, h.device(), op, "a");
  SY_CHECK(h.dtype() == DType::kF32 || h.dtype() == DType::kBF16)
      << op << ": the activation's output is " << DTypeName(h.dtype()) << ", not f32 or bf16";
  SY_CHECK(h.shape() == a.shape()) << op << ": output " << ShapeString(h.shape()) << ", a "
                                   << ShapeString(a.shape());
  SY_CHECK(h.numel() == 0 || h.raw_data() != a.raw_data()) << op << ": the output is a";
  SY_CHECK(swiglu || kept.b == nullptr) << op << ": a kept b without swiglu";
  KeptValues values;
  for (auto [t, v, what] : {std::tuple{kept.a, &values.a, "kept a"},
                            std::tuple{kept.b, &values.b, "kept b"}}) {
    if (t == nullptr) continue;
    CheckTensorOn(*t, DType::kBF16, h.device(), op, what);
    SY_CHECK(t->shape() == a.shape()) << op << ": " << what << " " << ShapeString(t->shape());
    *v = *t;
  }
  return values;
}

// The CPU's forward with bf16 outputs: the f32 op (`f32_op(a, h)`, on a copy of a when a is
// not to be written) and then the roundings, the bits the CUDA kernels write in one pass.
template <typename Op>
void CpuForwardKept(Tensor& a, const Tensor& b, Tensor& h, KeptValues kept, Op f32_op) {
  Tensor af = kept.a.defined() ? a.Clone() : a;
  Tensor hf = h.dtype() == DType::kBF16 ? Tensor::Empty(h.shape(), DType::kF32) : h;
  f32_op(af, hf);
  if (kept.a.defined()) cpu::Cast(af, kept.a);
  if (kept.b.defined()) cpu::Cast(b, kept.b);
  if (h.dtype() == DType::kBF16) cpu::Cast(hf, h);
}
}  // namespace

void BiasGeluForward(Tensor& a, const Tensor& bias, Tensor& h, DeviceContext* ctx,
                     KeptRounded kept) {
  const KeptValues values = CheckForwardOutputs("BiasGeluForward", a, h, kept, false);
  if (bias.defined()) CheckBiasRows("BiasGeluForward", a, bias);
  auto on_cpu = [a, bias, h, values]() mutable {
    CpuForwardKept(a, Tensor(), h, values, [&](Tensor& af, Tensor& hf) {
      if (bias.defined()) {
        cpu::BiasGeluForward(af, bias, hf);
      } else {
        cpu::GeluForward(af, hf);
      }
    });
  };
  SY_DISPATCH_DEVICE(h, ctx, on_cpu(), cuda::BiasGeluForward(a, bias, h, kept, ctx));
}

void BiasSwigluForward(Tensor& a, const Tensor& bias, const Tensor& b, Tensor& out,
                       DeviceContext* ctx, KeptRounded kept) {
  const KeptValues values = CheckForwardOutputs("BiasSwigluForward", a, out, kept, true);
  CheckTensorOn(b, DType::kF32, out.device(), "BiasSwigluForward", "b");
  SY_CHECK(b.shape() == a.shape()) << "BiasSwigluForward: b " << ShapeString(b.shape());
  if (bias.defined()) CheckBiasRows("BiasSwigluForward", a, bias);
  auto on_cpu = [a, bias, b, out, values]() mutable {
    CpuForwardKept(a, b, out, values, [&](Tensor& af, Tensor& of) {
      if (bias.defined()) {
        cpu::BiasSwigluForward(af, bias, b, of);
      } else {
        cpu::SwigluForward(af, b, of);
      }
    });
  };
  SY_DISPATCH_DEVICE(out, ctx, on_cpu(), cuda::BiasSwigluForward(a, bias, b, out, kept, ctx));
}

void GeluBackwardBiasGrad(const Tensor& a, const Tensor& dy, Tensor& dx, Tensor& dbias,
                          float beta, DeviceContext* ctx) {
  CheckElementwise("GeluBackwardBiasGrad", dy, {{&dy, "dy"}});
  CheckGrads("GeluBackwardBiasGrad", dy, {{&dx, "dx"}});
  CheckSaved("GeluBackwardBiasGrad", dx, {{&a, "a"}});
  CheckBiasRows("GeluBackwardBiasGrad", dy, dbias);
  SY_DISPATCH_DEVICE(dx, ctx, cpu::GeluBackwardBiasGrad(a, dy, dx, dbias, beta),
                     cuda::GeluBackwardBiasGrad(a, dy, dx, dbias, beta, ctx));
}

void SwigluBackwardBiasGrad(const Tensor& a, const Tensor& b, const Tensor& dout, Tensor& da,
                            Tensor& db, Tensor& dbias, float beta, DeviceContext* ctx) {
  CheckElementwise("SwigluBackwardBiasGrad", dout, {{&dout, "dout"}});
  CheckGrads("SwigluBackwardBiasGrad", dout, {{&da, "da"}, {&db, "db"}});
  CheckSaved("SwigluBackwardBiasGrad", da, {{&a, "a"}, {&b, "b"}});
  CheckBiasRows("SwigluBackwardBiasGrad", dout, dbias);
  SY_CHECK(da.numel() == 0 || da.raw_data() != db.raw_data())
      << "SwigluBackwardBiasGrad: da and db are the same memory";
  SY_DISPATCH_DEVICE(da, ctx, cpu::SwigluBackwardBiasGrad(a, b, dout, da, db, dbias, beta),
                     cuda::SwigluBackwardBiasGrad(a, b, dout, da, db, dbias, beta, ctx));
}

namespace {
// The grouped fused ops' groups checked against the row tensor (R, n) and the bias (G, n).
void CheckRowGroups(const char* op, const Tensor& rowwise, const RowGroups& groups,
                    const Tensor& bias, const Tensor& out) {
  if (groups.offsets.defined()) {
    CheckOffsetArgs(op, rowwise, groups.offsets, bias, out);
  } else {
    CheckGroupedBias(op, rowwise, groups.rows, bias, out);
  }
}

// What the CPU runs a grouped op on: the counts and the rows [0, end) in groups (device-sized:
// from the offsets' values, read as the op runs).
struct CpuGroups {
  std::vector<int64_t> rows;
  int64_t end = 0;
};
CpuGroups CpuGroupsOf(const char* op, const Tensor& rowwise, std::vector<int64_t> host_rows,
                      const Tensor& offsets, int64_t groups) {
  if (!offsets.defined()) return {std::move(host_rows), rowwise.dim(0)};
  return {OffsetCounts(op, rowwise, offsets, groups), offsets.data<int64_t>()[groups]};
}

std::vector<int64_t> HostRows(const RowGroups& groups) {
  return std::vector<int64_t>(groups.rows.begin(), groups.rows.end());
}
}  // namespace

// The CPU runs the unfused sequence (the bits the fused kernels reproduce); host arguments go
// into the recorded closures by value (kernels/dispatch.h).
void GroupedBiasGeluForward(Tensor& a, const RowGroups& groups, const Tensor& bias, Tensor& h,
                            DeviceContext* ctx, KeptRounded kept) {
  const KeptValues values = CheckForwardOutputs("GroupedBiasGeluForward", a, h, kept, false);
  CheckRowGroups("GroupedBiasGeluForward", a, groups, bias, h);
  auto on_cpu = [a, bias, h, values, rows = HostRows(groups), offsets = groups.offsets]() mutable {
    const CpuGroups g = CpuGroupsOf("GroupedBiasGeluForward", a, rows, offsets, bias.dim(0));
    CpuForwardKept(a, Tensor(), h, values, [&](Tensor& af, Tensor& hf) {
      Tensor used = af.Slice(0, g.end);
      cpu::GroupedAddBias(used, g.rows, bias);
      cpu::GeluForward(af, hf);
    });
  };
  SY_DISPATCH_DEVICE(h, ctx, on_cpu(),
                     cuda::GroupedBiasGeluForward(a, groups, bias, h, kept, ctx));
}

void GroupedBiasSwigluForward(Tensor& a, const RowGroups& groups, const Tensor& bias,
                              const Tensor& b, Tensor& out, DeviceContext* ctx,
                              KeptRounded kept) {
  const KeptValues values = CheckForwardOutputs("GroupedBiasSwigluForward", a, out, kept, true);
  CheckTensorOn(b, DType::kF32, out.device(), "GroupedBiasSwigluForward", "b");
  SY_CHECK(b.shape() == a.shape()) << "GroupedBiasSwigluForward: b " << ShapeString(b.shape());
  CheckRowGroups("GroupedBiasSwigluForward", a, groups, bias, out);
  auto on_cpu = [a, bias, b, out, values, rows = HostRows(groups),
                 offsets = groups.offsets]() mutable {
    const CpuGroups g = CpuGroupsOf("GroupedBiasSwigluForward", a, rows, offsets, bias.dim(0));
    CpuForwardKept(a, b, out, values, [&](Tensor& af, Tensor& of) {
      Tensor used = af.Slice(0, g.end);
      cpu::GroupedAddBias(used, g.rows, bias);
      cpu::SwigluForward(af, b, of);
    });
  };
  SY_DISPATCH_DEVICE(out, ctx, on_cpu(),
                     cuda::GroupedBiasSwigluForward(a, groups, bias, b, out, kept, ctx));
}

void GroupedGeluBackwardBiasGrad(const Tensor& a, const Tensor& dy, Tensor& dx,
                                 const RowGroups& groups, Tensor& dbias, float beta,
                                 DeviceContext* ctx) {
  CheckElementwise("GroupedGeluBackwardBiasGrad", dy, {{&dy, "dy"}});
  CheckGrads("GroupedGeluBackwardBiasGrad", dy, {{&dx, "dx"}});
  CheckSaved("GroupedGeluBackwardBiasGrad", dx, {{&a, "a"}});
  CheckRowGroups("GroupedGeluBackwardBiasGrad", dy, groups, dbias, dbias);
  auto on_cpu = [a, dy, dx, dbias, beta, rows = HostRows(groups),
                 offsets = groups.offsets]() mutable {
    const CpuGroups g =
        CpuGroupsOf("GroupedGeluBackwardBiasGrad", dy, rows, offsets, dbias.dim(0));
    Tensor used = dx.Slice(0, g.end);
    cpu::GroupedActBackwardBiasGrad(a.Slice(0, g.end), nullptr, dy.Slice(0, g.end), used,
                                    nullptr, g.rows, dbias, beta);
  };
  SY_DISPATCH_DEVICE(dx, ctx, on_cpu(),
                     cuda::GroupedGeluBackwardBiasGrad(a, dy, dx, groups, dbias, beta, ctx));
}

void GroupedSwigluBackwardBiasGrad(const Tensor& a, const Tensor& b, const Tensor& dout,
                                   Tensor& da, Tensor& db, const RowGroups& groups,
                                   Tensor& dbias, float beta, DeviceContext* ctx) {
  CheckElementwise("GroupedSwigluBackwardBiasGrad", dout, {{&dout, "dout"}});
  CheckGrads("GroupedSwigluBackwardBiasGrad", dout, {{&da, "da"}, {&db, "db"}});
  CheckSaved("GroupedSwigluBackwardBiasGrad", da, {{&a, "a"}, {&b, "b"}});
  CheckRowGroups("GroupedSwigluBackwardBiasGrad", dout, groups, dbias, dbias);
  SY_CHECK(da.numel() == 0 || da.raw_data() != db.raw_data())
      << "GroupedSwigluBackwardBiasGrad: da and db are the same memory";
  auto on_cpu = [a, b, dout, da, db, dbias, beta, rows = HostRows(groups),
                 offsets = groups.offsets]() mutable {
    const CpuGroups g =
        CpuGroupsOf("GroupedSwigluBackwardBiasGrad", dout, rows, offsets, dbias.dim(0));
    Tensor used_da = da.Slice(0, g.end), used_db = db.Slice(0, g.end);
    const Tensor used_b = b.Slice(0, g.end);
    cpu::GroupedActBackwardBiasGrad(a.Slice(0, g.end), &used_b, dout.Slice(0, g.end), used_da,
                                    &used_db, g.rows, dbias, beta);
  };
  SY_DISPATCH_DEVICE(
      da, ctx, on_cpu(),
      cuda::GroupedSwigluBackwardBiasGrad(a, b, dout, da, db, groups, dbias, beta, ctx));
}

}  // namespace switchyard::kernels
