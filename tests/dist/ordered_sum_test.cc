// The canonical pairwise-tree sum (engine/dist/ordered_sum.h): its shape, its layout
// property (D ranks x A leaves, A a power of two, equals the tree over all D * A leaves),
// TreeAccumulator against it, and OrderedAllReduce / AllReduceDoubles under mpirun with 2,
// 4 and 8 ranks against the tree of every rank's values computed locally. Every comparison
// is bitwise: each rank regenerates the other ranks' values from (seed, rank, index).
//
// Between collectives only EXPECT_* (never ASSERT_*): every rank must reach every call.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"
#include "engine/dist/ordered_sum.h"
#include "engine/dist/process.h"

namespace switchyard::dist {
namespace {

// ---- Values whose sums depend on the order ------------------------------------------------

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A value of element i on `rank` under `seed`: a random sign and mantissa times 2^e with
// e in [-12, 12], so that rounding (and so the order of a sum) shows in the low bits.
template <typename T>
T Value(uint64_t seed, int rank, int64_t i) {
  const uint64_t bits = SplitMix64(SplitMix64(seed * 1000003 + rank) ^ static_cast<uint64_t>(i));
  const T mantissa = static_cast<T>(1) + static_cast<T>(bits >> 11) * static_cast<T>(0x1p-53);
  const int exponent = static_cast<int>((bits >> 3) % 25) - 12;
  const T sign = (bits & 1) ? static_cast<T>(-1) : static_cast<T>(1);
  return sign * std::ldexp(mantissa, exponent);
}

template <typename T>
Tensor Values(uint64_t seed, int rank, const Shape& shape) {
  std::vector<T> v(NumElements(shape));
  for (size_t i = 0; i < v.size(); ++i) v[i] = Value<T>(seed, rank, static_cast<int64_t>(i));
  return Tensor::FromVector(v, shape);
}

// The bit patterns of t's elements, to compare floats exactly (NaN-proof, -0 vs 0 too).
template <typename T>
std::vector<uint64_t> Bits(const Tensor& t) {
  std::vector<uint64_t> out;
  for (T v : t.ToVector<T>()) {
    if constexpr (sizeof(T) == 4) {
      out.push_back(std::bit_cast<uint32_t>(v));
    } else {
      out.push_back(std::bit_cast<uint64_t>(v));
    }
  }
  return out;
}

// How many elements of a and b differ bitwise.
int64_t Differing(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  if (a.size() != b.size()) return -1;
  int64_t wrong = 0;
  for (size_t i = 0; i < a.size(); ++i) wrong += a[i] != b[i];
  return wrong;
}

// ---- The tree itself --------------------------------------------------------------------

// A sum that records its parenthesisation: "((0+1)+2)".
struct Expr {
  std::string text;
  Expr operator+(const Expr& other) const { return {"(" + text + "+" + other.text + ")"}; }
};

std::string TreeOf(int m) {
  std::vector<Expr> leaves;
  for (int i = 0; i < m; ++i) leaves.push_back({std::to_string(i)});
  return PairwiseTreeSum<Expr>(leaves).text;
}

TEST(PairwiseTreeSumTest, Shape) {
  EXPECT_EQ(TreeOf(0), "");
  EXPECT_EQ(TreeOf(1), "0");
  EXPECT_EQ(TreeOf(2), "(0+1)");
  EXPECT_EQ(TreeOf(3), "((0+1)+2)");
  EXPECT_EQ(TreeOf(4), "((0+1)+(2+3))");
  EXPECT_EQ(TreeOf(5), "(((0+1)+(2+3))+4)");
  EXPECT_EQ(TreeOf(6), "(((0+1)+(2+3))+(4+5))");
  EXPECT_EQ(TreeOf(7), "(((0+1)+(2+3))+((4+5)+6))");
  EXPECT_EQ(TreeOf(8), "(((0+1)+(2+3))+((4+5)+(6+7)))");
}

// The tree of D rank sums, each the tree of A consecutive leaves; bitwise the tree of all.
template <typename T>
void CheckLayoutProperty(int d, int a, uint64_t seed) {
  std::vector<T> all, per_rank;
  for (int r = 0; r < d; ++r) {
    std::vector<T> mine;
    for (int j = 0; j < a; ++j) mine.push_back(Value<T>(seed, r, j));
    all.insert(all.end(), mine.begin(), mine.end());
    per_rank.push_back(PairwiseTreeSum<T>(mine));
  }
  const T whole = PairwiseTreeSum<T>(all), layered = PairwiseTreeSum<T>(per_rank);
  using Word = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  EXPECT_EQ(std::bit_cast<Word>(whole), std::bit_cast<Word>(layered))
      << "D " << d << " A " << a << " seed " << seed << ": " << whole << " vs " << layered;
}

TEST(PairwiseTreeSumTest, RanksOfPowerOfTwoLeavesEqualOneRank) {
  for (int d : {1, 2, 3, 5, 6, 7, 8, 12}) {
    for (int a : {1, 2, 4, 8, 16}) {
      for (uint64_t seed = 0; seed < 20; ++seed) {
        CheckLayoutProperty<float>(d, a, seed);
        CheckLayoutProperty<double>(d, a, seed);
      }
    }
  }
  // The same symbolically: the parenthesisation itself is the same.
  for (int d : {3, 5, 6, 7}) {
    for (int a : {2, 4, 8}) {
      std::vector<Expr> all, per_rank;
      for (int r = 0; r < d; ++r) {
        std::vector<Expr> mine;
        for (int j = 0; j < a; ++j) mine.push_back({std::to_string(r * a + j)});
        all.insert(all.end(), mine.begin(), mine.end());
        per_rank.push_back(PairwiseTreeSum<Expr>(mine));
      }
      EXPECT_EQ(PairwiseTreeSum<Expr>(all).text, PairwiseTreeSum<Expr>(per_rank).text)
          << "D " << d << " A " << a;
    }
  }
}

// The values above do expose the order: a left-to-right sum, or ranks of 3 leaves, differ
// from the tree (so the test above could fail).
TEST(PairwiseTreeSumTest, OtherOrdersDiffer) {
  int sequential_differs = 0, three_differs = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::vector<float> leaves;
    for (int i = 0; i < 12; ++i) leaves.push_back(Value<float>(seed, 0, i));
    float sequential = 0;
    for (float v : leaves) sequential += v;
    sequential_differs += sequential != PairwiseTreeSum<float>(leaves);
    std::vector<float> per_rank;
    for (int r = 0; r < 4; ++r) {
      per_rank.push_back(PairwiseTreeSum<float>(std::span<const float>(leaves).subspan(3 * r, 3)));
    }
    three_differs += PairwiseTreeSum<float>(per_rank) != PairwiseTreeSum<float>(leaves);
  }
  EXPECT_GT(sequential_differs, 0);
  EXPECT_GT(three_differs, 0);
}

// ---- TreeAccumulator --------------------------------------------------------------------

// The accumulator over m leaves of (3, 5) equals PairwiseTreeSum per element, bitwise.
template <typename T>
void CheckAccumulator(TreeAccumulator& acc, int m, uint64_t seed) {
  acc.Reset();
  std::vector<Tensor> leaves;
  for (int j = 0; j < m; ++j) leaves.push_back(Values<T>(seed, j, {3, 5}));
  for (const Tensor& leaf : leaves) acc.Add(leaf);
  EXPECT_EQ(acc.count(), m);
  Tensor result = acc.Result();
  std::vector<T> want(15);
  for (int64_t i = 0; i < 15; ++i) {
    std::vector<T> column;
    for (const Tensor& leaf : leaves) column.push_back(leaf.data<T>()[i]);
    want[i] = PairwiseTreeSum<T>(column);
  }
  EXPECT_EQ(Differing(Bits<T>(result), Bits<T>(Tensor::FromVector(want, {3, 5}))), 0)
      << "m " << m;
}

TEST(TreeAccumulatorTest, EqualsPairwiseTreeSum) {
  TreeAccumulator acc;
  for (int m = 1; m <= 17; ++m) CheckAccumulator<float>(acc, m, 100 + m);
  TreeAccumulator acc64;
  for (int m : {1, 2, 3, 6, 7, 13}) CheckAccumulator<double>(acc64, m, 200 + m);
}

TEST(TreeAccumulatorTest, ResultIsACopyAndLeavesAreCopied) {
  TreeAccumulator acc;
  Tensor leaf = Tensor::FromVector(std::vector<float>{1, 2}, {2});
  acc.Add(leaf);
  leaf.data<float>()[0] = 100;  // the accumulator copied the leaf
  Tensor one = acc.Result();
  EXPECT_EQ(one.ToVector<float>(), (std::vector<float>{1, 2}));
  acc.Add(leaf);
  acc.Add(leaf);
  Tensor three = acc.Result();
  EXPECT_EQ(three.ToVector<float>(), (std::vector<float>{201, 6}));
  EXPECT_EQ(one.ToVector<float>(), (std::vector<float>{1, 2}));  // not overwritten
  acc.Reset();
  EXPECT_EQ(acc.count(), 0);
  // Leaves of another shape after Reset.
  acc.Add(Tensor::FromVector(std::vector<float>{1, 2, 3}, {3}));
  EXPECT_EQ(acc.Result().ToVector<float>(), (std::vector<float>{1, 2, 3}));
}

// ---- Over ranks -------------------------------------------------------------------------

class OrderedSumTest : public testing::Test {
 protected:
  void SetUp() override { world_ = WorldCommunicator(); }
  void TearDown() override { world_.reset(); }

