// PendingSum: a double the host will know at the step's end. Values a step computes on the
// device (its losses, statistics and gradient norm) are written into the step's readback
// buffer (engine/core/step_readback.h) instead of being copied back one by one; the host
// arithmetic that used to add them up as they came is recorded instead, term by term, and
// evaluated once the buffer is read back: the same additions in the same order, so the
// same bits as adding them at once.
//
// Semantics: a PendingSum is a left fold. `x += y` appends y (a number, a slot, or another
// PendingSum, evaluated on its own first); Value() is t0 + t1 + ... in that order, t0 being
// the value the sum started from. A sum with no slots is a plain known double (the fast
// path), and reading a pending one as a double is a fatal check: it would be a value the
// host does not have yet.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace switchyard {

class PendingSum {
 public:
  // A known value.
  PendingSum(double value = 0.0) : known_(value) {}  // NOLINT: implicit, stands for a double
  // The value of slot `index` of the step's readback, exactly (not 0 + it).
  static PendingSum Slot(int64_t index);

  PendingSum& operator+=(double value);
  PendingSum& operator+=(const PendingSum& other);

  // True when no slot is involved (the value is known now).
  bool known() const { return terms_.empty(); }
  // The value; `slots` are the step's readback values (may be empty when known()).
  double Value(std::span<const double> slots) const;
  // Replaces the recorded terms by their value.
  void Resolve(std::span<const double> slots);
  // The known value (a fatal check when pending).
  operator double() const;  // NOLINT: reads like the double it replaces

 private:
  struct Term {
    enum Kind { kConst, kSlot, kNested } kind = kConst;
    double value = 0.0;
    int64_t slot = -1;
    std::shared_ptr<const PendingSum> nested;
  };
  double Eval(const Term& t, std::span<const double> slots) const;

  double known_ = 0.0;       // the value while terms_ is empty
  std::vector<Term> terms_;  // pending: terms_[0] + terms_[1] + ... in order
};

}  // namespace switchyard
