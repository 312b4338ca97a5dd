// The activation family's device code run on the CPU, without a GPU, through the host model
// of CUDA in tests/kernels/cuda_emulation.h, with the .cu files' launch shapes:
//  - kernels/cuda/activation_kernels.cuh (activation.cu): gelu, relu and swiglu forward and
//    backward, 256-thread blocks, GridFor(n) of them;
//  - kernels/cuda/bias_kernels.cuh (bias.cu's forward): the bias add over rows (one bias,
//    host-counted groups, device offsets) and bias + gelu / swiglu fused (one bias over
//    GridFor(total) blocks; grouped over RowLaunchOf's grid), with f32 or bf16 h and the
//    bf16 kept pre-activations.
//
// The device's expf is the one thing the kernels do not share with the CPU reference
// (kernels/cuda/activation_math.cuh), so the test runs them with two exps:
//  - the CPU's own VecExp (kernels/cpu/vec_math.h): then every output must be the CPU op's
//    bits (a, h, h16, the kept tensors, the gradients), which checks the indexing and that
//    the device evaluates the CPU's expression in its order;
//  - the C library's expf (another exp, within 1 ulp as CUDA's is within 2): then within the
//    bounds tests/gpu/activation_gpu_test.cc holds the GPU to (derived there), and each fused
//    kernel the bits of the unfused kernels it replaces (the contract on one device).
// Shapes: 1, 77, 1000, 4099 elements (not multiples of the block or the warp), special
// values (signed zeros, infinities, NaN, huge, denormal); rows of 1, 5, 33, 77, 300, 1000
// columns; groups empty first, in the middle and last, no rows at all, no groups, nine groups
// (the binary search), rows past offsets[G] (left as they were by the bias add; the fused
// forward gives them the activation of their a, unbiased, as the CPU); grids smaller than the
// rows and columns (the grid-stride loops); in place. Buffers are exact-size vectors, outputs
// filled with NaN first.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/dtype.h"
#include "engine/core/philox.h"
#include "engine/core/tensor.h"
#include "kernels/activation.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/random.h"
// Last: the host model defines CUDA's qualifiers as macros.
#include "tests/kernels/cuda_emulation.h"

namespace switchyard::kernels::cuda {
// The kernels' expf (found before the C library's by their unqualified calls): the CPU
// reference's VecExp, or the C library's expf.
inline bool exp_is_vec_exp = true;
inline float expf(float x) { return exp_is_vec_exp ? cpu::VecExp(x) : ::expf(x); }
}  // namespace switchyard::kernels::cuda

#include "kernels/cuda/activation_math.cuh"
#include "kernels/cuda/activation_kernels.cuh"
#include "kernels/cuda/bias_kernels.cuh"

namespace switchyard::kernels {
namespace {

namespace act = cuda::activation;
namespace bf = cuda::bias_fwd;
using Bf16 = BFloat16;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// While alive, the kernels' expf is the C library's.
struct LibraryExp {
  LibraryExp() { cuda::exp_is_vec_exp = false; }
  ~LibraryExp() { cuda::exp_is_vec_exp = true; }
};

std::vector<float> Uniform(int64_t n, uint64_t stream, float lo, float hi) {
  Tensor t = Tensor::Empty({n}, DType::kF32);
  FillUniform(t, RngKey{43, stream}, 0, lo, hi);
  return t.ToVector<float>();
}

// Uniform in [-8, 8] with the special values first.
std::vector<float> WithSpecials(int64_t n, uint64_t stream) {
  std::vector<float> x = Uniform(n, stream, -8.0f, 8.0f);
  const float special[] = {0.0f,    -0.0f,  INFINITY, -INFINITY, kNaN, 1e30f,
                           -1e30f, 1e-40f, -0.75f,   20.0f,     -20.0f};
  for (size_t i = 0; i < std::size(special) && i < x.size(); ++i) x[i] = special[i];
  return x;
}

Tensor HostTensor(const std::vector<float>& v, const Shape& shape) {
  return Tensor::FromVector(v, shape);
}

// The .cu's elementwise grid.
unsigned GridFor(int64_t n) { return cuda::GridFor(n, act::kThreads); }

template <typename Kernel>
void Elementwise(unsigned blocks, Kernel kernel) {
  unsigned char unused_smem[1];
  emu::Launch(EmuDim3{blocks, 1, 1}, act::kThreads, unused_smem, 0, 0, kernel);
}

template <typename Kernel>
void RowWise(const bf::RowLaunch& l, Kernel kernel) {
  unsigned char unused_smem[1];
  emu::Launch(EmuDim3{l.blocks_x, l.blocks_y, 1}, l.threads, unused_smem, 0, 0, kernel);
}

bool SameBits(float a, float b) {
  return std::memcmp(&a, &b, 4) == 0 || (std::isnan(a) && std::isnan(b));
}
bool SameBits(Bf16 a, Bf16 b) {
  return a.bits == b.bits || (std::isnan(float(a)) && std::isnan(float(b)));
}

// got and want element for element: the same bits, or both NaN.
template <typename T>
void ExpectSameBits(const std::vector<T>& got, const std::vector<T>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!SameBits(got[i], want[i])) {
      ADD_FAILURE() << what << ": element " << i << " is " << float(got[i]) << ", expected "
                    << float(want[i]);
      return;
    }
  }
}

