// The token dispatcher (moe/dispatcher.h): the plan's bookkeeping on host counts, the row
// phases through kernels/permute.h, the exchanges through the ep communicator.
#include "moe/dispatcher.h"

#include <cstring>

#include "engine/core/check.h"
#include "kernels/optimizer.h"
#include "kernels/permute.h"

namespace switchyard::moe {
namespace {

void CheckRows(const Tensor& t, int64_t rows, const DispatchPlan& plan, const char* what) {
  // f32, or the bf16 rows of a bf16 dispatch (Permute); the kernels check what each reads.
  SY_CHECK(t.defined() && (t.dtype() == DType::kF32 || t.dtype() == DType::kBF16) &&
           t.ndim() == 2 && t.dim(0) == rows)
      << what << ": expected f32 or bf16 (" << rows << ", d), got " << t.DebugString();
  SY_CHECK(t.device() == plan.device())
      << what << ": rows on " << t.device() << " for a dispatch plan on " << plan.device();
}

// The communicator moves tensors of its own device only; say so before it does.
void CheckCommunicatorDevice(const Tensor& rows, const dist::Communicator& ep, const char* what) {
  SY_CHECK(rows.device() == ep.device())
      << what << ": the ep communicator (" << ep.backend() << ", " << ep.device()
      << ") cannot exchange rows on " << rows.device() << " over " << ep.size()
      << " ranks; CUDA rows need the NCCL communicator, host rows the MPI one";
}

// Copies row blocks between two (., d) host tensors: for every (src_begin, dst_begin, count).
struct Block {
  int64_t src, dst, rows;
};
void CopyBlocks(const Tensor& src, Tensor& dst, const std::vector<Block>& blocks) {
  const int64_t row = src.dim(1) * static_cast<int64_t>(SizeOf(src.dtype()));  // bytes
  const char* s = static_cast<const char*>(src.raw_data());
  char* t = static_cast<char*>(dst.raw_data());
  for (const Block& b : blocks) {
    if (b.rows) std::memcpy(t + b.dst * row, s + b.src * row, b.rows * row);
  }
}

// Blocks of the (source, local expert) -> (local expert, source) transposition; `inverse`
// swaps source and destination.
std::vector<Block> RegroupBlocks(const DispatchPlan& plan, bool inverse) {
  SY_CHECK(plan.exchanged()) << "ExchangeCounts must run before Regroup / Ungroup";
  const int64_t ep = plan.ep_size(), el = plan.experts_per_rank();
  const auto& counts = plan.recv_per_source_expert();  // (ep, E_l)
  // Offsets in (source, expert) order.
  std::vector<int64_t> by_source(ep * el), by_expert(ep * el);
  int64_t off = 0;
  for (int64_t s = 0; s < ep; ++s)
    for (int64_t e = 0; e < el; ++e) by_source[s * el + e] = off, off += counts[s * el + e];
  off = 0;
  for (int64_t e = 0; e < el; ++e)
    for (int64_t s = 0; s < ep; ++s) by_expert[s * el + e] = off, off += counts[s * el + e];
  std::vector<Block> blocks;
  for (int64_t i = 0; i < ep * el; ++i) {
    blocks.push_back(inverse ? Block{by_expert[i], by_source[i], counts[i]}
                             : Block{by_source[i], by_expert[i], counts[i]});
  }
  return blocks;
}

// The row permutation of the blocks: on the host block copies; on a device one gather
// with the (R) source row of every destination row, built on the host and copied over.
Tensor PermuteBlocks(const Tensor& src, const DispatchPlan& plan, bool inverse,
                     DeviceContext* ctx) {
  const std::vector<Block> blocks = RegroupBlocks(plan, inverse);
  Tensor out = Tensor::Empty(src.shape(), src.dtype(), src.device());
  if (src.device().is_cpu()) {
    CopyBlocks(src, out, blocks);
    return out;
  }
  std::vector<int64_t> index(src.dim(0));
  for (const Block& b : blocks)
    for (int64_t r = 0; r < b.rows; ++r) index[b.dst + r] = b.src + r;
  Tensor device_index = Tensor::FromVector(index, {src.dim(0)}).To(src.device(), ctx);
  kernels::GatherRows(src, device_index, out, ctx);
  return out;
}

}  // namespace

DispatchPlan::DispatchPlan(int64_t num_tokens, int64_t top_k, int64_t num_experts,
                           int64_t ep_size)
    : num_tokens_(num_tokens), top_k_(top_k), num_experts_(num_experts), ep_size_(ep_size) {
  SY_CHECK(ep_size > 0 && num_experts % ep_size == 0)
      << "num_experts=" << num_experts << " over ep=" << ep_size;
}

DispatchPlan::DispatchPlan(const std::vector<int32_t>& experts, const std::vector<uint8_t>& kept,
                           int64_t num_tokens, int64_t top_k, int64_t num_experts,
                           int64_t ep_size)
    : DispatchPlan(num_tokens, top_k, num_experts, ep_size) {
  SY_CHECK_EQ(static_cast<int64_t>(experts.size()), num_tokens * top_k);
  SY_CHECK_EQ(experts.size(), kept.size());
  Init(Tensor::FromVector(experts, {num_tokens, top_k}),
       Tensor::FromVector(kept, {num_tokens, top_k}), nullptr);
}

DispatchPlan DispatchPlan::Build(const Tensor& experts, const Tensor& kept, int64_t num_experts,
                                 int64_t ep_size, DeviceContext* ctx) {
  SY_CHECK(experts.defined() && experts.ndim() == 2)
      << "DispatchPlan: experts must be (N, k), got " << experts.DebugString();
  DispatchPlan plan(experts.dim(0), experts.dim(1), num_experts, ep_size);
  plan.Init(experts, kept, ctx);
  return plan;
}

DispatchPlan DispatchPlan::BuildDeviceSized(const Tensor& experts, const Tensor& kept,
                                            int64_t num_experts, int64_t max_rows,
                                            DeviceContext* ctx) {
  SY_CHECK(experts.defined() && experts.ndim() == 2)
      << "DispatchPlan: experts must be (N, k), got " << experts.DebugString();
  DispatchPlan plan(experts.dim(0), experts.dim(1), num_experts, /*ep_size=*/1);
  const int64_t nk = plan.num_tokens_ * plan.top_k_;
  SY_CHECK(max_rows >= 0 && max_rows <= nk)
      << "DispatchPlan: max_rows=" << max_rows << " outside [0, N * k = " << nk << "]";
  const Device dev = experts.device();
  Tensor token = Tensor::Empty({nk}, DType::kI64, dev);
  Tensor slot = Tensor::Empty({nk}, DType::kI64, dev);
  Tensor inverse = Tensor::Empty({nk}, DType::kI64, dev);
  plan.offsets_ = Tensor::Empty({num_experts + 1}, DType::kI64, dev);
  kernels::SortAssignmentsToOffsets(experts, kept, num_experts, token, slot, inverse,
                                    plan.offsets_, ctx);
  plan.token_tensor_ = token.Slice(0, max_rows);
  plan.slot_tensor_ = slot.Slice(0, max_rows);
  plan.inverse_ = inverse.Reshape({plan.num_tokens_, plan.top_k_});
  if (dev.is_cpu()) {
    // Checked when the sort has run: at once, or at each replay of a capture
    // (engine/core/captured_work.h).
    auto check = [offsets = plan.offsets_, num_experts, max_rows] {
      const int64_t kept_total = offsets.data<int64_t>()[num_experts];
      SY_CHECK_LE(kept_total, max_rows)
          << "a device-sized dispatch plan of " << max_rows << " rows got " << kept_total
          << " kept assignments";
    };
    if (ctx != nullptr && ctx->capturing()) {
      ctx->Record(check);
    } else {
      check();
    }
  }
  plan.send_rows_.assign(1, max_rows);
  plan.recv_rows_.assign(1, max_rows);
  plan.num_received_ = max_rows;
  plan.exchanged_ = true;
  return plan;
}

void DispatchPlan::Init(const Tensor& experts, const Tensor& kept, DeviceContext* ctx) {
  const int64_t nk = num_tokens_ * top_k_;
  const Device dev = experts.device();
  Tensor token = Tensor::Empty({nk}, DType::kI64, dev);
  Tensor slot = Tensor::Empty({nk}, DType::kI64, dev);
  Tensor inverse = Tensor::Empty({nk}, DType::kI64, dev);
  send_per_expert_ =
      kernels::SortAssignments(experts, kept, num_experts_, token, slot, inverse, ctx);
  int64_t total = 0;
  for (int64_t c : send_per_expert_) total += c;
  // The kept assignments are the first A of the sorted order.
  token_tensor_ = token.Slice(0, total);
  slot_tensor_ = slot.Slice(0, total);
  inverse_ = inverse.Reshape({num_tokens_, top_k_});
  if (dev.is_cpu()) {
    const int64_t* tp = token.data<int64_t>();
    const int64_t* sp = slot.data<int64_t>();
    token_.assign(tp, tp + total);
    slot_.assign(sp, sp + total);
  }
  const int64_t el = num_experts_ / ep_size_;
  send_rows_.assign(ep_size_, 0);
  for (int64_t e = 0; e < num_experts_; ++e) send_rows_[e / el] += send_per_expert_[e];
}

const std::vector<int64_t>& DispatchPlan::token() const {
  SY_CHECK(device().is_cpu()) << "DispatchPlan::token(): the plan lives on " << device()
                              << "; read token_tensor()";
  ReadKeptRows();
  return token_;
}

const std::vector<int64_t>& DispatchPlan::slot() const {
  SY_CHECK(device().is_cpu()) << "DispatchPlan::slot(): the plan lives on " << device()
                              << "; read slot_tensor()";
  ReadKeptRows();
  return slot_;
}

void DispatchPlan::ReadKeptRows() const {
  // A device-sized plan's host copies are read from its tensors when first asked for (the
  // sort may have been recorded rather than run when the plan was built).
  if (!device_sized() || kept_rows_read_) return;
  const int64_t kept = received_rows();
  const int64_t* tp = token_tensor_.data<int64_t>();
  const int64_t* sp = slot_tensor_.data<int64_t>();
  token_.assign(tp, tp + kept);
  slot_.assign(sp, sp + kept);
  kept_rows_read_ = true;
}

int64_t DispatchPlan::received_rows() const {
  if (!device_sized()) return num_received_;
  SY_CHECK(device().is_cpu()) << "DispatchPlan::received_rows(): a device-sized plan on "
                              << device() << " keeps its counts there";
  return offsets_.data<int64_t>()[num_experts_];
}

void DispatchPlan::ExchangeCounts(dist::Communicator& ep, DeviceContext* ctx) {
  SY_CHECK_EQ(ep.size(), ep_size_) << "plan built for a different ep group";
  if (device_sized()) return;  // one rank: nothing to exchange, the counts stay put
  const int64_t el = experts_per_rank();
  if (ep_size_ == 1) {
    recv_per_source_expert_ = send_per_expert_;  // this rank is the whole group
  } else {
    // Row d of the send matrix holds this rank's counts for rank d's local experts.
    Tensor send = Tensor::FromVector(send_per_expert_, {ep_size_, el});
    if (ep.device().is_cpu()) {
      Tensor recv = Tensor::Empty({ep_size_, el}, DType::kI64);
      ep.AllToAll(send, recv);
      // A host exchange here; a GPU run reads the device exchange back (the same count).
      recv_per_source_expert_ = recv.ToHost("moe.exchange_counts", ctx).ToVector<int64_t>();
    } else {
      SY_CHECK(ctx != nullptr && ctx->device() == ep.device())
          << "ExchangeCounts over a communicator on " << ep.device()
          << " needs that device's DeviceContext";
      Tensor send_dev = send.To(ep.device(), ctx);
      Tensor recv_dev = Tensor::Empty({ep_size_, el}, DType::kI64, ep.device());
      ep.AllToAll(send_dev, recv_dev);
      Tensor recv = recv_dev.ToHost("moe.exchange_counts", ctx);  // waits for the stream
      recv_per_source_expert_ = recv.ToVector<int64_t>();
    }
  }
  recv_rows_.assign(ep_size_, 0);
  rows_per_local_expert_.assign(el, 0);
  num_received_ = 0;
  for (int64_t s = 0; s < ep_size_; ++s) {
    for (int64_t e = 0; e < el; ++e) {
      int64_t c = recv_per_source_expert_[s * el + e];
      recv_rows_[s] += c;
      rows_per_local_expert_[e] += c;
      num_received_ += c;
    }
  }
  exchanged_ = true;
}

Tensor Permute(const Tensor& h, const DispatchPlan& plan, DeviceContext* ctx, DType rows_dtype) {
  CheckRows(h, plan.num_tokens(), plan, "Permute input");
  SY_CHECK(rows_dtype == DType::kF32 || rows_dtype == DType::kBF16)
      << "Permute: rows of " << DTypeName(rows_dtype) << " (f32 or bf16)";
  Tensor rows = Tensor::Empty({plan.num_assignments(), h.dim(1)}, rows_dtype, h.device());
  kernels::GatherRows(h, plan.token_tensor(), rows, ctx);
  return rows;
}

void ScatterAdd(const Tensor& drows, const DispatchPlan& plan, Tensor& dh, kernels::Write write,
                DeviceContext* ctx) {
  CheckRows(drows, plan.num_assignments(), plan, "ScatterAdd input");
  CheckRows(dh, plan.num_tokens(), plan, "ScatterAdd output");
  kernels::ScatterAddRows(drows, plan.inverse(), dh, write, ctx);
}

Tensor ExchangeRows(const Tensor& rows, const DispatchPlan& plan, dist::Communicator& ep,
                    DeviceContext* ctx) {
  SY_CHECK(plan.exchanged()) << "ExchangeCounts must run before ExchangeRows";
  CheckRows(rows, plan.num_assignments(), plan, "ExchangeRows input");
  SY_CHECK_EQ(ep.size(), plan.ep_size()) << "plan built for a different ep group";
  if (plan.ep_size() == 1) return rows;
  CheckCommunicatorDevice(rows, ep, "ExchangeRows");
  Tensor recv = Tensor::Empty({plan.num_received(), rows.dim(1)}, rows.dtype(), rows.device());
  ep.AllToAllV(rows, plan.send_rows(), recv, plan.recv_rows());
  return recv;
}

Tensor ReturnRows(const Tensor& rows, const DispatchPlan& plan, dist::Communicator& ep,
                  DeviceContext* ctx) {
  SY_CHECK(plan.exchanged()) << "ExchangeCounts must run before ReturnRows";
  CheckRows(rows, plan.num_received(), plan, "ReturnRows input");
  SY_CHECK_EQ(ep.size(), plan.ep_size()) << "plan built for a different ep group";
  if (plan.ep_size() == 1) return rows;
  CheckCommunicatorDevice(rows, ep, "ReturnRows");
  Tensor back = Tensor::Empty({plan.num_assignments(), rows.dim(1)}, rows.dtype(), rows.device());
  ep.AllToAllV(rows, plan.recv_rows(), back, plan.send_rows());
  return back;
}

Tensor Regroup(const Tensor& recv, const DispatchPlan& plan, DeviceContext* ctx) {
  SY_CHECK(plan.exchanged()) << "ExchangeCounts must run before Regroup / Ungroup";
  CheckRows(recv, plan.num_received(), plan, "Regroup input");
  if (plan.ep_size() == 1) return recv;  // one source: already grouped by local expert
  return PermuteBlocks(recv, plan, /*inverse=*/false, ctx);
}

Tensor Ungroup(const Tensor& grouped, const DispatchPlan& plan, DeviceContext* ctx) {
  SY_CHECK(plan.exchanged()) << "ExchangeCounts must run before Regroup / Ungroup";
  CheckRows(grouped, plan.num_received(), plan, "Ungroup input");
  if (plan.ep_size() == 1) return grouped;
  return PermuteBlocks(grouped, plan, /*inverse=*/true, ctx);
}

namespace {

// s * gates in a fresh (N, k) tensor (one f32 product per gate, the same bits on every device);
// the gates themselves when s is 1.
Tensor ScaledGates(const Tensor& gates, float s, const Shape& shape, DeviceContext* ctx) {
  if (s == 1.0f) return gates.Reshape(shape);
  Tensor scaled = Tensor::Empty(shape, DType::kF32, gates.device());
  scaled.CopyFrom(gates.Reshape(shape), ctx);
  kernels::ScaleInPlace(scaled, s, ctx);
  return scaled;
}

}  // namespace

Tensor Combine(const Tensor& out, const Tensor& gates, float scale, const DispatchPlan& plan,
               const Tensor& extra, DeviceContext* ctx, Tensor* kept) {
  CheckRows(out, plan.num_assignments(), plan, "Combine input");
  SY_CHECK(gates.defined() && gates.numel() == plan.num_tokens() * plan.top_k())
      << "Combine gates: expected (" << plan.num_tokens() << ", " << plan.top_k() << "), got "
      << gates.DebugString();
  Tensor y = Tensor::Empty({plan.num_tokens(), out.dim(1)}, DType::kF32, out.device());
  kernels::Combine(out, ScaledGates(gates, scale, {plan.num_tokens(), plan.top_k()}, ctx),
                   plan.inverse(), extra, y, ctx, kept);
  return y;
}

void CombineBackward(const Tensor& dy, const Tensor& out, const Tensor& gates, float scale,
                     const DispatchPlan& plan, Tensor& dout, Tensor& dgates,
                     DeviceContext* ctx) {
  CheckRows(dy, plan.num_tokens(), plan, "CombineBackward dy");
  CheckRows(out, plan.num_assignments(), plan, "CombineBackward out");
  CheckRows(dout, plan.num_assignments(), plan, "CombineBackward dout");
  const Shape gate_shape = {plan.num_tokens(), plan.top_k()};
  SY_CHECK(gates.defined() && gates.numel() == plan.num_tokens() * plan.top_k())
      << "CombineBackward gates: expected " << ShapeString(gate_shape) << ", got "
      << gates.DebugString();
  SY_CHECK(dgates.defined() && dgates.numel() == plan.num_tokens() * plan.top_k())
      << "CombineBackward dgates: expected " << ShapeString(gate_shape) << ", got "
      << dgates.DebugString();
  Tensor dg = dgates.Reshape(gate_shape);
  // A device-sized plan's rows may end in dropped assignments: the inverse tells them apart.
  kernels::CombineBackward(dy, out, ScaledGates(gates, scale, gate_shape, ctx), plan.slot_tensor(),
                           dout, dg, ctx, plan.device_sized() ? plan.inverse() : Tensor());
  // d/dg of s g: the scaled gates' gradient times s.
  if (scale != 1.0f) kernels::ScaleInPlace(dg, scale, ctx);
}

}  // namespace switchyard::moe
