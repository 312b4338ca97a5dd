// Argument checks and device dispatch for kernels/permute.h.
#include "kernels/permute.h"

#include "kernels/dispatch.h"

namespace switchyard::kernels {
namespace {

// t is defined, of `dtype`, `ndim`-d, and on `device` (the output's).
void CheckTensor(const Tensor& t, DType dtype, int ndim, Device device, const char* op,
                 const char* what) {
  SY_CHECK(t.defined()) << op << ": " << what << " is undefined";
  SY_CHECK(t.dtype() == dtype && t.ndim() == ndim)
      << op << ": " << what << " must be " << ndim << "-d " << DTypeName(dtype) << ", got "
      << t.DebugString();
  SY_CHECK(t.device() == device) << op << ": " << what << " is on " << t.device()
                                 << " but the output is on " << device;
}

// The arguments of both sorts (see kernels/permute.h).
void CheckSortArguments(const Tensor& experts, const Tensor& kept, int64_t num_experts,
                        const Tensor& token, const Tensor& slot, const Tensor& inverse,
                        const char* kOp) {
  SY_CHECK(slot.defined()) << kOp << ": slot is undefined";
  const Device dev = slot.device();
  CheckTensor(experts, DType::kI32, 2, dev, kOp, "experts");
  CheckTensor(kept, DType::kU8, 2, dev, kOp, "kept");
  SY_CHECK(kept.shape() == experts.shape())
      << kOp << ": kept " << ShapeString(kept.shape()) << " vs experts "
      << ShapeString(experts.shape());
  SY_CHECK_GE(experts.dim(1), 1) << kOp << ": k must be >= 1";
  SY_CHECK(num_experts >= 1 && num_experts < (int64_t{1} << 30))
      << kOp << ": num_experts=" << num_experts;
  const int64_t n = experts.numel();
  SY_CHECK_LT(n, int64_t{1} << 31) << kOp << ": " << n << " assignments (at most 2^31 - 1)";
  auto check_out = [&](const Tensor& t, const char* what) {
    CheckTensor(t, DType::kI64, 1, dev, kOp, what);
    SY_CHECK_EQ(t.numel(), n) << kOp << ": " << what << " needs N * k entries";
  };
  check_out(token, "token");
  check_out(slot, "slot");
  check_out(inverse, "inverse");
}

}  // namespace

std::vector<int64_t> SortAssignments(const Tensor& experts, const Tensor& kept,
                                     int64_t num_experts, Tensor& token, Tensor& slot,
                                     Tensor& inverse, DeviceContext* ctx) {
  CheckSortArguments(experts, kept, num_experts, token, slot, inverse, "SortAssignments");
  std::vector<int64_t> counts;
  SY_DISPATCH_DEVICE_NOW(
      slot, ctx, counts = cpu::SortAssignments(experts, kept, num_experts, token, slot, inverse),
      counts = cuda::SortAssignments(experts, kept, num_experts, token, slot, inverse, ctx));
  counters::CountReadback("moe.sort_assignments");
  return counts;
}

void SortAssignmentsToOffsets(const Tensor& experts, const Tensor& kept, int64_t num_experts,
                              Tensor& token, Tensor& slot, Tensor& inverse, Tensor& offsets,
                              DeviceContext* ctx) {
  constexpr const char* kOp = "SortAssignmentsToOffsets";
  CheckSortArguments(experts, kept, num_experts, token, slot, inverse, kOp);
  CheckTensor(offsets, DType::kI64, 1, slot.device(), kOp, "offsets");
  SY_CHECK_EQ(offsets.numel(), num_experts + 1) << kOp << ": offsets needs E + 1 entries";
  SY_DISPATCH_DEVICE(
      slot, ctx,
      cpu::SortAssignmentsToOffsets(experts, kept, num_experts, token, slot, inverse, offsets),
      cuda::SortAssignmentsToOffsets(experts, kept, num_experts, token, slot, inverse, offsets,
                                     ctx));
}

void GatherRows(const Tensor& src, const Tensor& index, Tensor& dst, DeviceContext* ctx) {
  constexpr const char* kOp = "GatherRows";
  SY_CHECK(dst.defined()) << kOp << ": dst is undefined";
  SY_CHECK(dst.dtype() == DType::kF32 || dst.dtype() == DType::kBF16 ||
           dst.dtype() == DType::kI32 || dst.dtype() == DType::kU8)
      << kOp << ": dst must be f32, bf16, i32 or u8, got " << dst.DebugString();
  CheckTensor(dst, dst.dtype(), 2, dst.device(), kOp, "dst");
  // The same dtype, or f32 rows rounded into a bf16 dst.
  const bool rounds = src.defined() && src.dtype() == DType::kF32 && dst.dtype() == DType::kBF16;
  CheckTensor(src, rounds ? DType::kF32 : dst.dtype(), 2, dst.device(), kOp, "src");
  CheckTensor(index, DType::kI64, 1, dst.device(), kOp, "index");
  SY_CHECK(src.dim(1) == dst.dim(1) && index.dim(0) == dst.dim(0))
      << kOp << ": src " << ShapeString(src.shape()) << ", index " << ShapeString(index.shape())
      << ", dst " << ShapeString(dst.shape());
  SY_DISPATCH_DEVICE(dst, ctx, cpu::GatherRows(src, index, dst),
                     cuda::GatherRows(src, index, dst, ctx));
}

void ScatterAddRows(const Tensor& drows, const Tensor& inverse, Tensor& dh, Write write,
                    DeviceContext* ctx) {
  constexpr const char* kOp = "ScatterAddRows";
  SY_CHECK(dh.defined()) << kOp << ": dh is undefined";
  CheckTensor(dh, DType::kF32, 2, dh.device(), kOp, "dh");
  CheckTensor(drows, DType::kF32, 2, dh.device(), kOp, "drows");
  CheckTensor(inverse, DType::kI64, 2, dh.device(), kOp, "inverse");
  SY_CHECK(drows.dim(1) == dh.dim(1) && inverse.dim(0) == dh.dim(0))
      << kOp << ": drows " << ShapeString(drows.shape()) << ", inverse "
      << ShapeString(inverse.shape()) << ", dh " << ShapeString(dh.shape());
  SY_DISPATCH_DEVICE(dh, ctx, cpu::ScatterAddRows(drows, inverse, dh, write),
                     cuda::ScatterAddRows(drows, inverse, dh, write, ctx));
}

void Combine(const Tensor& out, const Tensor& gates, const Tensor& inverse, const Tensor& extra,
             Tensor& y, DeviceContext* ctx, Tensor* kept) {
  constexpr const char* kOp = "Combine";
  SY_CHECK(y.defined()) << kOp << ": y is undefined";
  CheckTensor(y, DType::kF32, 2, y.device(), kOp, "y");
  CheckTensor(out, DType::kF32, 2, y.device(), kOp, "out");
  CheckTensor(gates, DType::kF32, 2, y.device(), kOp, "gates");
  CheckTensor(inverse, DType::kI64, 2, y.device(), kOp, "inverse");
  SY_CHECK(out.dim(1) == y.dim(1) && gates.dim(0) == y.dim(0) && inverse.shape() == gates.shape())
      << kOp << ": out " << ShapeString(out.shape()) << ", gates " << ShapeString(gates.shape())
      << ", inverse " << ShapeString(inverse.shape()) << ", y " << ShapeString(y.shape());
  if (extra.defined()) {
    CheckTensor(extra, DType::kF32, 2, y.device(), kOp, "extra");
    SY_CHECK(extra.shape() == y.shape())
        << kOp << ": extra " << ShapeString(extra.shape()) << " vs y " << ShapeString(y.shape());
  }
  // The kept rows by value (a recorded op runs later).
  Tensor kept_rows = kept != nullptr ? *kept : Tensor();
  if (kept != nullptr) {
    CheckTensor(kept_rows, DType::kBF16, 2, y.device(), kOp, "kept");
    SY_CHECK(kept_rows.shape() == out.shape())
        << kOp << ": kept " << ShapeString(kept_rows.shape()) << ", out "
        << ShapeString(out.shape());
  }
  SY_DISPATCH_DEVICE(
      y, ctx,
      cpu::Combine(out, gates, inverse, extra, y, kept_rows.defined() ? &kept_rows : nullptr),
      cuda::Combine(out, gates, inverse, extra, y, kept_rows.defined() ? &kept_rows : nullptr,
                    ctx));
}

void CombineBackward(const Tensor& dy, const Tensor& out, const Tensor& gates, const Tensor& slot,
                     Tensor& dout, Tensor& dgates, DeviceContext* ctx, const Tensor& inverse) {
  constexpr const char* kOp = "CombineBackward";
  SY_CHECK(dout.defined()) << kOp << ": dout is undefined";
  const Device dev = dout.device();
  CheckTensor(dout, dout.dtype() == DType::kBF16 ? DType::kBF16 : DType::kF32, 2, dev, kOp, "dout");
  CheckTensor(dgates, DType::kF32, 2, dev, kOp, "dgates");
  CheckTensor(dy, DType::kF32, 2, dev, kOp, "dy");
  CheckTensor(out, out.dtype() == DType::kBF16 ? DType::kBF16 : DType::kF32, 2, dev, kOp, "out");
  CheckTensor(gates, DType::kF32, 2, dev, kOp, "gates");
  CheckTensor(slot, DType::kI64, 1, dev, kOp, "slot");
  SY_CHECK(out.shape() == dout.shape() && dy.dim(1) == out.dim(1) &&
           gates.shape() == dgates.shape() && gates.dim(0) == dy.dim(0) &&
           slot.dim(0) == out.dim(0))
      << kOp << ": dy " << ShapeString(dy.shape()) << ", out " << ShapeString(out.shape())
      << ", gates " << ShapeString(gates.shape()) << ", slot " << ShapeString(slot.shape())
      << ", dout " << ShapeString(dout.shape()) << ", dgates " << ShapeString(dgates.shape());
  if (inverse.defined()) {
    CheckTensor(inverse, DType::kI64, 2, dev, kOp, "inverse");
    SY_CHECK(inverse.shape() == gates.shape())
        << kOp << ": inverse " << ShapeString(inverse.shape()) << ", gates "
        << ShapeString(gates.shape());
  }
  SY_DISPATCH_DEVICE(dout, ctx,
                     cpu::CombineBackward(dy, out, gates, slot, inverse, dout, dgates),
                     cuda::CombineBackward(dy, out, gates, slot, inverse, dout, dgates, ctx));
}

double EntropySum(const Tensor& probs, DeviceContext* ctx) {
  SY_CHECK(probs.defined() && probs.dtype() == DType::kF32)
      << "EntropySum: probs must be f32, got " << probs.DebugString();
  double sum = 0;
  SY_DISPATCH_DEVICE_NOW(probs, ctx, sum = cpu::EntropySum(probs), sum = cuda::EntropySum(probs, ctx));
  counters::CountReadback("moe.entropy_sum");
  return sum;
}

void EntropySumInto(const Tensor& probs, Tensor& sum, DeviceContext* ctx) {
  SY_CHECK(probs.defined() && probs.dtype() == DType::kF32)
      << "EntropySumInto: probs must be f32, got " << probs.DebugString();
  SY_CHECK(sum.defined() && sum.dtype() == DType::kF64 && sum.numel() == 1 &&
           sum.device() == probs.device())
      << "EntropySumInto: sum must be (1) f64 on " << probs.device() << ", got "
      << sum.DebugString();
  SY_DISPATCH_DEVICE(probs, ctx, sum.data<double>()[0] = cpu::EntropySum(probs),
                     cuda::EntropySumInto(probs, sum, ctx));
}

}  // namespace switchyard::kernels