// ---- the elementwise kernels -------------------------------------------------------------

// x: the activation's input (swiglu's a), b: swiglu's gate input, dy: the gradient.
struct Inputs {
  std::vector<float> x, b, dy;
};

// One op of activation.cu: the CPU op on host tensors of its inputs (its outputs appended),
// and its kernel on pointers; outputs: 1, or 2 for swiglu's (da, db). In place, the first
// output overwrites input `alias` (0: x, 2: dy), as the layers run them.
struct Op {
  const char* name;
  int outputs, alias;
  std::function<void(const Tensor& x, const Tensor& b, const Tensor& dy, Tensor& o0, Tensor& o1)>
      cpu;
  std::function<void(const float* x, const float* b, const float* dy, float* o0, float* o1,
                     int64_t n)>
      kernel;
};

std::vector<Op> ElementwiseOps() {
  return {
      {"GeluForward", 1, 0,
       [](const Tensor& x, const Tensor&, const Tensor&, Tensor& y, Tensor&) { GeluForward(x, y); },
       [](const float* x, const float*, const float*, float* y, float*, int64_t n) {
         act::GeluForwardKernel(x, y, n);
       }},
      {"GeluBackward", 1, 2,
       [](const Tensor& x, const Tensor&, const Tensor& dy, Tensor& dx, Tensor&) {
         GeluBackward(x, dy, dx);
       },
       [](const float* x, const float*, const float* dy, float* dx, float*, int64_t n) {
         act::GeluBackwardKernel(x, dy, dx, n);
       }},
      {"ReluForward", 1, 0,
       [](const Tensor& x, const Tensor&, const Tensor&, Tensor& y, Tensor&) { ReluForward(x, y); },
       [](const float* x, const float*, const float*, float* y, float*, int64_t n) {
         act::ReluForwardKernel(x, y, n);
       }},
      {"ReluBackward", 1, 2,
       [](const Tensor& x, const Tensor&, const Tensor& dy, Tensor& dx, Tensor&) {
         ReluBackward(x, dy, dx);
       },
       [](const float* x, const float*, const float* dy, float* dx, float*, int64_t n) {
         act::ReluBackwardKernel(x, dy, dx, n);
       }},
      {"SwigluForward", 1, 0,
       [](const Tensor& a, const Tensor& b, const Tensor&, Tensor& out, Tensor&) {
         SwigluForward(a, b, out);
       },
       [](const float* a, const float* b, const float*, float* out, float*, int64_t n) {
         act::SwigluForwardKernel(a, b, out, n);
       }},
      {"SwigluBackward", 2, 2,
       [](const Tensor& a, const Tensor& b, const Tensor& g, Tensor& da, Tensor& db) {
         SwigluBackward(a, b, g, da, db);
       },
       [](const float* a, const float* b, const float* g, float* da, float* db, int64_t n) {
         act::SwigluBackwardKernel(a, b, g, da, db, n);
       }},
  };
}

// The CPU op's outputs.
std::vector<std::vector<float>> OnCpu(const Op& op, const Inputs& in) {
  const int64_t n = static_cast<int64_t>(in.x.size());
  Tensor o0 = Tensor::Empty({n}, DType::kF32), o1 = Tensor::Empty({n}, DType::kF32);
  op.cpu(HostTensor(in.x, {n}), HostTensor(in.b, {n}), HostTensor(in.dy, {n}), o0, o1);
  std::vector<std::vector<float>> out = {o0.ToVector<float>()};
  if (op.outputs == 2) out.push_back(o1.ToVector<float>());
  return out;
}

