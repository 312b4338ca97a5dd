// Argument checks and device dispatch for kernels/activation.h.
#include "kernels/check.h"
#include "kernels/activation.h"

#include <initializer_list>
#include <utility>
#include <vector>

#include "kernels/dispatch.h"

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
  CheckElementwise("GeluBackward", dx, {{&x, "x"}, {&dy, "dy"}, {&dx, "dx"}});
  SY_DISPATCH_DEVICE(dx, ctx, cpu::GeluBackward(x, dy, dx), cuda::GeluBackward(x, dy, dx, ctx));
}

void ReluForward(const Tensor& x, Tensor& y, DeviceContext* ctx) {
  CheckElementwise("ReluForward", y, {{&x, "x"}, {&y, "y"}});
  SY_DISPATCH_DEVICE(y, ctx, cpu::ReluForward(x, y), cuda::ReluForward(x, y, ctx));
}

void ReluBackward(const Tensor& x, const Tensor& dy, Tensor& dx, DeviceContext* ctx) {
  CheckElementwise("ReluBackward", dx, {{&x, "x"}, {&dy, "dy"}, {&dx, "dx"}});
  SY_DISPATCH_DEVICE(dx, ctx, cpu::ReluBackward(x, dy, dx), cuda::ReluBackward(x, dy, dx, ctx));
}

void SwigluForward(const Tensor& a, const Tensor& b, Tensor& out, DeviceContext* ctx) {
  CheckElementwise("SwigluForward", out, {{&a, "a"}, {&b, "b"}, {&out, "out"}});
  SY_DISPATCH_DEVICE(out, ctx, cpu::SwigluForward(a, b, out), cuda::SwigluForward(a, b, out, ctx));
}

