// Device dispatch for kernels/gemm.h: argument checks (the same on every device), the
// resolved matmul precision, then the CPU or CUDA implementation.
#include "kernels/gemm.h"

#include <initializer_list>
#include <vector>

#include "kernels/activation.h"
#include "kernels/dispatch.h"
#include "kernels/elementwise.h"

namespace switchyard::kernels {
namespace {

// Defined, 2-d or 3-d as `ndim` says, on `device`, f32 (or bf16 when `bf16_ok`).
void CheckOperand(const Tensor& t, int ndim, bool bf16_ok, Device device, const char* op,
                  const char* what) {
  SY_CHECK(t.defined()) << op << ": " << what << " is undefined";
  SY_CHECK(t.device() == device) << op << ": " << what << " is on " << t.device()
                                 << " but the output is on " << device;
  SY_CHECK(t.dtype() == DType::kF32 || (bf16_ok && t.dtype() == DType::kBF16))
      << op << ": " << what << " is " << DTypeName(t.dtype()) << ", expected f32"
      << (bf16_ok ? " or bf16" : "");
  SY_CHECK_EQ(t.ndim(), ndim) << op << ": " << what << " is " << ndim << "-d, got "
                              << ShapeString(t.shape());
}

// The precision the products run in: the context's, or bf16 when an operand is bf16.
DType MatmulDType(const Tensor& a, const Tensor& b, DeviceContext* ctx) {
  if (a.dtype() == DType::kBF16 || b.dtype() == DType::kBF16) return DType::kBF16;
  return ctx ? ctx->matmul_dtype() : DType::kF32;
}

// The operand a product in `dtype` reads for `t`. In bf16 mode an f32 operand that lies in a
// weight registered with ctx's WeightShadows reads the weight's bf16 shadow while a window
// is open (written here at its first use: one conversion of the whole weight); any other
// f32 operand is converted by the product itself (counted here, one per operand per call,
// the conversion the CUDA backend runs). `reads`: the product is not empty (the backends
// convert nothing for an empty one). Either way the product sees the same bf16 values.
// `in_kernel`: the product rounds f32 operands as it loads them (the device-sized grouped
// products), so a non-weight operand costs no conversion and none is counted.
Tensor ResolveOperand(const Tensor& t, DType dtype, bool reads, DeviceContext* ctx,
                      bool in_kernel = false) {
  if (dtype != DType::kBF16 || t.dtype() != DType::kF32 || !reads) return t;
  WeightShadows::Match m{Tensor(), nullptr, nullptr, 0};
  if (ctx != nullptr) m = ctx->weight_shadows().Find(t);
  if (m.shadow != nullptr && ctx->weight_shadows().active()) {
    if (!*m.fresh) {
      if (!m.shadow->defined()) {
        *m.shadow = Tensor::Empty(m.weight.shape(), DType::kBF16, m.weight.device());
      }
      Cast(m.weight, *m.shadow, ctx);  // counts the conversion
      counters::CountWeightConversion(m.weight.numel());
      *m.fresh = true;
    }
    return m.shadow->View(t.shape(), m.offset);
  }
  if (in_kernel) return t;
  counters::CountConversion(DType::kF32, DType::kBF16, t.numel());
  if (m.shadow != nullptr) counters::CountWeightConversion(t.numel());
  return t;
}

// offsets: (groups + 1) i64 on `device`. On the CPU also its values: 0 first,
// nondecreasing, the last at most `rows`; returns the counts (empty on CUDA, where the host
// does not read them).
void CheckOffsets(const Tensor& offsets, int64_t groups, Device device, const char* op) {
  SY_CHECK(offsets.defined() && offsets.dtype() == DType::kI64 && offsets.ndim() == 1 &&
           offsets.numel() == groups + 1)
      << op << ": offsets must be (" << groups + 1 << ") i64, got " << offsets.DebugString();
  SY_CHECK(offsets.device() == device)
      << op << ": offsets are on " << offsets.device() << " but the output is on " << device;
}

// The rows of each group from host offsets, checked. Read when the op runs (inside the CPU
// branch, so a recorded op reads them at replay).
std::vector<int64_t> HostOffsetRows(const Tensor& offsets, int64_t groups, int64_t rows,
                                    const char* op) {
  std::vector<int64_t> counts;
  const int64_t* o = offsets.data<int64_t>();
  SY_CHECK_EQ(o[0], 0) << op << ": offsets[0] = " << o[0];
  for (int64_t g = 0; g < groups; ++g) {
    SY_CHECK(o[g + 1] >= o[g] && o[g + 1] <= rows)
        << op << ": offsets[" << g + 1 << "] = " << o[g + 1] << " after " << o[g] << ", "
        << rows << " rows";
    counts.push_back(o[g + 1] - o[g]);
  }
  return counts;
}

// rows[g] >= 0 and they sum to `total`.
void CheckRows(std::span<const int64_t> rows, int64_t total, const char* op) {
  int64_t sum = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    SY_CHECK_GE(rows[g], 0) << op << ": group " << g << " has " << rows[g] << " rows";
    sum += rows[g];
  }
  SY_CHECK_EQ(sum, total) << op << ": rows sum to " << sum << " but x has " << total << " rows";
}

}  // namespace