  std::unique_ptr<Communicator> world_;
};

// The tree over the ranks of comm (in rank order) of Values<T>(seed, world rank, shape).
template <typename T>
Tensor ExpectedSum(const Communicator& comm, uint64_t seed, const Shape& shape) {
  TreeAccumulator acc;
  for (int w : comm.world_ranks()) acc.Add(Values<T>(seed, w, shape));
  return acc.Result();
}

// Every rank's t is the same, bitwise (gathered as raw bits over comm).
template <typename T>
void ExpectSameOnEveryRank(Communicator& comm, const Tensor& t, const std::string& what) {
  const int64_t n = t.numel();
  if (n == 0) return;
  std::vector<uint64_t> bits = Bits<T>(t);
  Tensor mine = Tensor::FromVector(std::vector<int64_t>(bits.begin(), bits.end()), {1, n});
  Tensor all = Tensor::Zeros({comm.size(), n}, DType::kI64);
  comm.AllGather(mine, all);
  std::vector<int64_t> values = all.ToVector<int64_t>();
  int64_t wrong = 0;
  for (int r = 0; r < comm.size(); ++r) {
    for (int64_t i = 0; i < n; ++i) wrong += values[r * n + i] != values[i];
  }
  EXPECT_EQ(wrong, 0) << what << ": ranks disagree";
}

// OrderedAllReduce of this rank's values of `shape` over comm, checked against the local
// tree of every member's values and across ranks.
template <typename T>
void CheckOrderedAllReduce(Communicator& comm, uint64_t seed, const Shape& shape) {
  const std::string what = StrCat(DTypeName(DTypeOf<T>()), " ", ShapeString(shape), " over ",
                                  comm.size(), " ranks");
  Tensor t = Values<T>(seed, WorldRank(), shape);
  OrderedAllReduce(comm, t);
  EXPECT_EQ(t.shape(), shape) << what;
  EXPECT_EQ(Differing(Bits<T>(t), Bits<T>(ExpectedSum<T>(comm, seed, shape))), 0) << what;
  ExpectSameOnEveryRank<T>(comm, t, what);
}

TEST_F(OrderedSumTest, EqualsTheLocalTreeOfEveryRank) {
  const int n = world_->size();
  const std::vector<Shape> shapes = {{1000}, {3, 5, 7}, {n}, {n + 1}, {n - 1}, {2 * n + 1},
                                     {1}, {}, {0}, {0, 4}, {1003}};
  uint64_t seed = 1;
  for (const Shape& shape : shapes) {
    CheckOrderedAllReduce<float>(*world_, seed++, shape);
    CheckOrderedAllReduce<double>(*world_, seed++, shape);
  }
}

// Sub-groups of three consecutive ranks (the last shorter): D = 3 is not a power of two.
TEST_F(OrderedSumTest, SubGroupsOfThree) {
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < world_->size(); r += 3) {
    groups.emplace_back();
    for (int k = r; k < std::min(r + 3, world_->size()); ++k) groups.back().push_back(k);
  }
  std::unique_ptr<Communicator> three = world_->Split(groups);
  CheckOrderedAllReduce<float>(*three, 7, {257});
  CheckOrderedAllReduce<double>(*three, 8, {2, 2});
}