// The kernel's outputs over `blocks` blocks (out of place, outputs NaN first; or in place).
std::vector<std::vector<float>> Emulated(const Op& op, const Inputs& in, unsigned blocks,
                                         bool in_place = false) {
  const int64_t n = static_cast<int64_t>(in.x.size());
  Inputs io = in;
  std::vector<float> o0(n, kNaN), o1(n, kNaN);
  float* first = o0.data();
  if (in_place) first = op.alias == 0 ? io.x.data() : io.dy.data();
  Elementwise(blocks, [&] {
    op.kernel(io.x.data(), io.b.data(), io.dy.data(), first, op.outputs == 2 ? o1.data() : nullptr,
              n);
  });
  if (in_place) o0 = op.alias == 0 ? io.x : io.dy;
  std::vector<std::vector<float>> out = {o0};
  if (op.outputs == 2) out.push_back(o1);
  return out;
}

void ExpectSameOutputs(const std::vector<std::vector<float>>& got,
                       const std::vector<std::vector<float>>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < got.size(); ++k) {
    ExpectSameBits(got[k], want[k], what + " output " + std::to_string(k));
  }
}

TEST(ActivationEmulationTest, ElementwiseKernelsGiveTheCpuBits) {
  uint64_t stream = 1;
  for (int64_t n : {1, 77, 1000, 4099}) {
    const Inputs in{WithSpecials(n, ++stream), Uniform(n, ++stream, -3.0f, 3.0f),
                    Uniform(n, ++stream, -1.0f, 1.0f)};
    for (const Op& op : ElementwiseOps()) {
      const std::string what = std::string(op.name) + " n " + std::to_string(n);
      const std::vector<std::vector<float>> want = OnCpu(op, in);
      ExpectSameOutputs(Emulated(op, in, GridFor(n)), want, what);
      ExpectSameOutputs(Emulated(op, in, GridFor(n), /*in_place=*/true), want, what + " in place");
      // Two blocks: each thread strides over several elements.
      if (n > 2 * act::kThreads) ExpectSameOutputs(Emulated(op, in, 2), want, what + ", 2 blocks");
    }
  }
}

// The backward kernels reading the kept bf16 inputs (bf16 activation storage) against the
// CPU op on the bf16 tensors: the bits of the f32 op on the widened values.
TEST(ActivationEmulationTest, BackwardKernelsReadKeptBf16Inputs) {
  uint64_t stream = 40;
  for (int64_t n : {1, 77, 4099}) {
    std::vector<Bf16> x16, b16;
    for (float v : WithSpecials(n, ++stream)) x16.push_back(Bf16(v));
    for (float v : Uniform(n, ++stream, -3.0f, 3.0f)) b16.push_back(Bf16(v));
    const std::vector<float> dy = Uniform(n, ++stream, -1.0f, 1.0f);
    const Tensor xt = Tensor::FromVector(x16, {n}), bt = Tensor::FromVector(b16, {n});
    const Tensor dyt = Tensor::FromVector(dy, {n});
    const std::string what = " n " + std::to_string(n);
    auto run = [&](auto kernel) {
      std::vector<float> o0(n, kNaN), o1(n, kNaN);
      Elementwise(GridFor(n), [&] { kernel(o0.data(), o1.data()); });
      return std::vector<std::vector<float>>{o0, o1};
    };
    Tensor w0 = Tensor::Empty({n}, DType::kF32), w1 = Tensor::Empty({n}, DType::kF32);
    GeluBackward(xt, dyt, w0);
    ExpectSameBits(run([&](float* o0, float*) {
                     act::GeluBackwardKernel(x16.data(), dy.data(), o0, n);
                   })[0],
                   w0.ToVector<float>(), "GeluBackward bf16 x" + what);
    ReluBackward(xt, dyt, w0);
    ExpectSameBits(run([&](float* o0, float*) {
                     act::ReluBackwardKernel(x16.data(), dy.data(), o0, n);
                   })[0],
                   w0.ToVector<float>(), "ReluBackward bf16 x" + what);
    SwigluBackward(xt, bt, dyt, w0, w1);
    const auto got = run([&](float* o0, float* o1) {
      act::SwigluBackwardKernel(x16.data(), b16.data(), dy.data(), o0, o1, n);
    });
    ExpectSameBits(got[0], w0.ToVector<float>(), "SwigluBackward bf16 da" + what);
    ExpectSameBits(got[1], w1.ToVector<float>(), "SwigluBackward bf16 db" + what);
    // The gradients written in bf16 (the products' operands): the f32 kernels' values rounded.
    {
      auto rounded = [](const std::vector<float>& v) {
        std::vector<Bf16> r;
        for (float x : v) r.push_back(cuda::ToBf16(x));
        return r;
      };
      std::vector<Bf16> h0(n, Bf16(kNaN)), h1(n, Bf16(kNaN));
      const auto f32 = run([&](float* o0, float*) {
        act::GeluBackwardKernel(x16.data(), dy.data(), o0, n);
      });
      Elementwise(GridFor(n), [&] { act::GeluBackwardKernel(x16.data(), dy.data(), h0.data(), n); });
      ExpectSameBits(h0, rounded(f32[0]), "GeluBackward bf16 dx" + what);
      const auto relu = run([&](float* o0, float*) {
        act::ReluBackwardKernel(x16.data(), dy.data(), o0, n);
      });
      Elementwise(GridFor(n), [&] { act::ReluBackwardKernel(x16.data(), dy.data(), h0.data(), n); });
      ExpectSameBits(h0, rounded(relu[0]), "ReluBackward bf16 dx" + what);
      Elementwise(GridFor(n), [&] {
        act::SwigluBackwardKernel(x16.data(), b16.data(), dy.data(), h0.data(), h1.data(), n);
      });
      ExpectSameBits(h0, rounded(got[0]), "SwigluBackward bf16 da out" + what);
      ExpectSameBits(h1, rounded(got[1]), "SwigluBackward bf16 db out" + what);
    }
    // And the CPU op on bf16 tensors is the f32 op on their widened values.
    std::vector<float> wide;
    for (Bf16 v : x16) wide.push_back(float(v));
    const Tensor xw = Tensor::FromVector(wide, {n});
    Tensor v0 = Tensor::Empty({n}, DType::kF32);
    GeluBackward(xw, dyt, v0);
    GeluBackward(xt, dyt, w0);
    ExpectSameBits(w0.ToVector<float>(), v0.ToVector<float>(), "CPU GeluBackward bf16 x" + what);
  }
}

