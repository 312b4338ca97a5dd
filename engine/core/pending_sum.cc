// PendingSum (engine/core/pending_sum.h): the recorded left fold and its evaluation.
#include "engine/core/pending_sum.h"

#include "engine/core/check.h"

namespace switchyard {

PendingSum PendingSum::Slot(int64_t index) {
  SY_CHECK_GE(index, 0) << "PendingSum::Slot";
  PendingSum s;
  s.terms_.push_back(Term{.kind = Term::kSlot, .value = 0.0, .slot = index, .nested = nullptr});
  return s;
}

PendingSum& PendingSum::operator+=(double value) {
  if (terms_.empty()) {
    known_ += value;
  } else {
    terms_.push_back(Term{.kind = Term::kConst, .value = value, .slot = -1, .nested = nullptr});
  }
  return *this;
}

PendingSum& PendingSum::operator+=(const PendingSum& other) {
  if (other.known()) return *this += other.known_;
  if (terms_.empty()) {
    terms_.push_back(Term{.kind = Term::kConst, .value = known_, .slot = -1, .nested = nullptr});
  }
  // A single slot needs no nesting: x + slot either way.
  if (other.terms_.size() == 1 && other.terms_[0].kind == Term::kSlot) {
    terms_.push_back(other.terms_[0]);
  } else {
    terms_.push_back(Term{.kind = Term::kNested, .value = 0.0, .slot = -1,
                          .nested = std::make_shared<const PendingSum>(other)});
  }
  return *this;
}

double PendingSum::Eval(const Term& t, std::span<const double> slots) const {
  switch (t.kind) {
    case Term::kConst:
      return t.value;
    case Term::kSlot:
      SY_CHECK_LT(t.slot, static_cast<int64_t>(slots.size()))
          << "PendingSum: slot " << t.slot << " of a readback of " << slots.size();
      return slots[t.slot];
    case Term::kNested:
      return t.nested->Value(slots);
  }
  return 0.0;
}

double PendingSum::Value(std::span<const double> slots) const {
  if (terms_.empty()) return known_;
  double acc = Eval(terms_[0], slots);
  for (size_t i = 1; i < terms_.size(); ++i) acc += Eval(terms_[i], slots);
  return acc;
}

void PendingSum::Resolve(std::span<const double> slots) {
  known_ = Value(slots);
  terms_.clear();
}

PendingSum::operator double() const {
  SY_CHECK(terms_.empty()) << "a step value read on the host before the step's readback";
  return known_;
}

}  // namespace switchyard