// dp ranks each summing A = 4 micro-batch leaves, then OrderedAllReduce, equal one rank
// summing all dp * 4 leaves in order: the gradient accumulation the trainer does.
TEST_F(OrderedSumTest, MicroBatchesOverRanksEqualOneRank) {
  const int n = world_->size(), me = world_->rank();
  constexpr int kLeaves = 4;
  const Shape shape = {11, 3};
  auto leaf = [&](int rank, int j) { return Values<float>(50 + j, rank, shape); };
  TreeAccumulator local;
  for (int j = 0; j < kLeaves; ++j) local.Add(leaf(me, j));
  Tensor t = local.Result();
  OrderedAllReduce(*world_, t);
  TreeAccumulator one_rank;
  for (int r = 0; r < n; ++r) {
    for (int j = 0; j < kLeaves; ++j) one_rank.Add(leaf(r, j));
  }
  EXPECT_EQ(Differing(Bits<float>(t), Bits<float>(one_rank.Result())), 0);
}

TEST_F(OrderedSumTest, AsyncWaitedInReverseOrder) {
  const int me = world_->rank();
  Tensor a = Values<float>(20, me, {4, 33});
  Tensor b = Values<double>(21, me, {5});
  Tensor c = Values<float>(22, me, {1});
  std::vector<std::unique_ptr<Work>> works;
  works.push_back(OrderedAllReduceAsync(*world_, a));
  works.push_back(OrderedAllReduceAsync(*world_, b));
  works.push_back(OrderedAllReduceAsync(*world_, c));
  for (int i = 2; i >= 0; --i) works[i]->Wait();
  for (auto& work : works) work->Wait();  // idempotent
  EXPECT_EQ(Differing(Bits<float>(a), Bits<float>(ExpectedSum<float>(*world_, 20, {4, 33}))), 0);
  EXPECT_EQ(Differing(Bits<double>(b), Bits<double>(ExpectedSum<double>(*world_, 21, {5}))),
            0);
  EXPECT_EQ(Differing(Bits<float>(c), Bits<float>(ExpectedSum<float>(*world_, 22, {1}))), 0);
  // A Work destroyed without Wait finishes in its destructor.
  Tensor d = Values<float>(23, me, {9});
  OrderedAllReduceAsync(*world_, d).reset();
  EXPECT_EQ(Differing(Bits<float>(d), Bits<float>(ExpectedSum<float>(*world_, 23, {9}))), 0);
}

TEST_F(OrderedSumTest, AllReduceDoublesIsTheTreeOnEveryRank) {
  const int n = world_->size(), me = world_->rank();
  std::vector<double> mine;
  for (int i = 0; i < 5; ++i) mine.push_back(Value<double>(30, me, i));
  const std::vector<double> sums = AllReduceDoubles(*world_, mine);
  EXPECT_EQ(sums.size(), 5u);
  Tensor got = Tensor::FromVector(sums, {5});
  std::vector<double> want(5);
  for (int i = 0; i < 5; ++i) {
    std::vector<double> column;
    for (int r = 0; r < n; ++r) column.push_back(Value<double>(30, r, i));
    want[i] = TreeSumDoubles(column);
  }
  EXPECT_EQ(Differing(Bits<double>(got), Bits<double>(Tensor::FromVector(want, {5}))), 0);
  ExpectSameOnEveryRank<double>(*world_, got, "AllReduceDoubles");
  EXPECT_TRUE(AllReduceDoubles(*world_, {}).empty());
}

}  // namespace
}  // namespace switchyard::dist
