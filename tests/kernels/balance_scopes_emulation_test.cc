// The load-balancing loss's sequence and global scopes on the device
// (kernels/cuda/balance_loss_kernels.cuh: the parts' counts and column sums, the parts' mean
// aux and their gradient columns; the global scope's aux and column) run on the CPU, without
// a GPU, through the host model of CUDA in tests/kernels/cuda_emulation.h, with the .cu's
// launch shapes (256-thread grid-stride kernels, one thread for a value), against the CPU ops
// of kernels/balance_loss.h. Every one is bit-equal: the device does the CPU's operations in
// the CPU's order (integer counts in any order; each part's column added in double in row
// order; the values and columns in the host's double expressions).
#include "tests/kernels/routing_emulation.h"

namespace switchyard::kernels {
namespace {

using namespace routing_emulation;  // NOLINT: the shared helpers of routing_emulation.h

struct Group {
  int64_t T, E, k, part;  // part: part_tokens (the last part may be shorter)
  int64_t parts() const { return (T + part - 1) / part; }
  std::string Name() const {
    return "T=" + std::to_string(T) + " E=" + std::to_string(E) + " k=" + std::to_string(k) +
           " part " + std::to_string(part);
  }
};

const Group kGroups[] = {{8, 4, 1, 4}, {10, 4, 2, 4}, {300, 16, 2, 64},
                         {257, 33, 3, 100}, {64, 8, 2, 1}, {5, 7, 2, 5}};

// Router-like inputs: probs rows in [0, 1), indices skewed to low experts, a few outside
// [0, E) (which the counts' last entry takes).
struct Inputs {
  std::vector<float> probs;
  std::vector<int32_t> idx;
};

Inputs MakeInputs(const Group& g, uint64_t stream) {
  Inputs in;
  in.probs = Uniform(g.T * g.E, stream, 0.0f, 1.0f);
  const std::vector<float> u = Uniform(g.T * g.k, stream + 1, 0.0f, 1.0f);
  in.idx.resize(g.T * g.k);
  for (int64_t i = 0; i < g.T * g.k; ++i) in.idx[i] = static_cast<int32_t>(u[i] * u[i] * g.E);
  if (g.T * g.k > 7) in.idx[7] = static_cast<int32_t>(g.E);
  if (g.T * g.k > 3) in.idx[3] = -1;
  return in;
}

// The device's part counts (P, k E + 1) and column sums (P, E), as PartBalanceSums launches.
void RunPartSums(const Group& g, const Inputs& in, std::vector<int64_t>& counts,
                 std::vector<float>& sums) {
  const int64_t P = g.parts(), n = g.T * g.k;
  counts.assign(P * (g.k * g.E + 1), 0);  // the .cu's memset
  sums.assign(P * g.E, kNaN);
  Launch(GridFor(n), kThreads, [&] {
    bl::PartSlotCountsKernel(in.idx.data(), n, g.k, g.E, g.part,
                             reinterpret_cast<unsigned long long*>(counts.data()));
  });
  Launch(GridFor(P * g.E), kThreads, [&] {
    bl::PartColumnSumsKernel(in.probs.data(), g.T, g.E, g.part, P, sums.data());
  });
}

TEST(BalanceScopesEmulationTest, PartSumsValueAndColumnsEqualTheCpu) {
  const float coef = 0.01f, grad = 0.37f;
  uint64_t stream = 4100;
  for (const Group& g : kGroups) {
    const std::string name = g.Name();
    const Inputs in = MakeInputs(g, stream += 10);
    const int64_t P = g.parts(), width = g.k * g.E + 1;
    std::vector<int64_t> counts;
    std::vector<float> sums;
    RunPartSums(g, in, counts, sums);
    Tensor want_counts = Tensor::Empty({P, width}, DType::kI64);
    Tensor want_sums = Tensor::Empty({P, g.E}, DType::kF32);
    PartBalanceSums(Tensor::FromVector(in.probs, {g.T, g.E}),
                    Tensor::FromVector(in.idx, {g.T, g.k}), g.part, want_counts, want_sums);
    ExpectBits(counts, want_counts.ToVector<int64_t>(), name + " counts");
    ExpectBits(sums, want_sums.ToVector<float>(), name + " prob sums");
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    EXPECT_EQ(total, g.T * g.k) << name << ": every slot counted once";

    // The parts' mean aux.
    double value = std::numeric_limits<double>::quiet_NaN();
    RunOneThread([&] {
      bl::PartBalanceValueKernel(counts.data(), sums.data(), g.T, g.part, P, g.E, g.k, coef,
                                 &value);
    });
    Tensor want_value = Tensor::Empty({1}, DType::kF64);
    PartBalanceValueInto(want_counts, want_sums, g.T, g.part, g.k, coef, want_value);
    EXPECT_EQ(value, want_value.ToVector<double>()[0]) << name << " value";
    EXPECT_GT(value, 0.0) << name;

    // The parts' columns on their rows, both writes (kSet over NaN, never read).
    std::vector<float> cols(P * g.E, kNaN);
    const float part_grad = static_cast<float>(static_cast<double>(grad) / P);  // the .cu's
    Launch(GridFor(P * g.E), kThreads, [&] {
      bl::PartBalanceColumnsKernel(counts.data(), g.T, g.part, P, g.E, g.k, coef, part_grad,
                                   cols.data());
    });
    for (const Write write : {Write::kAdd, Write::kSet}) {
      const bool set = write == Write::kSet;
      const int64_t n = g.T * g.E;
      const std::vector<float> start =
          set ? std::vector<float>(n, kNaN) : Uniform(n, stream + 5, -1.0f, 1.0f);
      std::vector<float> got = start;
      Launch(GridFor(n), kThreads, [&] {
        bl::AddPartColumnsKernel(got.data(), cols.data(), n, g.E, g.part, write);
      });
      Tensor want = Tensor::FromVector(start, {g.T, g.E});
      AddPartBalanceColumns(want, want_counts, g.part, g.k, coef, grad, write);
      ExpectBits(got, want.ToVector<float>(), name + (set ? " columns kSet" : " columns"));
    }
  }
}

// The sequence scope is P group-scope losses averaged: on the device a part's column is the
// group kernel's (BalanceColumnKernel) for that part's counts and rows with grad / P, and the
// parts' value is the mean of the group kernel's (BalanceValuesKernel) values, bit for bit.
TEST(BalanceScopesEmulationTest, APartIsAGroupOfItsOwn) {
  const float coef = 0.01f, grad = 0.5f;
  for (const Group& g : {Group{300, 16, 2, 64}, Group{257, 33, 3, 100}}) {
    const Inputs in = MakeInputs(g, 4300 + g.T);
    const int64_t P = g.parts(), width = g.k * g.E + 1;
    std::vector<int64_t> counts;
    std::vector<float> sums;
    RunPartSums(g, in, counts, sums);
    const float part_grad = static_cast<float>(static_cast<double>(grad) / P);
    std::vector<float> cols(P * g.E, kNaN);
    Launch(GridFor(P * g.E), kThreads, [&] {
      bl::PartBalanceColumnsKernel(counts.data(), g.T, g.part, P, g.E, g.k, coef, part_grad,
                                   cols.data());
    });
    double value = 0.0;
    RunOneThread([&] {
      bl::PartBalanceValueKernel(counts.data(), sums.data(), g.T, g.part, P, g.E, g.k, coef,
                                 &value);
    });
    double mean = 0.0;
    for (int64_t p = 0; p < P; ++p) {
      const int64_t rows = std::min(g.T, (p + 1) * g.part) - p * g.part;
      std::vector<float> col(g.E, kNaN);
      Launch(GridFor(g.E), kThreads, [&] {
        bl::BalanceColumnKernel(counts.data() + p * width, g.E, g.k, rows, coef, part_grad,
                                col.data());
      });
      ExpectBits(std::vector<float>(cols.begin() + p * g.E, cols.begin() + (p + 1) * g.E), col,
                 g.Name() + " part " + std::to_string(p));
      std::vector<double> values(g.E + 2, 0.0);
      RunOneThread([&] {
        bl::BalanceValuesKernel(counts.data() + p * width, sums.data() + p * g.E, g.E, g.k, rows,
                                coef, values.data());
      });
      mean += values[0];
    }
    EXPECT_EQ(value, static_cast<double>(static_cast<float>(mean / P))) << g.Name();
  }
}

TEST(BalanceScopesEmulationTest, GlobalValueAndColumnEqualTheCpu) {
  const float coef = 0.01f, grad = 0.37f;
  uint64_t stream = 4500;
  for (const Group& g : kGroups) {
    const std::string name = g.Name();
    std::vector<float> load = Uniform(g.E, stream += 10, 0.0f, 1.0f);
    const std::vector<float> sums = Uniform(g.E, stream + 1, 0.0f, static_cast<float>(g.T));
    double value = std::numeric_limits<double>::quiet_NaN();
    RunOneThread([&] {
      bl::GlobalBalanceValueKernel(load.data(), sums.data(), g.E, g.T, coef, &value);
    });
    const Tensor load_t = Tensor::FromVector(load, {g.E});
    Tensor want_value = Tensor::Empty({1}, DType::kF64);
    GlobalBalanceValueInto(load_t, Tensor::FromVector(sums, {g.E}), g.T, coef, want_value);
    EXPECT_EQ(value, want_value.ToVector<double>()[0]) << name << " value";

    std::vector<float> col(g.E, kNaN);
    Launch(GridFor(g.E), kThreads, [&] {
      bl::GlobalBalanceColumnKernel(load.data(), g.E, g.T, coef, grad, col.data());
    });
    for (const Write write : {Write::kAdd, Write::kSet}) {
      const bool set = write == Write::kSet;
      const int64_t n = g.T * g.E;
      const std::vector<float> start =
          set ? std::vector<float>(n, kNaN) : Uniform(n, stream + 2, -1.0f, 1.0f);
      std::vector<float> got = start;
      Launch(GridFor(n), kThreads,
             [&] { bl::AddColumnKernel(got.data(), col.data(), n, g.E, write); });
      Tensor want = Tensor::FromVector(start, {g.T, g.E});
      AddGlobalBalanceColumn(want, load_t, g.T, coef, grad, write);
      ExpectBits(got, want.ToVector<float>(), name + (set ? " column kSet" : " column"));
    }
  }
  // No tokens: no value, and kSet's zeros.
  Tensor value = Tensor::Empty({1}, DType::kF64);
  GlobalBalanceValueInto(Tensor::FromVector(std::vector<float>{0.5f, 0.5f}, {2}),
                         Tensor::FromVector(std::vector<float>{0.0f, 0.0f}, {2}), 0, 0.01f,
                         value);
  EXPECT_EQ(value.ToVector<double>()[0], 0.0);
  Tensor none = Tensor::FromVector(std::vector<float>(4, kNaN), {2, 2});
  AddGlobalBalanceColumn(none, Tensor::FromVector(std::vector<float>{0.5f, 0.5f}, {2}), 0,
                         0.01f, 1.0f, Write::kSet);
  EXPECT_EQ(none.ToVector<float>(), std::vector<float>(4, 0.0f));
}

}  // namespace
}  // namespace switchyard::kernels
