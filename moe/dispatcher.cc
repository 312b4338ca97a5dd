#include "moe/dispatcher.h"

#include <cstring>

#include "engine/core/check.h"

namespace switchyard::moe {
namespace {

void CheckRows(const Tensor& t, int64_t rows, const char* what) {
  SY_CHECK(t.device().is_cpu() && t.dtype() == DType::kF32 && t.ndim() == 2 && t.dim(0) == rows)
      << what << ": expected f32 (" << rows << ", d) on the host, got " << t.DebugString();
}

// Copies row blocks between two (., d) tensors: for every (src_begin, dst_begin, count).
struct Block {
  int64_t src, dst, rows;
};
void CopyBlocks(const Tensor& src, Tensor& dst, const std::vector<Block>& blocks) {
  const int64_t d = src.dim(1);
  const float* s = src.data<float>();
  float* t = dst.data<float>();
  for (const Block& b : blocks) {
    if (b.rows) std::memcpy(t + b.dst * d, s + b.src * d, sizeof(float) * b.rows * d);
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

}  // namespace

DispatchPlan::DispatchPlan(const std::vector<int32_t>& experts, const std::vector<uint8_t>& kept,
                           int64_t num_tokens, int64_t top_k, int64_t num_experts,
                           int64_t ep_size)
    : num_tokens_(num_tokens), top_k_(top_k), num_experts_(num_experts), ep_size_(ep_size) {
  SY_CHECK(ep_size > 0 && num_experts % ep_size == 0)
      << "num_experts=" << num_experts << " over ep=" << ep_size;
  SY_CHECK_EQ(static_cast<int64_t>(experts.size()), num_tokens * top_k);
  SY_CHECK_EQ(experts.size(), kept.size());
  // Counting sort by expert keeps (token, slot) order inside each expert.
  send_per_expert_.assign(num_experts, 0);
  for (size_t i = 0; i < experts.size(); ++i) {
    if (!kept[i]) continue;
    SY_CHECK(experts[i] >= 0 && experts[i] < num_experts) << "expert index " << experts[i];
    ++send_per_expert_[experts[i]];
  }
  std::vector<int64_t> next(num_experts, 0);
  int64_t total = 0;
  for (int64_t e = 0; e < num_experts; ++e) next[e] = total, total += send_per_expert_[e];
  token_.resize(total);
  slot_.resize(total);
  for (size_t i = 0; i < experts.size(); ++i) {
    if (!kept[i]) continue;
    int64_t a = next[experts[i]]++;
    token_[a] = static_cast<int64_t>(i) / top_k;
    slot_[a] = static_cast<int64_t>(i);
  }
  const int64_t el = num_experts / ep_size;
  send_rows_.assign(ep_size, 0);
  for (int64_t e = 0; e < num_experts; ++e) send_rows_[e / el] += send_per_expert_[e];
}

void DispatchPlan::ExchangeCounts(dist::Communicator& ep) {
  SY_CHECK_EQ(ep.size(), ep_size_) << "plan built for a different ep group";
  const int64_t el = experts_per_rank();
  // Row d of the send matrix holds this rank's counts for rank d's local experts.
  Tensor send = Tensor::FromVector(send_per_expert_, {ep_size_, el});
  Tensor recv = Tensor::Empty({ep_size_, el}, DType::kI64);
  ep.AllToAll(send, recv);
  recv_per_source_expert_ = recv.ToVector<int64_t>();
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

Tensor Permute(const Tensor& h, const DispatchPlan& plan) {
  CheckRows(h, plan.num_tokens(), "Permute input");
  const int64_t d = h.dim(1);
  Tensor rows = Tensor::Empty({plan.num_assignments(), d}, DType::kF32);
  const float* src = h.data<float>();
  float* dst = rows.data<float>();
  for (int64_t a = 0; a < plan.num_assignments(); ++a) {
    std::memcpy(dst + a * d, src + plan.token()[a] * d, sizeof(float) * d);
  }
  return rows;
}

void ScatterAdd(const Tensor& drows, const DispatchPlan& plan, Tensor& dh) {
  CheckRows(drows, plan.num_assignments(), "ScatterAdd input");
  CheckRows(dh, plan.num_tokens(), "ScatterAdd output");
  const int64_t d = dh.dim(1);
  const float* src = drows.data<float>();
  float* dst = dh.data<float>();
  for (int64_t a = 0; a < plan.num_assignments(); ++a) {
    float* row = dst + plan.token()[a] * d;
    const float* g = src + a * d;
    for (int64_t j = 0; j < d; ++j) row[j] += g[j];
  }
}

Tensor ExchangeRows(const Tensor& rows, const DispatchPlan& plan, dist::Communicator& ep) {
  SY_CHECK(plan.exchanged()) << "ExchangeCounts must run before ExchangeRows";
  CheckRows(rows, plan.num_assignments(), "ExchangeRows input");
  Tensor recv = Tensor::Empty({plan.num_received(), rows.dim(1)}, DType::kF32);
  ep.AllToAllV(rows, plan.send_rows(), recv, plan.recv_rows());
  return recv;
}

Tensor ReturnRows(const Tensor& rows, const DispatchPlan& plan, dist::Communicator& ep) {
  SY_CHECK(plan.exchanged()) << "ExchangeCounts must run before ReturnRows";
  CheckRows(rows, plan.num_received(), "ReturnRows input");
  Tensor back = Tensor::Empty({plan.num_assignments(), rows.dim(1)}, DType::kF32);
  ep.AllToAllV(rows, plan.recv_rows(), back, plan.send_rows());
  return back;
}

Tensor Regroup(const Tensor& recv, const DispatchPlan& plan) {
  CheckRows(recv, plan.num_received(), "Regroup input");
  Tensor out = Tensor::Empty(recv.shape(), DType::kF32);
  CopyBlocks(recv, out, RegroupBlocks(plan, /*inverse=*/false));
  return out;
}

Tensor Ungroup(const Tensor& grouped, const DispatchPlan& plan) {
  CheckRows(grouped, plan.num_received(), "Ungroup input");
  Tensor out = Tensor::Empty(grouped.shape(), DType::kF32);
  CopyBlocks(grouped, out, RegroupBlocks(plan, /*inverse=*/true));
  return out;
}

Tensor Combine(const Tensor& out, const Tensor& gates, const DispatchPlan& plan) {
  CheckRows(out, plan.num_assignments(), "Combine input");
  SY_CHECK_EQ(gates.numel(), plan.num_tokens() * plan.top_k()) << "Combine gates";
  const int64_t d = out.dim(1);
  Tensor y = Tensor::Zeros({plan.num_tokens(), d}, DType::kF32);
  const float* o = out.data<float>();
  const float* g = gates.data<float>();
  float* dst = y.data<float>();
  for (int64_t a = 0; a < plan.num_assignments(); ++a) {
    const float w = g[plan.slot()[a]];
    float* row = dst + plan.token()[a] * d;
    for (int64_t j = 0; j < d; ++j) row[j] += w * o[a * d + j];
  }
  return y;
}

void CombineBackward(const Tensor& dy, const Tensor& out, const Tensor& gates,
                     const DispatchPlan& plan, Tensor& dout, Tensor& dgates) {
  CheckRows(dy, plan.num_tokens(), "CombineBackward dy");
  CheckRows(out, plan.num_assignments(), "CombineBackward out");
  CheckRows(dout, plan.num_assignments(), "CombineBackward dout");
  SY_CHECK_EQ(dgates.numel(), plan.num_tokens() * plan.top_k()) << "CombineBackward dgates";
  const int64_t d = dy.dim(1);
  const float* g = gates.data<float>();
  const float* dyp = dy.data<float>();
  const float* o = out.data<float>();
  float* dop = dout.data<float>();
  float* dg = dgates.data<float>();
  std::memset(dg, 0, sizeof(float) * dgates.numel());
  for (int64_t a = 0; a < plan.num_assignments(); ++a) {
    const float w = g[plan.slot()[a]];
    const float* row = dyp + plan.token()[a] * d;
    double dot = 0;
    for (int64_t j = 0; j < d; ++j) {
      dop[a * d + j] = w * row[j];
      dot += static_cast<double>(row[j]) * o[a * d + j];
    }
    dg[plan.slot()[a]] = static_cast<float>(dot);
  }
}

}  // namespace switchyard::moe
