#include "engine/core/tensor.h"

#include <numeric>

#include <gtest/gtest.h>

namespace switchyard {
namespace {

std::vector<float> Iota(int64_t n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.0f);
  return v;
}

TEST(TensorTest, EmptyZerosAndMetadata) {
  Tensor t = Tensor::Zeros({2, 3, 4}, DType::kF32);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.dim(-1), 4);
  EXPECT_EQ(t.row_size(), 12);
  EXPECT_EQ(t.DebugString(), "Tensor(f32, (2, 3, 4), cpu)");
  for (float x : t.ToVector<float>()) EXPECT_EQ(x, 0.0f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u);
  EXPECT_FALSE(Tensor().defined());
  EXPECT_EQ(Tensor::Empty({0, 5}, DType::kBF16).numel(), 0);
}

TEST(TensorTest, SliceReshapeAndViewShareStorage) {
  Tensor t = Tensor::FromVector(Iota(12), {4, 3});
  Tensor rows = t.Slice(1, 3);  // rows 1 and 2
  EXPECT_EQ(rows.shape(), (Shape{2, 3}));
  EXPECT_EQ(rows.ToVector<float>(), (std::vector<float>{3, 4, 5, 6, 7, 8}));
  EXPECT_TRUE(rows.SharesStorageWith(t));
  rows.data<float>()[0] = 100;  // writes through to t[1, 0]
  EXPECT_EQ(t.data<float>()[3], 100);

  Tensor flat = t.Reshape({12});
  EXPECT_EQ(flat.data<float>()[3], 100);
  Tensor nested = rows.Slice(1, 2).Reshape({3});  // t[2, :]
  EXPECT_EQ(nested.ToVector<float>(), (std::vector<float>{6, 7, 8}));
  Tensor view = t.View({2, 2}, 5);
  EXPECT_EQ(view.ToVector<float>(), (std::vector<float>{5, 6, 7, 8}));
  EXPECT_EQ(t.Slice(4, 4).numel(), 0);
}

TEST(TensorTest, CloneAndCopyAreDeep) {
  Tensor t = Tensor::FromVector<int64_t>({1, 2, 3, 4}, {2, 2});
  Tensor c = t.Clone();
  EXPECT_FALSE(c.SharesStorageWith(t));
  c.data<int64_t>()[0] = 9;
  EXPECT_EQ(t.data<int64_t>()[0], 1);
  Tensor dst = Tensor::Zeros({4}, DType::kI64);
  dst.CopyFrom(t);
  EXPECT_EQ(dst.ToVector<int64_t>(), (std::vector<int64_t>{1, 2, 3, 4}));
  dst.Slice(1, 3).SetZero();
  EXPECT_EQ(dst.ToVector<int64_t>(), (std::vector<int64_t>{1, 0, 0, 4}));
}

TEST(TensorTest, AllocatorCountsBytesInUse) {
  Allocator* cpu = GetAllocator(Device::Cpu());
  size_t before = cpu->stats().in_use;
  {
    Tensor a = Tensor::Empty({1000}, DType::kF32);
    Tensor view = a.Slice(10, 20);
    a = Tensor();  // the view keeps the buffer alive
    EXPECT_EQ(cpu->stats().in_use, before + 4000);
  }
  EXPECT_EQ(cpu->stats().in_use, before);
  EXPECT_GE(cpu->stats().peak, before + 4000);
}

TEST(TensorDeathTest, MisuseIsAnInvariantViolation) {
  Tensor t = Tensor::Zeros({4, 3}, DType::kF32);
  EXPECT_DEATH(t.Slice(2, 5), R"(Slice \[2, 5\) of \(4, 3\))");
  EXPECT_DEATH(t.Reshape({5}), "Reshape");
  EXPECT_DEATH(t.data<int32_t>(), "tensor is f32, asked for i32");
  Tensor other = Tensor::Zeros({3}, DType::kF32);
  EXPECT_DEATH(other.CopyFrom(t), "CopyFrom");
}

}  // namespace
}  // namespace switchyard

namespace switchyard {
namespace {

TEST(CpuAllocatorTest, ReusesLargeFreedBlocks) {
  Allocator* cpu = GetAllocator(Device::Cpu());
  cpu->EmptyCache();
  void* first;
  {
    Tensor t = Tensor::Empty({1 << 20}, DType::kF32);  // 4 MiB: cached on free
    first = t.raw_data();
  }
  EXPECT_GE(cpu->stats().cached, size_t{4} << 20);
  Tensor again = Tensor::Empty({(1 << 20) - 1000}, DType::kF32);  // fits the cached block
  EXPECT_EQ(again.raw_data(), first);
  EXPECT_EQ(cpu->stats().cached, 0u);
  Tensor bigger = Tensor::Empty({3 << 20}, DType::kF32);  // 12 MiB: too big, a new block
  EXPECT_NE(bigger.raw_data(), first);
  cpu->EmptyCache();
}

}  // namespace
}  // namespace switchyard
