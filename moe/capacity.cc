#include "moe/capacity.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace switchyard::moe {
namespace {

void CheckCpu(const Tensor& t, DType dtype, const char* what) {
  SY_CHECK(t.device().is_cpu()) << what << " on " << t.device()
                                << ": CUDA admission lands with the CUDA backend";
  SY_CHECK_EQ(t.dtype(), dtype) << what;
  SY_CHECK_EQ(t.ndim(), 2) << what << " " << ShapeString(t.shape());
}

// keep (T, k) as a pointer, or null for all ones.
const uint8_t* KeepData(const Tensor& keep, const Tensor& indices) {
  if (!keep.defined()) return nullptr;
  CheckCpu(keep, DType::kU8, "admission keep");
  SY_CHECK(keep.shape() == indices.shape()) << "admission keep " << ShapeString(keep.shape())
                                            << " vs indices " << ShapeString(indices.shape());
  return keep.data<uint8_t>();
}

}  // namespace

int64_t ExpertCapacity(double capacity_factor, int64_t tokens, int64_t top_k, int64_t num_experts) {
  SY_CHECK(tokens >= 0 && top_k >= 1 && num_experts >= 1)
      << "ExpertCapacity(T=" << tokens << ", k=" << top_k << ", E=" << num_experts << ")";
  if (!(capacity_factor > 0.0)) return kDropless;
  const double x = capacity_factor * static_cast<double>(tokens * top_k) / num_experts;
  // No expert can receive more than every assignment of the group; capping here also keeps
  // huge factors (1e30) from overflowing the conversion to int64.
  if (x >= static_cast<double>(tokens * top_k)) return tokens * top_k;
  const double n = std::round(x);
  if (std::abs(x - n) <= 1e-6 * x) return static_cast<int64_t>(n);
  return static_cast<int64_t>(std::ceil(x));
}

std::vector<int64_t> SlotExpertCounts(const Tensor& indices, const Tensor& keep,
                                      int64_t num_experts) {
  CheckCpu(indices, DType::kI32, "admission indices");
  const int64_t T = indices.dim(0), k = indices.dim(1), E = num_experts;
  const int32_t* ip = indices.data<int32_t>();
  const uint8_t* kp = KeepData(keep, indices);
  std::vector<int64_t> counts(k * E, 0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ip[t * k + j];
      SY_CHECK(e >= 0 && e < E) << "expert index " << e << " outside [0, " << E << ")";
      if (kp == nullptr || kp[t * k + j]) ++counts[j * E + e];
    }
  }
  return counts;
}

std::vector<int64_t> PositionOffsets(std::span<const int64_t> exclusive_prefix,
                                     std::span<const int64_t> total, int64_t top_k,
                                     int64_t num_experts) {
  const int64_t E = num_experts;
  SY_CHECK_EQ(static_cast<int64_t>(exclusive_prefix.size()), top_k * E) << "PositionOffsets";
  SY_CHECK_EQ(static_cast<int64_t>(total.size()), top_k * E) << "PositionOffsets";
  std::vector<int64_t> offsets(top_k * E);
  std::vector<int64_t> earlier_slots(E, 0);
  for (int64_t j = 0; j < top_k; ++j) {
    for (int64_t e = 0; e < E; ++e) {
      offsets[j * E + e] = earlier_slots[e] + exclusive_prefix[j * E + e];
      earlier_slots[e] += total[j * E + e];
    }
  }
  return offsets;
}

Admission AdmitToCapacity(const Tensor& indices, const Tensor& gates, const Tensor& keep,
                          int64_t num_experts, int64_t capacity, DropPolicy policy,
                          std::span<const int64_t> offsets) {
  CheckCpu(indices, DType::kI32, "admission indices");
  const int64_t T = indices.dim(0), k = indices.dim(1), E = num_experts;
  SY_CHECK_GE(E, 1) << "admission num_experts";
  const int32_t* ip = indices.data<int32_t>();
  const uint8_t* kp = KeepData(keep, indices);
  const bool limited = capacity >= 0;

  Admission a;
  a.kept = Tensor::Zeros({T, k}, DType::kU8);
  a.position = Tensor::Empty({T, k}, DType::kI64);
  a.counts_before.assign(E, 0);
  a.counts_after.assign(E, 0);
  uint8_t* kept = a.kept.data<uint8_t>();
  int64_t* pos = a.position.data<int64_t>();
  std::fill(pos, pos + T * k, int64_t{-1});

  // Visits the competing assignments (t, j) in priority order; `rank` is the assignment's
  // rank among its expert's competitors, offsets included.
  auto admit = [&](int64_t t, int64_t j, int64_t rank) {
    const int32_t e = ip[t * k + j];
    if (!limited || rank < capacity) {
      kept[t * k + j] = 1;
      pos[t * k + j] = rank;
      ++a.counts_after[e];
    }
  };
  auto competes = [&](int64_t t, int64_t j) {
    const int32_t e = ip[t * k + j];
    SY_CHECK(e >= 0 && e < E) << "expert index " << e << " outside [0, " << E << ")";
    if (kp != nullptr && !kp[t * k + j]) {
      ++a.removed;
      return false;
    }
    return true;
  };

  if (policy == DropPolicy::kPosition) {
    SY_CHECK(offsets.empty() || static_cast<int64_t>(offsets.size()) == k * E)
        << "admission offsets: " << offsets.size() << " for k*E=" << k * E;
    // A single piece is its own whole group: offsets from its own counts.
    std::vector<int64_t> own;
    if (offsets.empty()) {
      own =
          PositionOffsets(std::vector<int64_t>(k * E, 0), SlotExpertCounts(indices, keep, E), k, E);
      offsets = own;
    }
    std::vector<int64_t> in_slot(E);  // this piece's slot-j assignments to e so far
    for (int64_t j = 0; j < k; ++j) {
      std::fill(in_slot.begin(), in_slot.end(), 0);
      for (int64_t t = 0; t < T; ++t) {
        if (!competes(t, j)) continue;
        const int32_t e = ip[t * k + j];
        admit(t, j, offsets[j * E + e] + in_slot[e]);
        ++in_slot[e];
        ++a.counts_before[e];
      }
    }
  } else {
    SY_CHECK(offsets.empty())
        << "drop_policy=probability across split groups needs the whole group's gates";
    CheckCpu(gates, DType::kF32, "admission gates");
    SY_CHECK(gates.shape() == indices.shape()) << "admission gates";
    const float* gp = gates.data<float>();
    std::vector<int64_t> order;  // flat t * k + j, which sorts by token then slot
    order.reserve(T * k);
    for (int64_t i = 0; i < T * k; ++i) {
      if (competes(i / k, i % k)) order.push_back(i);
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t x, int64_t y) { return gp[x] > gp[y]; });
    for (int64_t i : order) {
      const int32_t e = ip[i];
      admit(i / k, i % k, a.counts_before[e]);
      ++a.counts_before[e];
    }
  }
  // An expert admits its first C competitors, so a kept assignment's rank among the
  // competitors is also its rank among the kept ones.
  for (int64_t e = 0; e < E; ++e) a.dropped += a.counts_before[e] - a.counts_after[e];
  return a;
}

}  // namespace switchyard::moe