namespace {
// A product's checked operands as the backends read them (ResolveOperand) and its precision.
struct Resolved {
  Tensor a, b;
  DType dtype;
};
Resolved CheckGemm(const char* op, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                   const Tensor& c, float beta, DeviceContext* ctx) {
  SY_CHECK(c.defined()) << op << ": c is undefined";
  CheckOperand(c, 2, true, c.device(), op, "c");
  CheckOperand(a, 2, true, c.device(), op, "a");
  CheckOperand(b, 2, true, c.device(), op, "b");
  const int64_t m = trans_a ? a.dim(1) : a.dim(0);
  const int64_t k = trans_a ? a.dim(0) : a.dim(1);
  const int64_t kb = trans_b ? b.dim(1) : b.dim(0);
  const int64_t n = trans_b ? b.dim(0) : b.dim(1);
  SY_CHECK(k == kb && c.dim(0) == m && c.dim(1) == n)
      << op << " shapes: a " << ShapeString(a.shape()) << (trans_a ? "^T" : "") << ", b "
      << ShapeString(b.shape()) << (trans_b ? "^T" : "") << ", c " << ShapeString(c.shape());
  const DType dtype = MatmulDType(a, b, ctx);
  SY_CHECK(c.dtype() == DType::kF32 || (dtype == DType::kBF16 && beta == 0.0f))
      << op << ": a bf16 c needs a product in bf16 mode with beta 0 (got "
      << DTypeName(dtype) << " products, beta " << beta << ")";
  const bool reads = m > 0 && n > 0 && k > 0;
  return {ResolveOperand(a, dtype, reads, ctx), ResolveOperand(b, dtype, reads, ctx), dtype};
}

// The CPU's product `compute` (writing an f32 tensor of c's shape) into c: c itself when f32;
// for a bf16 c, a temporary rounded once after. Not counted as a conversion: CUDA writes
// bf16 from the product's accumulators.
template <typename Compute>
void CpuProductInto(Tensor& c, Compute compute) {
  if (c.dtype() == DType::kF32) return compute(c);
  Tensor f32 = Tensor::Empty(c.shape(), DType::kF32, c.device());
  compute(f32);
  cpu::Cast(f32, c);
}
}  // namespace

void Gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha,
          float beta, DeviceContext* ctx) {
  const Resolved r = CheckGemm("Gemm", a, trans_a, b, trans_b, c, beta, ctx);
  const Tensor ra = r.a, rb = r.b;
  const DType dtype = r.dtype;
  auto on_cpu = [ra, rb, c, trans_a, trans_b, alpha, beta, dtype]() mutable {
    CpuProductInto(c, [&](Tensor& out) {
      cpu::Gemm(ra, trans_a, rb, trans_b, out, alpha, beta, dtype);  // bf16 c: beta is 0
    });
  };
  SY_DISPATCH_DEVICE(c, ctx, on_cpu(),
                     cuda::Gemm(ra, trans_a, rb, trans_b, c, alpha, beta, dtype, ctx));
}

void GemmBias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias,
              Tensor& c, DeviceContext* ctx) {
  const Resolved r = CheckGemm("GemmBias", a, trans_a, b, trans_b, c, 0.0f, ctx);
  CheckOperand(bias, 1, false, c.device(), "GemmBias", "bias");
  SY_CHECK_EQ(bias.dim(0), c.dim(1)) << "GemmBias: bias " << ShapeString(bias.shape())
                                     << " for c " << ShapeString(c.shape());
  const Tensor ra = r.a, rb = r.b;
  const DType dtype = r.dtype;
  auto on_cpu = [ra, rb, bias, c, trans_a, trans_b, dtype]() mutable {
    CpuProductInto(c, [&](Tensor& out) {
      cpu::Gemm(ra, trans_a, rb, trans_b, out, 1.0f, 0.0f, dtype);
      cpu::AddBias(out, bias);
    });
  };
  SY_DISPATCH_DEVICE(c, ctx, on_cpu(),
                     cuda::GemmBias(ra, trans_a, rb, trans_b, bias, c, dtype, ctx));
}

