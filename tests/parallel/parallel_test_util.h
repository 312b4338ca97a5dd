// Helpers of the tests/parallel tests: the tensor-parallel groups every test runs over,
// host tensors from formulas, row and column blocks, products, and closeness checks that
// print the fraction of the tolerance used (once, from world rank 0).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"
#include "tests/kernels/grad_check.h"
#include "engine/dist/process.h"
#include "kernels/gemm.h"

namespace switchyard::parallel_test {

// One tp group of this rank: a size-1 local group, the world, and with 4+ ranks (an even
// number) consecutive pairs, so the mappings also run on a sub-group.
struct Group {
  std::string name;
  std::unique_ptr<dist::Communicator> comm;
};

// Collective over world.
inline std::vector<Group> TpGroups(dist::Communicator& world) {
  std::vector<Group> groups;
  groups.push_back({"local", dist::MakeLocalCommunicator()});
  std::vector<int> all(world.size());
  for (int r = 0; r < world.size(); ++r) all[r] = r;
  groups.push_back({"world" + std::to_string(world.size()), world.Split({all})});
  if (world.size() >= 4 && world.size() % 2 == 0) {
    std::vector<std::vector<int>> pairs;
    for (int r = 0; r < world.size(); r += 2) pairs.push_back({r, r + 1});
    groups.push_back({"pairs", world.Split(pairs)});
  }
  return groups;
}

// A host f32 tensor whose flat element i is value(i).
inline Tensor Fill(const Shape& shape, const std::function<float(int64_t)>& value) {
  std::vector<float> v(static_cast<size_t>(NumElements(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = value(static_cast<int64_t>(i));
  return Tensor::FromVector(v, shape);
}

// A small integer in [-8, 8] from a few keys: sums of a handful are exact in f32.
inline float Code(int64_t a, int64_t b = 0, int64_t c = 0) {
  return static_cast<float>((a * 7 + b * 3 + c * 5 + 11) % 17 - 8);
}

// Columns [begin, end) of a host 2-d tensor, as a new tensor.
inline Tensor Columns(const Tensor& t, int64_t begin, int64_t end) {
  const int64_t rows = t.dim(0), cols = t.dim(1);
  const std::vector<float> v = t.ToVector<float>();
  std::vector<float> out;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = begin; j < end; ++j) out.push_back(v[i * cols + j]);
  return Tensor::FromVector(out, {rows, end - begin});
}

// Rows [begin, end) of a host tensor, as a new tensor.
inline Tensor RowBlock(const Tensor& t, int64_t begin, int64_t end) {
  return t.Slice(begin, end).Clone();
}

// op(a) @ op(b) on the host, f32.
inline Tensor MatMul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b) {
  const int64_t m = trans_a ? a.dim(1) : a.dim(0), n = trans_b ? b.dim(0) : b.dim(1);
  Tensor c = Tensor::Empty({m, n}, DType::kF32);
  kernels::Gemm(a, trans_a, b, trans_b, c);
  return c;
}

// sum of a * w in double.
inline double Dot(const Tensor& a, const Tensor& w) {
  const std::vector<float> x = a.ToVector<float>(), y = w.ToVector<float>();
  EXPECT_EQ(x.size(), y.size());
  double s = 0.0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) s += static_cast<double>(x[i]) * y[i];
  return s;
}

// Worst |got - want| / (abs_tol + rel_tol |want|) must be <= 1 (NaN fails): the kernels'
// helper (tests/kernels/grad_check.h), which prints the fraction used.
using testing::ExpectClose;

inline void ExpectClose(const Tensor& got, const Tensor& want, double abs_tol, double rel_tol,
                        const std::string& what) {
  EXPECT_EQ(got.shape(), want.shape()) << what;
  ExpectClose(got.ToVector<float>(), want.ToVector<float>(), abs_tol, rel_tol, what);
}

// Equal shapes and equal values (== on floats: exact; NaN fails).
inline void ExpectEqual(const Tensor& got, const Tensor& want, const std::string& what) {
  EXPECT_EQ(got.shape(), want.shape()) << what;
  EXPECT_EQ(got.dtype(), want.dtype()) << what;
  if (got.shape() != want.shape() || got.dtype() != want.dtype()) return;
  if (got.dtype() == DType::kI32) {
    EXPECT_EQ(got.ToVector<int32_t>(), want.ToVector<int32_t>()) << what;
    return;
  }
  const std::vector<float> g = got.ToVector<float>(), w = want.ToVector<float>();
  int64_t wrong = 0, first = -1;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!(g[i] == w[i]) && wrong++ == 0) first = static_cast<int64_t>(i);
  }
  EXPECT_EQ(wrong, 0) << what << ": " << wrong << " of " << g.size() << " differ, first at "
                      << first << ": " << (first >= 0 ? g[first] : 0.0f) << " vs "
                      << (first >= 0 ? w[first] : 0.0f);
}

}  // namespace switchyard::parallel_test