// ---- the GPU tests' bounds, with the C library's expf -------------------------------------

constexpr double kActRel = 2e-6;     // gelu, swiglu, swiglu's db: relative
constexpr double kTiny = 1e-30;      // underflow to 0 against a denormal
constexpr double kOneUlps = 2.5e-7;  // two ulps of values just below 1
constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kGeluCubic = 0.044715;

double Sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// The bound for element i of `op`'s output k (see tests/gpu/activation_gpu_test.cc): relative
// for a value; for a gradient whose terms cancel, relative to the terms, plus 1 - s quantised.
double Bound(const Op& op, int k, const Inputs& in, size_t i, float want) {
  const double v = in.x[i], b = in.b[i], g = in.dy[i];
  const std::string name = op.name;
  if (name == "GeluBackward") {
    const double s = Sigmoid(2.0 * kSqrt2OverPi * (v + kGeluCubic * v * v * v));
    const double du = kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * v * v);
    const double term = 2.0 * v * s * (1.0 - s) * du;
    return std::fabs(g) * (kActRel * (s + std::fabs(term)) + kOneUlps * std::fabs(2 * v * du)) +
           kTiny;
  }
  if (name == "SwigluBackward" && k == 0) {
    const double s = Sigmoid(v), base = std::fabs(g * b * s);
    return base * (kActRel * (1.0 + std::fabs(v * (1.0 - s))) + kOneUlps * std::fabs(v)) + kTiny;
  }
  return kActRel * std::fabs(want) + kTiny;
}

TEST(ActivationEmulationTest, WithTheLibraryExpWithinTheGpuTestsBounds) {
  const LibraryExp library_exp;
  const int64_t n = 4099;
  const Inputs in{Uniform(n, 71, -8.0f, 8.0f), Uniform(n, 72, -3.0f, 3.0f),
                  Uniform(n, 73, -1.0f, 1.0f)};
  for (const Op& op : ElementwiseOps()) {
    const std::vector<std::vector<float>> want = OnCpu(op, in), got = Emulated(op, in, GridFor(n));
    for (size_t k = 0; k < want.size(); ++k) {
      double worst = 0.0;
      for (size_t i = 0; i < want[k].size(); ++i) {
        const double err = std::fabs(double(got[k][i]) - want[k][i]);
        const double bound = Bound(op, static_cast<int>(k), in, i, want[k][i]);
        ASSERT_LE(err, bound) << op.name << " output " << k << " element " << i << ": "
                              << got[k][i] << ", the CPU's " << want[k][i];
        worst = std::max(worst, err / bound);
      }
      std::printf("  %-16s output %zu: bound used %.3f\n", op.name, k, worst);
    }
  }
}

