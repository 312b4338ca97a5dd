// CPU reference of kernels/permute.h: the loops of the original dispatcher
// (moe/dispatcher.cc), with the per-token sums in the order that loop used (increasing
// permuted row), so every result keeps its bits. Tokens (or rows) are independent and run in
// parallel over the compute threads; each writes only its own row.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "engine/core/thread_pool.h"
#include "kernels/cpu/rows.h"
#include "kernels/permute.h"

namespace switchyard::kernels::cpu {
namespace {

// The kept rows of token t in increasing row order, as (row a, flat slot s) pairs; every
// row must be below `num_rows`.
void KeptRowsOf(const int64_t* inverse, int64_t t, int64_t k, int64_t num_rows,
                std::vector<std::pair<int64_t, int64_t>>& rows) {
  rows.clear();
  for (int64_t j = 0; j < k; ++j) {
    const int64_t a = inverse[t * k + j];
    SY_CHECK_LT(a, num_rows) << "inverse[" << t * k + j << "] is past the permuted rows";
    if (a >= 0) rows.push_back({a, t * k + j});
  }
  std::sort(rows.begin(), rows.end());
}

}  // namespace

std::vector<int64_t> SortAssignments(const Tensor& experts, const Tensor& kept,
                                     int64_t num_experts, Tensor& token, Tensor& slot,
                                     Tensor& inverse) {
  const int64_t n = experts.numel(), k = experts.dim(1);
  const int32_t* ex = experts.data<int32_t>();
  const uint8_t* kp = kept.data<uint8_t>();
  // Counting sort by expert keeps (token, slot) order inside each expert.
  std::vector<int64_t> counts(num_experts, 0);
  for (int64_t i = 0; i < n; ++i) {
    if (!kp[i]) continue;
    SY_CHECK(ex[i] >= 0 && ex[i] < num_experts)
        << "expert index " << ex[i] << " of slot " << i << " outside [0, " << num_experts << ")";
    ++counts[ex[i]];
  }
  std::vector<int64_t> next(num_experts, 0);
  int64_t total = 0;
  for (int64_t e = 0; e < num_experts; ++e) next[e] = total, total += counts[e];
  int64_t next_dropped = total;  // the dropped slots follow, in slot order
  int64_t* tok = token.data<int64_t>();
  int64_t* sl = slot.data<int64_t>();
  int64_t* inv = inverse.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t a = kp[i] ? next[ex[i]]++ : next_dropped++;
    sl[a] = i;
    tok[a] = i / k;
    inv[i] = kp[i] ? a : -1;
  }
  return counts;
}

void SortAssignmentsToOffsets(const Tensor& experts, const Tensor& kept, int64_t num_experts,
                              Tensor& token, Tensor& slot, Tensor& inverse, Tensor& offsets) {
  const std::vector<int64_t> counts =
      SortAssignments(experts, kept, num_experts, token, slot, inverse);
  int64_t* o = offsets.data<int64_t>();
  o[0] = 0;
  for (int64_t e = 0; e < num_experts; ++e) o[e + 1] = o[e] + counts[e];
}

void GatherRows(const Tensor& src, const Tensor& index, Tensor& dst) {
  const int64_t rows = dst.dim(0), n = src.dim(0);
  const size_t row_bytes = static_cast<size_t>(dst.dim(1)) * SizeOf(dst.dtype());
  const auto* s = static_cast<const char*>(src.raw_data());
  const int64_t* idx = index.data<int64_t>();
  auto* t = static_cast<char*>(dst.raw_data());
  for (int64_t r = 0; r < rows; ++r) {
    SY_CHECK(idx[r] >= 0 && idx[r] < n) << "GatherRows: index " << idx[r] << " of row " << r
                                        << " outside [0, " << n << ")";
  }
  if (row_bytes == 0) return;
  if (src.dtype() != dst.dtype()) {  // f32 rows rounded into bf16 (kernels/permute.h)
    const int64_t d = dst.dim(1);
    const float* sf = src.data<float>();
    auto* tb = static_cast<BFloat16*>(dst.raw_data());
    ParallelFor(rows, RowsPerChunk(d), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t j = 0; j < d; ++j) tb[r * d + j] = BFloat16(sf[idx[r] * d + j]);
      }
    });
    return;
  }
  ParallelFor(rows, RowsPerChunk(static_cast<int64_t>(row_bytes / 4)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) std::memcpy(t + r * row_bytes, s + idx[r] * row_bytes, row_bytes);
  });
}