void RowExactGemm(const Tensor& a, const Tensor& b, Tensor& c, DeviceContext* ctx) {
  constexpr const char* kOp = "RowExactGemm";
  SY_CHECK(c.defined()) << kOp << ": c is undefined";
  CheckOperand(c, 2, false, c.device(), kOp, "c");
  CheckOperand(a, 2, false, c.device(), kOp, "a");
  CheckOperand(b, 2, false, c.device(), kOp, "b");
  SY_CHECK(a.dim(1) == b.dim(0) && c.dim(0) == a.dim(0) && c.dim(1) == b.dim(1))
      << "RowExactGemm shapes: a " << ShapeString(a.shape()) << ", b " << ShapeString(b.shape())
      << ", c " << ShapeString(c.shape());
  SY_DISPATCH_DEVICE(c, ctx, cpu::RowExactGemm(a, b, c), cuda::RowExactGemm(a, b, c, ctx));
}

GroupSchedule GroupScheduleFor(std::span<const int64_t> rows) {
  return cpu::GroupScheduleFor(rows);
}

DType MatmulOperandDType(const DeviceContext* ctx) {
  return ctx != nullptr && ctx->matmul_dtype() == DType::kBF16 ? DType::kBF16 : DType::kF32;
}

Tensor MatmulOperand(const Tensor& t, DeviceContext* ctx) {
  if (MatmulOperandDType(ctx) != DType::kBF16 || t.dtype() != DType::kF32 || t.numel() == 0) {
    return t;
  }
  Tensor out = Tensor::Empty(t.shape(), DType::kBF16, t.device());
  Cast(t, out, ctx);  // counts the conversion
  return out;
}

Tensor MatmulOperandWithBiasGrad(const Tensor& dy, Tensor& dbias, float beta,
                                 DeviceContext* ctx) {
  if (MatmulOperandDType(ctx) != DType::kBF16 || dy.dtype() != DType::kF32 || dy.numel() == 0) {
    BiasGrad(dy, dbias, beta, ctx);
    return dy;
  }
  Tensor out = Tensor::Empty(dy.shape(), DType::kBF16, dy.device());
  BiasGradCast(dy, dbias, beta, out, ctx);  // counts the conversion
  return out;
}

void GroupedGemm(const Tensor& x, std::span<const int64_t> rows, const Tensor& w, bool trans_w,
                 Tensor& out, float alpha, float beta, DeviceContext* ctx,
                 GroupSchedule schedule) {
  constexpr const char* kOp = "GroupedGemm";
  SY_CHECK(out.defined()) << kOp << ": out is undefined";
  CheckOperand(out, 2, false, out.device(), kOp, "out");
  CheckOperand(x, 2, true, out.device(), kOp, "x");
  CheckOperand(w, 3, true, out.device(), kOp, "w");
  SY_CHECK(w.dim(0) == static_cast<int64_t>(rows.size()) && out.dim(0) == x.dim(0))
      << "GroupedGemm shapes: x " << ShapeString(x.shape()) << ", w " << ShapeString(w.shape())
      << ", out " << ShapeString(out.shape()) << ", " << rows.size() << " groups";
  const int64_t k = x.dim(1), n = out.dim(1);
  SY_CHECK(trans_w ? (w.dim(1) == n && w.dim(2) == k) : (w.dim(1) == k && w.dim(2) == n))
      << "GroupedGemm: w " << ShapeString(w.shape()) << (trans_w ? "^T" : "") << " for k=" << k
      << ", n=" << n;
  CheckRows(rows, x.dim(0), kOp);
  const DType dtype = MatmulDType(x, w, ctx);
  const bool reads = x.dim(0) > 0 && n > 0 && k > 0;
  const Tensor rx = ResolveOperand(x, dtype, reads, ctx);
  const Tensor rw = ResolveOperand(w, dtype, reads, ctx);
  // Host arguments the CPU op reads go into the recorded closure by value (kernels/dispatch.h).
  const std::vector<int64_t> host_rows(rows.begin(), rows.end());
  SY_DISPATCH_DEVICE(out, ctx,
                     cpu::GroupedGemm(rx, host_rows, rw, trans_w, out, alpha, beta, dtype,
                                      schedule),
                     cuda::GroupedGemm(rx, rows, rw, trans_w, out, alpha, beta, dtype, ctx));
}

