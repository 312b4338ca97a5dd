// Helpers of the multi-rank communicator tests (communicator_test.cc, p2p_test.cc): each
// rank fills its tensors from a formula of (rank, index) with integer values, so every
// expected result is exact.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/core/tensor.h"

namespace switchyard::dist::testing_util {

// The element value of an integer code: itself, or its low 16 bits for bf16.
template <typename T>
T FromCode(int64_t code) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    BFloat16 b;
    b.bits = static_cast<uint16_t>(code % 65521);
    return b;
  } else {
    return static_cast<T>(code);
  }
}

// What ExpectEach compares: the value, or the bits of a bf16.
template <typename T>
auto Comparable(T v) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return v.bits;
  } else {
    return v;
  }
}

// A host tensor whose element i is FromCode<T>(code(i)).
template <typename T, typename F>
Tensor Fill(const Shape& shape, F code) {
  std::vector<T> values(NumElements(shape));
  for (size_t i = 0; i < values.size(); ++i) values[i] = FromCode<T>(code(i));
  return Tensor::FromVector(values, shape);
}

// Expects element i of t to be FromCode<T>(code(i)); reports the first few that are not.
template <typename T, typename F>
void ExpectEach(const Tensor& t, F code, const std::string& what) {
  std::vector<T> values = t.ToVector<T>();
  int64_t wrong = 0;
  std::ostringstream first;
  for (size_t i = 0; i < values.size(); ++i) {
    const auto want = Comparable(FromCode<T>(code(i)));
    const auto got = Comparable(values[i]);
    if (got != want) {
      if (wrong < 5) first << " [" << i << "] " << +got << " != " << +want << ";";
      ++wrong;
    }
  }
  EXPECT_EQ(wrong, 0) << what << ": " << wrong << " of " << values.size()
                      << " elements wrong:" << first.str();
}

// 1000 * (0 + 1 + ... + (n-1)).
int64_t ThousandTriangle(int n) { return 1000LL * n * (n - 1) / 2; }

}  // namespace switchyard::dist::testing_util