// ---- the bias add over rows --------------------------------------------------------------

// The groups' offsets (G + 1) from their row counts, as bias.cu computes them.
std::vector<int64_t> OffsetsOf(const std::vector<int64_t>& rows) {
  std::vector<int64_t> offsets(rows.size() + 1, 0);
  for (size_t g = 0; g < rows.size(); ++g) offsets[g + 1] = offsets[g] + rows[g];
  return offsets;
}

// Row groups and a tensor of their rows: host counts (past = 0) or device offsets, with
// `past` rows after offsets[G] that belong to no group.
struct GroupCase {
  std::vector<int64_t> rows;
  int64_t n, past;
  bool capped;  // a grid of (1, 5) blocks instead of RowLaunchOf's (the loops cover the rest)
};

const std::vector<GroupCase> kGroupCases = {
    {{3, 0, 70, 1}, 77, 6, false},             // empty group in the middle
    {{0, 5, 0, 0, 9, 2, 0, 4, 1, 0}, 33, 3, false},  // ten groups, empty ones first and last
    {{0, 0}, 5, 4, false},                     // no rows in any group
    {{}, 7, 3, false},                         // no groups
    {{1}, 1, 0, false},                        // one element
    {{40, 0, 37}, 300, 5, true},               // more rows and columns than the grid
};

bf::RowLaunch LaunchFor(const GroupCase& c, int64_t rows) {
  bf::RowLaunch l = bf::RowLaunchOf(rows, c.n);
  if (c.capped) l.blocks_x = 1, l.blocks_y = 5;
  return l;
}

std::string NameOf(const GroupCase& c, bool sized, int64_t total) {
  return std::string(sized ? "offsets" : "counts") + " (" + std::to_string(total) + ", " +
         std::to_string(c.n) + ") in " + std::to_string(c.rows.size()) + " groups";
}

TEST(ActivationEmulationTest, AddBiasGivesTheCpuBits) {
  uint64_t stream = 100;
  // One bias (offsets null): RowLaunchOf's grid, and one of (2, 3) blocks over 70 x 600.
  struct Flat {
    int64_t rows, n;
    bool capped;
  };
  for (const Flat& f : {Flat{1, 1, false}, Flat{5, 77, false}, Flat{3, 1000, false},
                        Flat{33, 31, false}, Flat{70, 600, true}}) {
    const std::vector<float> out0 = Uniform(f.rows * f.n, ++stream, -1.0f, 1.0f);
    const std::vector<float> bias = Uniform(f.n, ++stream, -1.0f, 1.0f);
    Tensor want = HostTensor(out0, {f.rows, f.n});
    AddBias(want, HostTensor(bias, {f.n}));
    std::vector<float> out = out0;
    bf::RowLaunch l = bf::RowLaunchOf(f.rows, f.n);
    if (f.capped) l.blocks_x = 2, l.blocks_y = 3;
    RowWise(l, [&] { bf::AddBiasKernel(out.data(), bias.data(), nullptr, 1, f.rows, f.n); });
    ExpectSameBits(out, want.ToVector<float>(),
                   "AddBias (" + std::to_string(f.rows) + ", " + std::to_string(f.n) + ")");
  }
  // Grouped: host counts (bias.cu's offsets from them) and device offsets with rows past.
  for (const GroupCase& c : kGroupCases) {
    const int64_t groups = static_cast<int64_t>(c.rows.size());
    const std::vector<int64_t> offsets = OffsetsOf(c.rows);
    const int64_t used = offsets.back();
    const std::vector<float> bias = Uniform(groups * c.n, ++stream, -1.0f, 1.0f);
    for (bool sized : {false, true}) {
      const int64_t total = used + (sized ? c.past : 0);
      const std::string what = "GroupedAddBias " + NameOf(c, sized, total);
      const std::vector<float> out0 = Uniform(total * c.n, ++stream, -1.0f, 1.0f);
      Tensor want = HostTensor(out0, {total, c.n});
      if (sized) {
        GroupedAddBias(want, Tensor::FromVector(offsets, {groups + 1}),
                       HostTensor(bias, {groups, c.n}));
      } else {
        GroupedAddBias(want, c.rows, HostTensor(bias, {groups, c.n}));
      }
      std::vector<float> out = out0;
      // bias.cu launches nothing for no elements, or (device offsets) no groups.
      if (total * c.n > 0 && groups > 0) {
        RowWise(LaunchFor(c, total), [&] {
          bf::AddBiasKernel(out.data(), bias.data(), offsets.data(), groups, total, c.n);
        });
      }
      ExpectSameBits(out, want.ToVector<float>(), what);
      const std::vector<float> tail(out.begin() + used * c.n, out.end());
      ExpectSameBits(tail, std::vector<float>(out0.begin() + used * c.n, out0.end()),
                     what + ": the rows past the groups");
    }
  }
}