void GroupedGemmWeightGrad(const Tensor& x, const Tensor& dy, std::span<const int64_t> rows,
                           Tensor& dw, float alpha, float beta, DeviceContext* ctx,
                           GroupSchedule schedule) {
  constexpr const char* kOp = "GroupedGemmWeightGrad";
  SY_CHECK(dw.defined()) << kOp << ": dw is undefined";
  CheckOperand(dw, 3, false, dw.device(), kOp, "dw");
  CheckOperand(x, 2, true, dw.device(), kOp, "x");
  CheckOperand(dy, 2, true, dw.device(), kOp, "dy");
  const int64_t k = x.dim(1), n = dy.dim(1);
  SY_CHECK(x.dim(0) == dy.dim(0) && dw.dim(0) == static_cast<int64_t>(rows.size()) &&
           dw.dim(1) == k && dw.dim(2) == n)
      << "GroupedGemmWeightGrad shapes: x " << ShapeString(x.shape()) << ", dy "
      << ShapeString(dy.shape()) << ", dw " << ShapeString(dw.shape()) << ", " << rows.size()
      << " groups";
  CheckRows(rows, x.dim(0), kOp);
  const DType dtype = MatmulDType(x, dy, ctx);
  const bool reads = x.dim(0) > 0 && n > 0 && k > 0;
  const Tensor rx = ResolveOperand(x, dtype, reads, ctx);
  const Tensor rdy = ResolveOperand(dy, dtype, reads, ctx);
  // Host arguments the CPU op reads go into the recorded closure by value (kernels/dispatch.h).
  const std::vector<int64_t> host_rows(rows.begin(), rows.end());
  SY_DISPATCH_DEVICE(dw, ctx,
                     cpu::GroupedGemmWeightGrad(rx, rdy, host_rows, dw, alpha, beta, dtype,
                                                schedule),
                     cuda::GroupedGemmWeightGrad(rx, rdy, rows, dw, alpha, beta, dtype, ctx));
}

// The device-sized products: the same checks, then on the CPU the host-sized product over
// the grouped rows (the offsets are host memory there), on CUDA the kernels that read them.
void GroupedGemm(const Tensor& x, const Tensor& offsets, const Tensor& w, bool trans_w,
                 Tensor& out, float alpha, float beta, DeviceContext* ctx) {
  constexpr const char* kOp = "GroupedGemm";
  SY_CHECK(out.defined()) << kOp << ": out is undefined";
  CheckOperand(out, 2, false, out.device(), kOp, "out");
  CheckOperand(x, 2, true, out.device(), kOp, "x");
  CheckOperand(w, 3, true, out.device(), kOp, "w");
  SY_CHECK(out.dim(0) == x.dim(0))
      << "GroupedGemm shapes: x " << ShapeString(x.shape()) << ", out "
      << ShapeString(out.shape());
  const int64_t k = x.dim(1), n = out.dim(1);
  SY_CHECK(trans_w ? (w.dim(1) == n && w.dim(2) == k) : (w.dim(1) == k && w.dim(2) == n))
      << "GroupedGemm: w " << ShapeString(w.shape()) << (trans_w ? "^T" : "") << " for k=" << k
      << ", n=" << n;
  CheckOffsets(offsets, w.dim(0), out.device(), kOp);
  const DType dtype = MatmulDType(x, w, ctx);
  const bool reads = x.dim(0) > 0 && n > 0 && k > 0;
  const Tensor rx = ResolveOperand(x, dtype, reads, ctx, /*in_kernel=*/true);
  const Tensor rw = ResolveOperand(w, dtype, reads, ctx, /*in_kernel=*/true);
  auto on_cpu = [=]() mutable {
    const std::vector<int64_t> rows = HostOffsetRows(offsets, w.dim(0), x.dim(0), kOp);
    const int64_t used = offsets.data<int64_t>()[w.dim(0)];
    Tensor used_out = out.Slice(0, used);
    cpu::GroupedGemm(rx.Slice(0, used), rows, rw, trans_w, used_out, alpha, beta, dtype,
                     GroupSchedule::kAuto);
  };
  SY_DISPATCH_DEVICE(out, ctx, on_cpu(),
                     cuda::GroupedGemm(rx, offsets, rw, trans_w, out, alpha, beta, dtype, ctx));
}