void ScatterAddRows(const Tensor& drows, const Tensor& inverse, Tensor& dh, Write write) {
  const int64_t n = dh.dim(0), d = dh.dim(1), k = inverse.dim(1);
  const float* src = drows.data<float>();
  const int64_t* inv = inverse.data<int64_t>();
  float* dst = dh.data<float>();
  ParallelFor(n, RowsPerChunk(d), [&](int64_t t0, int64_t t1) {
    std::vector<std::pair<int64_t, int64_t>> rows;
    for (int64_t t = t0; t < t1; ++t) {
      KeptRowsOf(inv, t, k, drows.dim(0), rows);
      float* row = dst + t * d;
      if (write == Write::kSet) std::fill(row, row + d, 0.0f);  // the sum starts at +0
      for (const auto& [a, s] : rows) {
        const float* g = src + a * d;
        for (int64_t j = 0; j < d; ++j) row[j] += g[j];
      }
    }
  });
}

void Combine(const Tensor& out, const Tensor& gates, const Tensor& inverse, const Tensor& extra,
             Tensor& y, Tensor* kept) {
  const int64_t n = y.dim(0), d = y.dim(1), k = inverse.dim(1);
  const float* o = out.data<float>();
  const float* g = gates.data<float>();
  const int64_t* inv = inverse.data<int64_t>();
  const float* x = extra.defined() ? extra.data<float>() : nullptr;
  float* dst = y.data<float>();
  BFloat16* kp = kept != nullptr ? static_cast<BFloat16*>(kept->raw_data()) : nullptr;
  ParallelFor(n, RowsPerChunk(d), [&](int64_t t0, int64_t t1) {
    std::vector<std::pair<int64_t, int64_t>> rows;
    for (int64_t t = t0; t < t1; ++t) {
      KeptRowsOf(inv, t, k, out.dim(0), rows);
      float* row = dst + t * d;
      std::fill(row, row + d, 0.0f);
      for (const auto& [a, s] : rows) {
        const float w = g[s];
        for (int64_t j = 0; j < d; ++j) row[j] += w * o[a * d + j];
        if (kp != nullptr) {
          for (int64_t j = 0; j < d; ++j) kp[a * d + j] = BFloat16(o[a * d + j]);
        }
      }
      if (x != nullptr) {
        for (int64_t j = 0; j < d; ++j) row[j] += x[t * d + j];
      }
    }
  });
}

void CombineBackward(const Tensor& dy, const Tensor& out, const Tensor& gates, const Tensor& slot,
                     const Tensor& inverse, Tensor& dout, Tensor& dgates) {
  const int64_t rows = out.dim(0), d = dy.dim(1), k = gates.dim(1), nk = gates.numel();
  const float* g = gates.data<float>();
  const float* dyp = dy.data<float>();
  // out f32, or the bf16 rows Combine kept (widened as read: exact).
  const float* o = out.dtype() == DType::kF32 ? out.data<float>() : nullptr;
  const BFloat16* o16 = o == nullptr ? static_cast<const BFloat16*>(out.raw_data()) : nullptr;
  const int64_t* sl = slot.data<int64_t>();
  // dout f32, or bf16: each w * dy rounded as stored (the experts' bf16 operand).
  float* dop = dout.dtype() == DType::kF32 ? dout.data<float>() : nullptr;
  BFloat16* dop16 = dop == nullptr ? static_cast<BFloat16*>(dout.raw_data()) : nullptr;
  float* dg = dgates.data<float>();
  const int64_t* inv = inverse.defined() ? inverse.data<int64_t>() : nullptr;
  std::memset(dg, 0, sizeof(float) * nk);
  for (int64_t a = 0; a < rows; ++a) {
    SY_CHECK(sl[a] >= 0 && sl[a] < nk) << "CombineBackward: slot " << sl[a] << " of row " << a
                                       << " outside [0, " << nk << ")";
  }
  // Every row has its own slot (the plan's permutation), so rows write disjoint gates.
  ParallelFor(rows, RowsPerChunk(d), [&](int64_t a0, int64_t a1) {
    for (int64_t a = a0; a < a1; ++a) {
      if (inv != nullptr && inv[sl[a]] != a) {  // a dropped row: no gradient either way
        if (dop != nullptr) {
          std::memset(dop + a * d, 0, sizeof(float) * d);
        } else {
          std::fill(dop16 + a * d, dop16 + (a + 1) * d, BFloat16(0.0f));
        }
        continue;
      }
      const float w = g[sl[a]];
      const float* row = dyp + (sl[a] / k) * d;
      double dot = 0;
      for (int64_t j = 0; j < d; ++j) {
        if (dop != nullptr) {
          dop[a * d + j] = w * row[j];
        } else {
          dop16[a * d + j] = BFloat16(w * row[j]);
        }
        const float oj = o != nullptr ? o[a * d + j] : static_cast<float>(o16[a * d + j]);
        dot += static_cast<double>(row[j]) * oj;
      }
      dg[sl[a]] = static_cast<float>(dot);
    }
  });
}

double EntropySum(const Tensor& probs) {
  const int64_t n = probs.numel();
  const float* p = probs.data<float>();
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] > 0) sum -= static_cast<double>(p[i]) * std::log(p[i]);
  }
  return sum;
}

}  // namespace switchyard::kernels::cpu
