// Row indices and row gathers shared by the moe files (moe/row_index.h).
#include "moe/row_index.h"

#include "kernels/permute.h"

namespace switchyard::moe {

Tensor IndexOn(const std::vector<int64_t>& index, Device device, DeviceContext* ctx) {
  Tensor host = Tensor::FromVector(index, {static_cast<int64_t>(index.size())});
  return device.is_cpu() ? host : host.To(device, ctx);
}

Tensor RowsAt(const Tensor& t, const Tensor& index, DeviceContext* ctx) {
  Tensor out = Tensor::Empty({index.numel(), t.dim(1)}, t.dtype(), t.device());
  if (index.numel() > 0) kernels::GatherRows(t, index, out, ctx);
  return out;
}

}  // namespace switchyard::moe