void GroupedGemmBiasGelu(const Tensor& x, const Tensor& offsets, const Tensor& w,
                         const Tensor& bias, Tensor& h, Tensor& kept, DeviceContext* ctx) {
  constexpr const char* kOp = "GroupedGemmBiasGelu";
  SY_CHECK(h.defined() && kept.defined()) << kOp << ": h and kept must be defined";
  for (const Tensor* t : {&h, &kept}) {
    SY_CHECK(t->dtype() == DType::kBF16 && t->shape() == h.shape())
        << kOp << ": h and kept must be bf16 of one shape, got " << h.DebugString() << " and "
        << kept.DebugString();
  }
  CheckOperand(h, 2, true, h.device(), kOp, "h");
  CheckOperand(kept, 2, true, h.device(), kOp, "kept");
  CheckOperand(x, 2, true, h.device(), kOp, "x");
  CheckOperand(w, 3, true, h.device(), kOp, "w");
  CheckOperand(bias, 2, false, h.device(), kOp, "bias");
  const int64_t k = x.dim(1), n = h.dim(1);
  SY_CHECK(h.dim(0) == x.dim(0) && w.dim(1) == k && w.dim(2) == n &&
           bias.shape() == (Shape{w.dim(0), n}))
      << kOp << " shapes: x " << ShapeString(x.shape()) << ", w " << ShapeString(w.shape())
      << ", bias " << ShapeString(bias.shape()) << ", h " << ShapeString(h.shape());
  CheckOffsets(offsets, w.dim(0), h.device(), kOp);
  if (h.device().is_cpu()) {
    // The two ops it fuses (the same bits): the product in f32, then bias + GELU with a kept.
    Tensor a = Tensor::Empty(h.shape(), DType::kF32, h.device());
    GroupedGemm(x, offsets, w, /*trans_w=*/false, a, 1.0f, 0.0f, ctx);
    GroupedBiasGeluForward(a, RowGroups{{}, offsets}, bias, h, ctx, {.a = &kept});
    return;
  }
  const DType dtype = MatmulDType(x, w, ctx);
  const bool reads = x.dim(0) > 0 && n > 0 && k > 0;
  const Tensor rx = ResolveOperand(x, dtype, reads, ctx, /*in_kernel=*/true);
  const Tensor rw = ResolveOperand(w, dtype, reads, ctx, /*in_kernel=*/true);
  SY_DISPATCH_DEVICE(h, ctx, (void)0,
                     cuda::GroupedGemmBiasGelu(rx, offsets, rw, bias, h, kept, dtype, ctx));
}

void GroupedGemmWeightGrad(const Tensor& x, const Tensor& dy, const Tensor& offsets, Tensor& dw,
                           float alpha, float beta, DeviceContext* ctx) {
  constexpr const char* kOp = "GroupedGemmWeightGrad";
  SY_CHECK(dw.defined()) << kOp << ": dw is undefined";
  CheckOperand(dw, 3, false, dw.device(), kOp, "dw");
  CheckOperand(x, 2, true, dw.device(), kOp, "x");
  CheckOperand(dy, 2, true, dw.device(), kOp, "dy");
  const int64_t k = x.dim(1), n = dy.dim(1);
  SY_CHECK(x.dim(0) == dy.dim(0) && dw.dim(1) == k && dw.dim(2) == n)
      << "GroupedGemmWeightGrad shapes: x " << ShapeString(x.shape()) << ", dy "
      << ShapeString(dy.shape()) << ", dw " << ShapeString(dw.shape());
  CheckOffsets(offsets, dw.dim(0), dw.device(), kOp);
  const DType dtype = MatmulDType(x, dy, ctx);
  const bool reads = x.dim(0) > 0 && n > 0 && k > 0;
  const Tensor rx = ResolveOperand(x, dtype, reads, ctx, /*in_kernel=*/true);
  const Tensor rdy = ResolveOperand(dy, dtype, reads, ctx, /*in_kernel=*/true);
  auto on_cpu = [=]() mutable {
    const std::vector<int64_t> rows = HostOffsetRows(offsets, dw.dim(0), x.dim(0), kOp);
    const int64_t used = offsets.data<int64_t>()[dw.dim(0)];
    cpu::GroupedGemmWeightGrad(rx.Slice(0, used), rdy.Slice(0, used), rows, dw, alpha, beta,
                               dtype, GroupSchedule::kAuto);
  };
  SY_DISPATCH_DEVICE(dw, ctx, on_cpu(),
                     cuda::GroupedGemmWeightGrad(rx, rdy, offsets, dw, alpha, beta, dtype, ctx));
}

}  // namespace switchyard::kernels