// ---- bias + activation fused --------------------------------------------------------------

// What a fused forward writes: h in f32 or bf16, and which pre-activations it keeps in bf16.
struct Outputs {
  bool h16, kept_a, kept_b;
};
const std::vector<Outputs> kOutputs = {
    {false, false, false}, {true, true, true}, {true, false, false}, {false, true, false},
    {false, false, true}};

// One fused forward's inputs and results: a (rows, n) (written back unless kept), b for
// swiglu, and h (f32 or bf16), kept a, kept b.
struct Forward {
  std::vector<float> a, h;
  std::vector<Bf16> h16, kept_a, kept_b;
};

Forward Prepared(const std::vector<float>& a0, const Outputs& o) {
  const size_t n = a0.size();
  const Bf16 nan16(kNaN);
  Forward f{a0, {}, {}, {}, {}};
  if (o.h16) {
    f.h16.assign(n, nan16);
  } else {
    f.h.assign(n, kNaN);
  }
  if (o.kept_a) f.kept_a.assign(n, nan16);
  if (o.kept_b) f.kept_b.assign(n, nan16);
  return f;
}

bf::ForwardOut OutOf(Forward& f) {
  return bf::ForwardOut{f.h.empty() ? nullptr : f.h.data(),
                        f.h16.empty() ? nullptr : f.h16.data(),
                        f.kept_a.empty() ? nullptr : f.kept_a.data(),
                        f.kept_b.empty() ? nullptr : f.kept_b.data()};
}

// The fused forward as bias.cu's LaunchBiasAct runs it: four elements a thread when the row
// width and the arrays allow (counted in quad_launches), else one; `blocks` caps the grid
// (0: GridFor of the threads' items).
int quad_launches = 0;
template <int kAct>
void RunBiasAct(unsigned blocks, float* a, const float* bias, const float* b,
                const bf::ForwardOut& o, int64_t total, int64_t n) {
  if (bf::ForwardQuadsFit(n, {a, bias, b, o.h, o.h16, o.kept_a, o.kept_b})) {
    ++quad_launches;
    Elementwise(blocks != 0 ? blocks : GridFor(total / 4),
                [&] { bf::BiasActForwardKernel<kAct, 4>(a, bias, b, o, total, n); });
  } else {
    Elementwise(blocks != 0 ? blocks : GridFor(total),
                [&] { bf::BiasActForwardKernel<kAct, 1>(a, bias, b, o, total, n); });
  }
}

// The CPU op's results: `op(a, h, kept)` on host tensors of the shapes of f.
template <typename CpuOp>
Forward OnCpu(const std::vector<float>& a0, const Outputs& o, const Shape& shape, CpuOp op) {
  Tensor a = HostTensor(a0, shape);
  Tensor h = Tensor::Empty(shape, o.h16 ? DType::kBF16 : DType::kF32);
  Tensor ka = Tensor::Empty(shape, DType::kBF16), kb = Tensor::Empty(shape, DType::kBF16);
  op(a, h, KeptRounded{o.kept_a ? &ka : nullptr, o.kept_b ? &kb : nullptr});
  Forward f{a.ToVector<float>(), {}, {}, {}, {}};
  if (o.h16) {
    f.h16 = h.ToVector<Bf16>();
  } else {
    f.h = h.ToVector<float>();
  }
  if (o.kept_a) f.kept_a = ka.ToVector<Bf16>();
  if (o.kept_b) f.kept_b = kb.ToVector<Bf16>();
  return f;
}

