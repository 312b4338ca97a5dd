// Argument checks and device dispatch for kernels/embedding.h. The ids' values are checked
// against the table by the implementations (on CUDA without a per-id host round trip).
#include "kernels/check.h"
#include "kernels/embedding.h"

#include "kernels/dispatch.h"

namespace switchyard::kernels {
namespace {

// ids (N) i32, table (V, d) and rows (N, d) f32, all on `device`.
void CheckLookup(const Tensor& ids, const Tensor& table, const Tensor& rows, Device device,
                 const char* op, const char* table_name, const char* rows_name) {
  CheckTensorOn(ids, DType::kI32, device, op, "ids");
  CheckTensorOn(table, DType::kF32, device, op, table_name);
  CheckTensorOn(rows, DType::kF32, device, op, rows_name);
  SY_CHECK_EQ(table.ndim(), 2) << op << ": " << table_name << " is (V, d), got "
                               << ShapeString(table.shape());
  const int64_t d = table.dim(1), n = ids.numel();
  SY_CHECK(rows.ndim() >= 1 && rows.dim(-1) == d && rows.numel() == n * d)
      << op << ": " << rows_name << " " << ShapeString(rows.shape()) << " for " << n
      << " ids and rows of " << d;
}

// x (B, S, d) against wpe (S_max, d) at the offset, both on `device`.
void CheckPositions(const Tensor& x, const Tensor& wpe, int64_t offset, Device device,
                    const char* op) {
  CheckTensorOn(x, DType::kF32, device, op, "x");
  CheckTensorOn(wpe, DType::kF32, device, op, "wpe");
  SY_CHECK(x.ndim() == 3 && wpe.ndim() == 2 && x.dim(2) == wpe.dim(1))
      << op << ": x " << ShapeString(x.shape()) << " is (B, S, d), wpe " << ShapeString(wpe.shape())
      << " is (S_max, d)";
  SY_CHECK(offset >= 0 && offset + x.dim(1) <= wpe.dim(0))
      << op << ": positions [" << offset << ", " << offset + x.dim(1)
      << ") exceed S_max=" << wpe.dim(0);
}

}  // namespace

void EmbeddingForward(const Tensor& ids, const Tensor& table, Tensor& out, DeviceContext* ctx,
                      IdCheck check) {
  SY_CHECK(out.defined()) << "EmbeddingForward: out is undefined";
  CheckLookup(ids, table, out, out.device(), "EmbeddingForward", "table", "out");
  const bool on_device = check == IdCheck::kOnDevice;
  SY_DISPATCH_DEVICE(out, ctx, cpu::EmbeddingForward(ids, table, out),
                     cuda::EmbeddingForward(ids, table, out, on_device, ctx));
  // The CUDA kernel reads back its bad-id word.
  if (on_device) counters::CountReadback("embedding.id_check");
}

void EmbeddingBackward(const Tensor& ids, const Tensor& dout, Tensor& dtable, DeviceContext* ctx,
                       IdCheck check) {
  SY_CHECK(dtable.defined()) << "EmbeddingBackward: dtable is undefined";
  CheckLookup(ids, dtable, dout, dtable.device(), "EmbeddingBackward", "dtable", "dout");
  const bool on_device = check == IdCheck::kOnDevice;
  SY_DISPATCH_DEVICE(dtable, ctx, cpu::EmbeddingBackward(ids, dout, dtable),
                     cuda::EmbeddingBackward(ids, dout, dtable, on_device, ctx));
  if (on_device) counters::CountReadback("embedding.id_check");
}

void AddPositionEmbedding(Tensor& x, const Tensor& wpe, int64_t position_offset,
                          DeviceContext* ctx) {
  SY_CHECK(x.defined()) << "AddPositionEmbedding: x is undefined";
  CheckPositions(x, wpe, position_offset, x.device(), "AddPositionEmbedding");
  SY_DISPATCH_DEVICE(x, ctx, cpu::AddPositionEmbedding(x, wpe, position_offset),
                     cuda::AddPositionEmbedding(x, wpe, position_offset, ctx));
}

void PositionEmbeddingBackward(const Tensor& dx, Tensor& dwpe, int64_t position_offset,
                               DeviceContext* ctx) {
  SY_CHECK(dwpe.defined()) << "PositionEmbeddingBackward: dwpe is undefined";
  CheckPositions(dx, dwpe, position_offset, dwpe.device(), "PositionEmbeddingBackward");
  SY_DISPATCH_DEVICE(dwpe, ctx, cpu::PositionEmbeddingBackward(dx, dwpe, position_offset),
                     cuda::PositionEmbeddingBackward(dx, dwpe, position_offset, ctx));
}

}  // namespace switchyard::kernels