void SwigluBackward(const Tensor& a, const Tensor& b, const Tensor& dout, Tensor& da, Tensor& db,
                    DeviceContext* ctx) {
  CheckElementwise("SwigluBackward", da,
                   {{&a, "a"}, {&b, "b"}, {&dout, "dout"}, {&da, "da"}, {&db, "db"}});
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

void BiasGeluForward(Tensor& a, const Tensor& bias, Tensor& h, DeviceContext* ctx) {
  CheckElementwise("BiasGeluForward", h, {{&a, "a"}, {&h, "h"}});
  CheckBiasRows("BiasGeluForward", a, bias);
  SY_CHECK(h.numel() == 0 || h.raw_data() != a.raw_data()) << "BiasGeluForward: h is a";
  SY_DISPATCH_DEVICE(h, ctx, cpu::BiasGeluForward(a, bias, h), cuda::BiasGeluForward(a, bias, h, ctx));
}

void BiasSwigluForward(Tensor& a, const Tensor& bias, const Tensor& b, Tensor& out,
                       DeviceContext* ctx) {
  CheckElementwise("BiasSwigluForward", out, {{&a, "a"}, {&b, "b"}, {&out, "out"}});
  CheckBiasRows("BiasSwigluForward", a, bias);
  SY_CHECK(out.numel() == 0 || out.raw_data() != a.raw_data()) << "BiasSwigluForward: out is a";
  SY_DISPATCH_DEVICE(out, ctx, cpu::BiasSwigluForward(a, bias, b, out),
                     cuda::BiasSwigluForward(a, bias, b, out, ctx));
}

void GeluBackwardBiasGrad(const Tensor& a, const Tensor& dy, Tensor& dx, Tensor& dbias,
                          float beta, DeviceContext* ctx) {
  CheckElementwise("GeluBackwardBiasGrad", dx, {{&a, "a"}, {&dy, "dy"}, {&dx, "dx"}});
  CheckBiasRows("GeluBackwardBiasGrad", dx, dbias);
  SY_DISPATCH_DEVICE(dx, ctx, cpu::GeluBackwardBiasGrad(a, dy, dx, dbias, beta),
                     cuda::GeluBackwardBiasGrad(a, dy, dx, dbias, beta, ctx));
}

void SwigluBackwardBiasGrad(const Tensor& a, const Tensor& b, const Tensor& dout, Tensor& da,
                            Tensor& db, Tensor& dbias, float beta, DeviceContext* ctx) {
  CheckElementwise("SwigluBackwardBiasGrad", da,
                   {{&a, "a"}, {&b, "b"}, {&dout, "dout"}, {&da, "da"}, {&db, "db"}});
  CheckBiasRows("SwigluBackwardBiasGrad", da, dbias);
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
                            DeviceContext* ctx) {
  CheckElementwise("GroupedBiasGeluForward", h, {{&a, "a"}, {&h, "h"}});
  CheckRowGroups("GroupedBiasGeluForward", a, groups, bias, h);
  SY_CHECK(h.numel() == 0 || h.raw_data() != a.raw_data()) << "GroupedBiasGeluForward: h is a";
  auto on_cpu = [a, bias, h, rows = HostRows(groups), offsets = groups.offsets]() mutable {
    const CpuGroups g = CpuGroupsOf("GroupedBiasGeluForward", a, rows, offsets, bias.dim(0));
    Tensor used = a.Slice(0, g.end);
    cpu::GroupedAddBias(used, g.rows, bias);
    cpu::GeluForward(a, h);
  };
  SY_DISPATCH_DEVICE(h, ctx, on_cpu(), cuda::GroupedBiasGeluForward(a, groups, bias, h, ctx));
}

void GroupedBiasSwigluForward(Tensor& a, const RowGroups& groups, const Tensor& bias,
                              const Tensor& b, Tensor& out, DeviceContext* ctx) {
  CheckElementwise("GroupedBiasSwigluForward", out, {{&a, "a"}, {&b, "b"}, {&out, "out"}});
  CheckRowGroups("GroupedBiasSwigluForward", a, groups, bias, out);
  SY_CHECK(out.numel() == 0 || out.raw_data() != a.raw_data())
      << "GroupedBiasSwigluForward: out is a";
  auto on_cpu = [a, bias, b, out, rows = HostRows(groups), offsets = groups.offsets]() mutable {
    const CpuGroups g = CpuGroupsOf("GroupedBiasSwigluForward", a, rows, offsets, bias.dim(0));
    Tensor used = a.Slice(0, g.end);
    cpu::GroupedAddBias(used, g.rows, bias);
    cpu::SwigluForward(a, b, out);
  };
  SY_DISPATCH_DEVICE(out, ctx, on_cpu(),
                     cuda::GroupedBiasSwigluForward(a, groups, bias, b, out, ctx));
}

void GroupedGeluBackwardBiasGrad(const Tensor& a, const Tensor& dy, Tensor& dx,
                                 const RowGroups& groups, Tensor& dbias, float beta,
                                 DeviceContext* ctx) {
  CheckElementwise("GroupedGeluBackwardBiasGrad", dx, {{&a, "a"}, {&dy, "dy"}, {&dx, "dx"}});
  CheckRowGroups("GroupedGeluBackwardBiasGrad", dx, groups, dbias, dbias);
  auto on_cpu = [a, dy, dx, dbias, beta, rows = HostRows(groups),
                 offsets = groups.offsets]() mutable {
    const CpuGroups g =
        CpuGroupsOf("GroupedGeluBackwardBiasGrad", dx, rows, offsets, dbias.dim(0));
    Tensor used = dx.Slice(0, g.end);
    cpu::GeluBackward(a.Slice(0, g.end), dy.Slice(0, g.end), used);
    cpu::GroupedBiasGrad(used, g.rows, dbias, beta);
  };
  SY_DISPATCH_DEVICE(dx, ctx, on_cpu(),
                     cuda::GroupedGeluBackwardBiasGrad(a, dy, dx, groups, dbias, beta, ctx));
}

void GroupedSwigluBackwardBiasGrad(const Tensor& a, const Tensor& b, const Tensor& dout,
                                   Tensor& da, Tensor& db, const RowGroups& groups,
                                   Tensor& dbias, float beta, DeviceContext* ctx) {
  CheckElementwise("GroupedSwigluBackwardBiasGrad", da,
                   {{&a, "a"}, {&b, "b"}, {&dout, "dout"}, {&da, "da"}, {&db, "db"}});
  CheckRowGroups("GroupedSwigluBackwardBiasGrad", da, groups, dbias, dbias);
  SY_CHECK(da.numel() == 0 || da.raw_data() != db.raw_data())
      << "GroupedSwigluBackwardBiasGrad: da and db are the same memory";
  auto on_cpu = [a, b, dout, da, db, dbias, beta, rows = HostRows(groups),
                 offsets = groups.offsets]() mutable {
    const CpuGroups g =
        CpuGroupsOf("GroupedSwigluBackwardBiasGrad", da, rows, offsets, dbias.dim(0));
    Tensor used_da = da.Slice(0, g.end), used_db = db.Slice(0, g.end);
    cpu::SwigluBackward(a.Slice(0, g.end), b.Slice(0, g.end), dout.Slice(0, g.end), used_da,
                        used_db);
    cpu::GroupedBiasGrad(used_da, g.rows, dbias, beta);
  };
  SY_DISPATCH_DEVICE(
      da, ctx, on_cpu(),
      cuda::GroupedSwigluBackwardBiasGrad(a, b, dout, da, db, groups, dbias, beta, ctx));
}

}  // namespace switchyard::kernels