void ExpectSameForward(const Forward& got, const Forward& want, const std::string& what) {
  ExpectSameBits(got.a, want.a, what + " a");
  ExpectSameBits(got.h, want.h, what + " h");
  ExpectSameBits(got.h16, want.h16, what + " bf16 h");
  ExpectSameBits(got.kept_a, want.kept_a, what + " kept a");
  ExpectSameBits(got.kept_b, want.kept_b, what + " kept b");
}

std::string OutputsName(const Outputs& o) {
  return std::string(o.h16 ? ", bf16 h" : ", f32 h") + (o.kept_a ? ", kept a" : "") +
         (o.kept_b ? ", kept b" : "");
}

TEST(ActivationEmulationTest, BiasActForwardGivesTheCpuBits) {
  uint64_t stream = 200;
  const int quads_before = quad_launches;
  struct Flat {
    int64_t rows, n;
    unsigned blocks;  // 0: GridFor(rows n)
  };
  for (const Flat& s : {Flat{1, 1, 0}, Flat{5, 77, 0}, Flat{3, 1000, 0}, Flat{17, 33, 0},
                        Flat{9, 300, 2}, Flat{6, 8, 1}}) {
    const int64_t total = s.rows * s.n;
    const Shape shape = {s.rows, s.n};
    const std::vector<float> a0 = WithSpecials(total, ++stream);
    const std::vector<float> b = Uniform(total, ++stream, -3.0f, 3.0f);
    const std::vector<float> bias = Uniform(s.n, ++stream, -1.0f, 1.0f);
    const Tensor bias_t = HostTensor(bias, {s.n}), b_t = HostTensor(b, shape);
    const unsigned blocks = s.blocks;
    // With the bias, and without one (null on the device, undefined on the CPU: the
    // activation alone, a not written).
    for (bool biased : {true, false}) {
      const float* dbias = biased ? bias.data() : nullptr;
      const Tensor cbias = biased ? bias_t : Tensor();
      for (const Outputs& o : kOutputs) {
        const std::string what =
            ShapeString(shape) + OutputsName(o) + (biased ? "" : ", no bias");
        if (!o.kept_b) {
          Forward got = Prepared(a0, o);
          RunBiasAct<0>(blocks, got.a.data(), dbias, nullptr, OutOf(got), total, s.n);
          ExpectSameForward(got, OnCpu(a0, o, shape, [&](Tensor& a, Tensor& h, KeptRounded k) {
                              BiasGeluForward(a, cbias, h, nullptr, k);
                            }),
                            "BiasGeluForward " + what);
        }
        Forward got = Prepared(a0, o);
        RunBiasAct<1>(blocks, got.a.data(), dbias, b.data(), OutOf(got), total, s.n);
        ExpectSameForward(got, OnCpu(a0, o, shape, [&](Tensor& a, Tensor& h, KeptRounded k) {
                            BiasSwigluForward(a, cbias, b_t, h, nullptr, k);
                          }),
                          "BiasSwigluForward " + what);
      }
    }
  }
  // n = 1000 and 300 take the quads (the others one element a thread).
  EXPECT_GT(quad_launches, quads_before) << "no shape took four elements a thread";
}

// The grouped fused forward of activation `kAct` over one case, every kind of output.
template <int kAct>
void CheckGroupedForward(const GroupCase& c, bool sized, uint64_t stream) {
  const int64_t groups = static_cast<int64_t>(c.rows.size());
  const std::vector<int64_t> offsets = OffsetsOf(c.rows);
  const int64_t used = offsets.back(), total = used + (sized ? c.past : 0);
  const Shape shape = {total, c.n};
  const std::vector<float> a0 = WithSpecials(total * c.n, stream);
  const std::vector<float> b = Uniform(total * c.n, stream + 1, -3.0f, 3.0f);
  const std::vector<float> bias = Uniform(groups * c.n, stream + 2, -1.0f, 1.0f);
  const Tensor bias_t = HostTensor(bias, {groups, c.n}), b_t = HostTensor(b, shape);
  const RowGroups rg = sized ? RowGroups{{}, Tensor::FromVector(offsets, {groups + 1})}
                             : RowGroups{c.rows, Tensor()};
  for (const Outputs& o : kOutputs) {
    if (kAct == 0 && o.kept_b) continue;
    const std::string what = std::string(kAct == 0 ? "GroupedBiasGeluForward " :
                                                     "GroupedBiasSwigluForward ") +
                             NameOf(c, sized, total) + OutputsName(o);
    Forward got = Prepared(a0, o);
    // bias.cu launches nothing for no elements; with no groups it does (every row past).
    if (total * c.n > 0) {
      RowWise(LaunchFor(c, total), [&] {
        bf::GroupedBiasActKernel<kAct>(got.a.data(), bias.data(), kAct == 0 ? nullptr : b.data(),
                                       OutOf(got), offsets.data(), groups, total, c.n);
      });
    }
    const Forward want = OnCpu(a0, o, shape, [&](Tensor& a, Tensor& h, KeptRounded k) {
      if (kAct == 0) {
        GroupedBiasGeluForward(a, rg, bias_t, h, nullptr, k);
      } else {
        GroupedBiasSwigluForward(a, rg, bias_t, b_t, h, nullptr, k);
      }
    });
    ExpectSameForward(got, want, what);
    const std::vector<float> tail(got.a.begin() + used * c.n, got.a.end());
    ExpectSameBits(tail, std::vector<float>(a0.begin() + used * c.n, a0.end()),
                   what + ": a past the groups");
  }
}

