#include "moe/capacity.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/moe_routing.h"

namespace switchyard::moe {
namespace {

// `t` is a defined 2-d tensor of `dtype` on `device`.
void CheckMatrix(const Tensor& t, DType dtype, Device device, const char* what) {
  SY_CHECK(t.defined()) << what << " is undefined";
  SY_CHECK(t.device() == device) << what << " on " << t.device() << ", the indices on "
                                 << device;
  SY_CHECK_EQ(t.dtype(), dtype) << what;
  SY_CHECK_EQ(t.ndim(), 2) << what << " " << ShapeString(t.shape());
}

// keep (T, k) checked against indices, or undefined for all ones.
void CheckKeep(const Tensor& keep, const Tensor& indices) {
  if (!keep.defined()) return;
  CheckMatrix(keep, DType::kU8, indices.device(), "admission keep");
  SY_CHECK(keep.shape() == indices.shape()) << "admission keep " << ShapeString(keep.shape())
                                            << " vs indices " << ShapeString(indices.shape());
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
                                      int64_t num_experts, DeviceContext* ctx) {
  SY_CHECK(indices.defined()) << "admission indices is undefined";
  CheckMatrix(indices, DType::kI32, indices.device(), "admission indices");
  CheckKeep(keep, indices);
  const int64_t k = indices.dim(1), E = num_experts;
  SY_CHECK_GE(E, 1) << "SlotExpertCounts num_experts";
  Tensor counts = Tensor::Empty({k * E + 1}, DType::kI64, indices.device());
  kernels::CountSlotAssignments(indices, keep, E, counts, ctx);
  const Tensor host = counts.ToHost("moe.slot_counts", ctx);  // the one device->host copy
  std::vector<int64_t> c = host.ToVector<int64_t>();
  SY_CHECK_EQ(c[k * E], 0) << "expert indices outside [0, " << E << ")";
  c.pop_back();
  return c;
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
                          std::span<const int64_t> offsets, DeviceContext* ctx) {
  SY_CHECK(indices.defined()) << "admission indices is undefined";
  const Device dev = indices.device();
  CheckMatrix(indices, DType::kI32, dev, "admission indices");
  CheckKeep(keep, indices);
  const int64_t T = indices.dim(0), k = indices.dim(1), E = num_experts;
  SY_CHECK_GE(E, 1) << "admission num_experts";
  const bool by_position = policy == DropPolicy::kPosition;
  if (by_position) {
    SY_CHECK(offsets.empty() || static_cast<int64_t>(offsets.size()) == k * E)
        << "admission offsets: " << offsets.size() << " for k*E=" << k * E;
  } else {
    SY_CHECK(offsets.empty())
        << "drop_policy=probability across split groups needs the whole group's gates";
    CheckMatrix(gates, DType::kF32, dev, "admission gates");
    SY_CHECK(gates.shape() == indices.shape()) << "admission gates";
  }

  Admission a;
  a.kept = Tensor::Empty({T, k}, DType::kU8, dev);
  a.position = Tensor::Empty({T, k}, DType::kI64, dev);
  kernels::AdmissionCounts counts = kernels::AdmitAssignments(
      indices, by_position ? Tensor() : gates, keep, E, capacity,
      by_position ? kernels::AdmissionOrder::kPosition : kernels::AdmissionOrder::kProbability,
      offsets, a.kept, a.position, ctx);
  a.counts_before = std::move(counts.before);
  a.counts_after = std::move(counts.after);
  a.removed = counts.removed;
  // An expert admits its first C competitors, so a kept assignment's rank among the
  // competitors is also its rank among the kept ones.
  for (int64_t e = 0; e < E; ++e) a.dropped += a.counts_before[e] - a.counts_after[e];
  return a;
}

Admission AdmitToCapacityInto(const Tensor& indices, const Tensor& gates, const Tensor& keep,
                              int64_t num_experts, int64_t capacity, DropPolicy policy,
                              StepReadback& readback, DeviceContext* ctx) {
  SY_CHECK(indices.defined()) << "admission indices is undefined";
  const Device dev = indices.device();
  CheckMatrix(indices, DType::kI32, dev, "admission indices");
  CheckKeep(keep, indices);
  const int64_t T = indices.dim(0), k = indices.dim(1);
  SY_CHECK_GE(num_experts, 1) << "admission num_experts";
  const bool by_position = policy == DropPolicy::kPosition;
  Admission a;
  a.kept = Tensor::Empty({T, k}, DType::kU8, dev);
  a.position = Tensor::Empty({T, k}, DType::kI64, dev);
  StepReadback::Slots slots = readback.Reserve(num_experts + 1, dev, ctx);
  kernels::AdmitAssignmentsInto(
      indices, by_position ? Tensor() : gates, keep, num_experts, capacity,
      by_position ? kernels::AdmissionOrder::kPosition : kernels::AdmissionOrder::kProbability,
      a.kept, a.position, slots.values, ctx);
  a.kept_slot = slots.first;
  return a;
}

}  // namespace switchyard::moe
