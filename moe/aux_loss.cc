#include "moe/aux_loss.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/balance_loss.h"
#include "kernels/moe_routing.h"

namespace switchyard::moe {
namespace {

// `t` is a defined 2-d tensor of `dtype`.
void CheckMatrix(const Tensor& t, DType dtype, const char* what) {
  SY_CHECK(t.defined()) << what << " is undefined";
  SY_CHECK_EQ(t.dtype(), dtype) << what;
  SY_CHECK_EQ(t.ndim(), 2) << what << " " << ShapeString(t.shape());
}

}  // namespace

LoadBalanceSums LoadBalanceSumsOf(const Tensor& probs, const Tensor& indices,
                                  DeviceContext* ctx) {
  CheckMatrix(probs, DType::kF32, "aux probs");
  CheckMatrix(indices, DType::kI32, "aux indices");
  const int64_t T = probs.dim(0), E = probs.dim(1), k = indices.dim(1);
  SY_CHECK_EQ(indices.dim(0), T) << "aux indices";
  const Device dev = probs.device();
  SY_CHECK(indices.device() == dev) << "aux indices on " << indices.device() << ", probs on "
                                    << dev;
  LoadBalanceSums sums;
  sums.tokens = T;
  sums.assignments.assign(E, 0);
  sums.prob_sums.assign(E, 0.0f);
  if (E == 0) {
    SY_CHECK_EQ(indices.numel(), 0) << "aux indices for 0 experts";
    return sums;
  }
  // The slot counts (k * E + 1) i64 and the prob sums (E) f32 side by side in one buffer, so
  // that a CUDA call copies them back at once.
  const int64_t count_bytes = (k * E + 1) * 8;
  Tensor packed = Tensor::Empty({count_bytes + E * 4}, DType::kU8, dev);
  auto* base = static_cast<char*>(packed.raw_data());
  Tensor counts = Tensor::Wrap(base, {k * E + 1}, DType::kI64, dev);
  Tensor prob_sums = Tensor::Wrap(base + count_bytes, {E}, DType::kF32, dev);
  kernels::CountSlotAssignments(indices, Tensor(), E, counts, ctx);
  kernels::ProbColumnSums(probs, prob_sums, ctx);
  const Tensor host = packed.ToHost("moe.balance_sums", ctx);  // the one device->host copy
  const auto* h = static_cast<const char*>(host.raw_data());
  std::vector<int64_t> c(k * E + 1);
  std::memcpy(c.data(), h, count_bytes);
  SY_CHECK_EQ(c[k * E], 0) << "expert indices outside [0, " << E << ")";
  for (int64_t j = 0; j < k; ++j) {
    for (int64_t e = 0; e < E; ++e) sums.assignments[e] += c[j * E + e];
  }
  std::memcpy(sums.prob_sums.data(), h + count_bytes, E * 4);
  return sums;
}

LoadBalanceSums LoadBalanceSumsInto(const Tensor& probs, const Tensor& indices, float coef,
                                    StepReadback& readback, DeviceContext* ctx) {
  CheckMatrix(probs, DType::kF32, "aux probs");
  CheckMatrix(indices, DType::kI32, "aux indices");
  const int64_t T = probs.dim(0), E = probs.dim(1), k = indices.dim(1);
  SY_CHECK(indices.dim(0) == T && E > 0) << "aux indices " << ShapeString(indices.shape())
                                         << " for probs " << ShapeString(probs.shape());
  const Device dev = probs.device();
  LoadBalanceSums sums;
  sums.tokens = T;
  sums.device_counts = Tensor::Empty({k * E + 1}, DType::kI64, dev);
  sums.device_prob_sums = Tensor::Empty({E}, DType::kF32, dev);
  kernels::CountSlotAssignments(indices, Tensor(), E, sums.device_counts, ctx);
  kernels::ProbColumnSums(probs, sums.device_prob_sums, ctx);
  StepReadback::Slots slots = readback.Reserve(E + 2, dev, ctx);
  kernels::BalanceValuesInto(sums.device_counts, sums.device_prob_sums, T, k, coef, slots.values,
                             ctx);
  sums.values_slot = slots.first;
  return sums;
}

float LoadBalancingLossFromSums(const LoadBalanceSums& group, int64_t top_k, float coef) {
  SY_CHECK(!group.on_device()) << "the load-balancing loss of sums still on the device";
  const int64_t E = static_cast<int64_t>(group.assignments.size());
  SY_CHECK_EQ(static_cast<int64_t>(group.prob_sums.size()), E);
  // E * sum_i (c_i / (T k)) (s_i / T).
  return kernels::BalanceAuxOf(group.assignments, group.prob_sums.data(), group.tokens, top_k,
                               coef);
}

void LoadBalancingLossBackward(const LoadBalanceSums& group, int64_t top_k, float coef, float grad,
                               Tensor& dprobs, kernels::Write write, DeviceContext* ctx) {
  CheckMatrix(dprobs, DType::kF32, "aux dprobs");
  if (group.on_device()) {
    kernels::AddBalanceColumn(dprobs, group.device_counts, group.tokens, top_k, coef, grad,
                              write, ctx);
    return;
  }
  const int64_t E = static_cast<int64_t>(group.assignments.size());
  SY_CHECK_EQ(dprobs.dim(1), E) << "aux dprobs";
  if (group.tokens == 0 && write == kernels::Write::kAdd) return;
  kernels::AddColumnConstants(
      dprobs, kernels::BalanceColumnOf(group.assignments, group.tokens, top_k, coef, grad), write,
      ctx);
}

float LoadBalancingLoss(const Tensor& probs, const Tensor& indices, float coef, float grad,
                        Tensor* dprobs, DeviceContext* ctx) {
  const LoadBalanceSums sums = LoadBalanceSumsOf(probs, indices, ctx);
  const int64_t k = indices.dim(1);
  if (dprobs != nullptr) {
    SY_CHECK_EQ(dprobs->dim(0), probs.dim(0)) << "aux dprobs";
    LoadBalancingLossBackward(sums, k, coef, grad, *dprobs, kernels::Write::kAdd, ctx);
  }
  return LoadBalancingLossFromSums(sums, k, coef);
}

BalanceTerms BalanceTermsOf(const Tensor& probs, const Tensor& indices,
                            const LoadBalanceSums& group, AuxLossScope scope, int64_t seq_len,
                            std::span<const float> load, DeviceContext* ctx) {
  const int64_t T = probs.dim(0);
  BalanceTerms terms;
  terms.part_tokens = T;
  if (scope == AuxLossScope::kSequence && seq_len > 0 && seq_len < T) {
    terms.part_tokens = seq_len;
    for (int64_t begin = 0; begin < T; begin += seq_len) {
      const int64_t end = std::min(T, begin + seq_len);
      terms.parts.push_back(
          LoadBalanceSumsOf(probs.Slice(begin, end), indices.Slice(begin, end), ctx));
    }
    return terms;
  }
  terms.parts.push_back(group);
  if (scope == AuxLossScope::kGlobal) {
    SY_CHECK_EQ(load.size(), group.prob_sums.size()) << "global aux loss: the expert load";
    terms.load.assign(load.begin(), load.end());
  }
  return terms;
}

BalanceTerms BalanceTermsInto(const Tensor& probs, const Tensor& indices,
                              const LoadBalanceSums& group, AuxLossScope scope, int64_t seq_len,
                              const Tensor& load, int64_t top_k, float coef,
                              StepReadback& readback, DeviceContext* ctx) {
  SY_CHECK(group.on_device()) << "BalanceTermsInto: the group's sums are on the host";
  const int64_t T = probs.dim(0), E = probs.dim(1);
  const Device dev = probs.device();
  BalanceTerms terms;
  terms.parts = {group};
  terms.part_tokens = T;
  terms.aux_slot = group.values_slot;
  if (scope == AuxLossScope::kSequence && seq_len > 0 && seq_len < T) {
    const int64_t parts = (T + seq_len - 1) / seq_len;
    terms.part_tokens = seq_len;
    terms.part_counts = Tensor::Empty({parts, top_k * E + 1}, DType::kI64, dev);
    Tensor prob_sums = Tensor::Empty({parts, E}, DType::kF32, dev);
    kernels::PartBalanceSums(probs, indices, seq_len, terms.part_counts, prob_sums, ctx);
    StepReadback::Slots slot = readback.Reserve(1, dev, ctx);
    kernels::PartBalanceValueInto(terms.part_counts, prob_sums, T, seq_len, top_k, coef,
                                  slot.values, ctx);
    terms.aux_slot = slot.first;
  } else if (scope == AuxLossScope::kGlobal) {
    SY_CHECK(load.defined() && load.numel() == E)
        << "global aux loss: the expert load " << load.DebugString() << " for " << E
        << " experts";
    terms.device_load = load;
    StepReadback::Slots slot = readback.Reserve(1, dev, ctx);
    kernels::GlobalBalanceValueInto(load, group.device_prob_sums, T, coef, slot.values, ctx);
    terms.aux_slot = slot.first;
  }
  return terms;
}

float BalanceLoss(const BalanceTerms& terms, int64_t top_k, float coef) {
  SY_CHECK(!terms.parts.empty()) << "aux loss of no tokens' sums";
  SY_CHECK(terms.aux_slot < 0) << "the aux loss of terms still on the device";
  if (!terms.load.empty()) {
    // coef E sum_i load_i s_i / T.
    const LoadBalanceSums& g = terms.parts[0];
    SY_CHECK_EQ(terms.load.size(), g.prob_sums.size()) << "global aux loss: the expert load";
    return kernels::GlobalBalanceAuxOf(terms.load, g.prob_sums.data(), g.tokens, coef);
  }
  if (terms.parts.size() == 1) return LoadBalancingLossFromSums(terms.parts[0], top_k, coef);
  double sum = 0.0;
  for (const LoadBalanceSums& part : terms.parts) {
    sum += LoadBalancingLossFromSums(part, top_k, coef);
  }
  return static_cast<float>(sum / static_cast<double>(terms.parts.size()));
}

void BalanceLossBackward(const BalanceTerms& terms, int64_t top_k, float coef, float grad,
                         Tensor& dprobs, kernels::Write write, DeviceContext* ctx) {
  SY_CHECK(!terms.parts.empty()) << "aux loss of no tokens' sums";
  CheckMatrix(dprobs, DType::kF32, "aux dprobs");
  if (terms.device_load.defined()) {
    kernels::AddGlobalBalanceColumn(dprobs, terms.device_load, terms.parts[0].tokens, coef, grad,
                                    write, ctx);
    return;
  }
  if (terms.part_counts.defined()) {
    SY_CHECK_EQ(dprobs.dim(0), terms.parts[0].tokens)
        << "sequence aux loss: dprobs is not the whole group";
    kernels::AddPartBalanceColumns(dprobs, terms.part_counts, terms.part_tokens, top_k, coef,
                                   grad, write, ctx);
    return;
  }
  if (!terms.load.empty()) {
    const LoadBalanceSums& g = terms.parts[0];
    if (g.tokens == 0 && write == kernels::Write::kAdd) return;
    kernels::AddColumnConstants(
        dprobs, kernels::GlobalBalanceColumnOf(terms.load, g.tokens, coef, grad), write, ctx);
    return;
  }
  if (terms.parts.size() == 1) {
    LoadBalancingLossBackward(terms.parts[0], top_k, coef, grad, dprobs, write, ctx);
    return;
  }
  // Sequence scope: each part's rows get its own column, scaled by 1 / n.
  const int64_t n = static_cast<int64_t>(terms.parts.size());
  const float part_grad = static_cast<float>(static_cast<double>(grad) / n);
  int64_t row = 0;
  for (const LoadBalanceSums& part : terms.parts) {
    Tensor rows = dprobs.Slice(row, row + part.tokens);
    LoadBalancingLossBackward(part, top_k, coef, part_grad, rows, write, ctx);
    row += part.tokens;
  }
  SY_CHECK_EQ(row, dprobs.dim(0)) << "sequence aux loss: dprobs is not the whole group";
}

float ZLoss(const Tensor& logits, float coef, float grad, Tensor* dlogits, int64_t group_tokens,
            DeviceContext* ctx) {
  CheckMatrix(logits, DType::kF32, "z-loss logits");
  if (dlogits != nullptr) CheckMatrix(*dlogits, DType::kF32, "z-loss dlogits");
  return kernels::RouterZLoss(logits, coef, grad, group_tokens, dlogits, ctx);
}

void ZLossInto(const Tensor& logits, float coef, Tensor& value, int64_t group_tokens,
               DeviceContext* ctx) {
  CheckMatrix(logits, DType::kF32, "z-loss logits");
  kernels::RouterZLossInto(logits, coef, group_tokens, value, ctx);
}

void ZLossBackward(const Tensor& logits, float coef, float grad, Tensor& dlogits,
                   kernels::Write write, int64_t group_tokens, DeviceContext* ctx) {
  CheckMatrix(logits, DType::kF32, "z-loss logits");
  CheckMatrix(dlogits, DType::kF32, "z-loss dlogits");
  kernels::RouterZLossBackward(logits, coef, grad, group_tokens, dlogits, write, ctx);
}

}  // namespace switchyard::moe