TEST(ActivationEmulationTest, GroupedBiasActForwardGivesTheCpuBits) {
  uint64_t stream = 300;
  for (const GroupCase& c : kGroupCases) {
    for (bool sized : {false, true}) {
      CheckGroupedForward<0>(c, sized, stream += 3);
      CheckGroupedForward<1>(c, sized, stream += 3);
    }
  }
}

// With the C library's expf (the CPU's bits out of reach): each fused kernel gives the bits
// of the unfused kernels it replaces, and its bf16 outputs are its f32 ones rounded.
TEST(ActivationEmulationTest, WithTheLibraryExpFusedEqualsUnfused) {
  const LibraryExp library_exp;
  const GroupCase c = kGroupCases[0];
  const int64_t groups = static_cast<int64_t>(c.rows.size());
  const std::vector<int64_t> offsets = OffsetsOf(c.rows);
  const int64_t total = offsets.back() + c.past, n = c.n, size = total * n;
  const std::vector<float> a0 = Uniform(size, 401, -8.0f, 8.0f);
  const std::vector<float> b = Uniform(size, 402, -3.0f, 3.0f);
  const std::vector<float> bias = Uniform(groups * n, 403, -1.0f, 1.0f);
  const bf::RowLaunch rows = bf::RowLaunchOf(total, n);
  for (bool grouped : {false, true}) {
    for (int act_kind : {0, 1}) {
      const std::string what = std::string(grouped ? "grouped " : "") +
                               (act_kind == 0 ? "bias + gelu" : "bias + swiglu");
      // Unfused: the bias add, then the activation's kernel.
      std::vector<float> a_ref = a0, h_ref(size, kNaN);
      RowWise(rows, [&] {
        bf::AddBiasKernel(a_ref.data(), bias.data(), grouped ? offsets.data() : nullptr,
                          grouped ? groups : 1, total, n);
      });
      Elementwise(GridFor(size), [&] {
        if (act_kind == 0) {
          act::GeluForwardKernel(a_ref.data(), h_ref.data(), size);
        } else {
          act::SwigluForwardKernel(a_ref.data(), b.data(), h_ref.data(), size);
        }
      });
      for (const Outputs& o : {kOutputs[0], kOutputs[1]}) {
        Forward got = Prepared(a0, o);
        auto fused = [&](auto kind) {
          constexpr int k = decltype(kind)::value;
          const float* gate = k == 0 ? nullptr : b.data();
          if (grouped) {
            RowWise(rows, [&] {
              bf::GroupedBiasActKernel<k>(got.a.data(), bias.data(), gate, OutOf(got),
                                          offsets.data(), groups, total, n);
            });
          } else {
            RunBiasAct<k>(0, got.a.data(), bias.data(), gate, OutOf(got), size, n);
          }
        };
        if (act_kind == 0) {
          fused(std::integral_constant<int, 0>());
        } else {
          fused(std::integral_constant<int, 1>());
        }
        Forward want{a_ref, h_ref, {}, {}, {}};
        if (o.h16) {
          want = Forward{a0, {}, {}, {}, {}};
          for (size_t i = 0; i < a0.size(); ++i) {
            want.h16.push_back(Bf16(h_ref[i]));
            want.kept_a.push_back(Bf16(a_ref[i]));
            if (act_kind == 1) want.kept_b.push_back(Bf16(b[i]));
          }
        }
        if (act_kind == 0) got.kept_b.clear();
        ExpectSameForward(got, want, what + OutputsName(o));
      }
    }
  }
}

}  // namespace
}  // namespace switchyard::kernels
