// The bf16 weight-shadow table of engine/core/weight_shadows.h.
#include "engine/core/weight_shadows.h"

#include <iterator>

namespace switchyard {
namespace {

uintptr_t Begin(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw_data()); }

}  // namespace

void WeightShadows::Register(const Tensor& weight) {
  SY_CHECK(weight.defined() && weight.dtype() == DType::kF32)
      << "WeightShadows::Register: " << weight.DebugString() << " is not a defined f32 tensor";
  if (weight.numel() == 0) return;
  const uintptr_t begin = Begin(weight), end = begin + weight.nbytes();
  auto next = entries_.lower_bound(begin);
  if (next != entries_.end() && next->first == begin &&
      next->second.weight.nbytes() == weight.nbytes()) {
    return;  // already registered
  }
  SY_CHECK(next == entries_.end() || next->first >= end)
      << "WeightShadows::Register: " << weight.DebugString() << " overlaps a registered weight";
  if (next != entries_.begin()) {
    const auto& prev = *std::prev(next);
    SY_CHECK(prev.first + prev.second.weight.nbytes() <= begin)
        << "WeightShadows::Register: " << weight.DebugString()
        << " overlaps a registered weight";
  }
  entries_.emplace(begin, Entry{weight, Tensor(), false, false});
}

void WeightShadows::Clear() {
  entries_.clear();
  active_ = false;
}

void WeightShadows::Activate() {
  if (!enabled_) return;
  for (auto& [begin, e] : entries_) {
    e.fresh = e.updated;
    e.updated = false;
  }
  active_ = true;
}

Tensor WeightShadows::UpdateTarget(const Tensor& weight) {
  if (!enabled_ || !weight.defined() || weight.numel() == 0) return Tensor();
  auto it = entries_.find(Begin(weight));
  if (it == entries_.end()) return Tensor();
  Entry& e = it->second;
  if (e.weight.nbytes() != weight.nbytes() || !e.shadow.defined()) return Tensor();
  e.updated = true;
  return e.shadow;
}

void WeightShadows::Invalidate() {
  for (auto& [begin, e] : entries_) e.updated = false;
}

void WeightShadows::Deactivate() {
  active_ = false;
  for (auto& [begin, e] : entries_) e.fresh = false;
}

WeightShadows::Match WeightShadows::Find(const Tensor& operand) {
  Match m{Tensor(), nullptr, nullptr, 0};
  if (entries_.empty() || !operand.defined() || operand.dtype() != DType::kF32 ||
      operand.numel() == 0 || !operand.buffer().resident()) {
    return m;
  }
  const uintptr_t begin = Begin(operand), end = begin + operand.nbytes();
  auto it = entries_.upper_bound(begin);
  if (it == entries_.begin()) return m;
  --it;
  Entry& e = it->second;
  if (end > it->first + e.weight.nbytes()) return m;
  if (!e.weight.buffer().resident() || Begin(e.weight) != it->first) return m;  // stale
  m.weight = e.weight;
  m.shadow = &e.shadow;
  m.fresh = &e.fresh;
  m.offset = static_cast<int64_t>((begin - it->first) / sizeof(float));
  return m;
}

}  // namespace switchyard
