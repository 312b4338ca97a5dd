// The fused attention kernel's device code (kernels/cuda/flash_attention_kernels.cuh) run on
// the CPU, without a GPU, against the CPU twin (kernels/cpu/flash_attention.cc): its tiling,
// indexing, masks, bounds checks for S not a multiple of the block, GQA sums, shared-memory
// layout and barriers, executed. The same source as the CUDA build, compiled here against the
// host model of CUDA's threads, barriers, shuffles and mma.sync fragments in
// tests/kernels/cuda_emulation.h (a CTA is 128 threads taking turns, CTAs run one at a time).
// What the model cannot show is listed there; tests/gpu/flash_attention_gpu_test.cc runs the
// real kernel against the twin with the same tolerance.
//
// Tolerance: tests/kernels/flash_attention_bound.h with operand_unit = 0 (the inputs are rounded
// to bf16 first, so both sides read the same operands): |emulated - twin| <= 2 x the bound.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/dtype.h"
#include "engine/core/philox.h"
#include "engine/core/device_context.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/flash_attention.h"
#include "kernels/random.h"
#include "tests/kernels/flash_attention_bound.h"
// Last: the host model defines CUDA's qualifiers as macros.
#include "tests/kernels/cuda_emulation.h"

namespace switchyard::kernels::cuda::flash {
alignas(128) unsigned char smem[emu::kSharedBytes];  // the kernels' shared memory
}  // namespace switchyard::kernels::cuda::flash

#include "kernels/cuda/flash_attention_kernels.cuh"

namespace switchyard::kernels {
namespace {

namespace flash = cuda::flash;
using test_util::AttentionRef;

// Runs `kernel` (a call of one __global__ function) over the grid, each CTA as 128 threads.
template <typename Kernel>
void Launch(EmuDim3 grid, int64_t shared_bytes, Kernel kernel) {
  emu::Launch(grid, flash::kThreads, flash::smem, sizeof(flash::smem), shared_bytes, kernel);
}

struct Case {
  int64_t b, s, hq, hkv, hd;
  std::string Name() const {
    return "B=" + std::to_string(b) + " S=" + std::to_string(s) + " Hq=" + std::to_string(hq) +
           " Hkv=" + std::to_string(hkv) + " hd=" + std::to_string(hd);
  }
};

Tensor RandomBf16(const Shape& shape, uint64_t stream) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  FillUniform(t, RngKey{83, stream}, 0, -1.0f, 1.0f);
  return test_util::RoundedToBf16(t);
}

// A copy of t whose data starts one element (4 bytes of f32, 2 of bf16) past a 16-byte
// boundary (a view into a buffer): rows the kernels must load element by element
// (flash::Dims::aligned false).
Tensor Unaligned(const Tensor& t) {
  Tensor buf = Tensor::Empty({t.numel() + 1}, t.dtype());
  Tensor view = buf.Slice(1, t.numel() + 1).Reshape(t.shape());
  view.CopyFrom(t);
  EXPECT_NE(reinterpret_cast<uintptr_t>(view.raw_data()) % 16, 0u);
  return view;
}

// t in bf16 (t's values are bf16 already: exact).
Tensor InBf16(const Tensor& t) {
  Tensor out = Tensor::Empty(t.shape(), DType::kBF16);
  Cast(t, out);
  return out;
}

// Calls f with a null pointer of q's element type (f32, or bf16: the kernels' TI).
template <typename F>
void WithInputs(const Tensor& q, F&& f) {
  if (q.dtype() == DType::kBF16) return f(static_cast<const BFloat16*>(nullptr));
  f(static_cast<const float*>(nullptr));
}
template <typename TI>
const TI* In(const Tensor& t) {
  return static_cast<const TI*>(t.raw_data());
}

Tensor NanFilled(const Shape& shape) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = NAN;
  return t;
}

// q, k and v f32, or bf16 (the kernels' TI); out f32, or bf16 (the kernel's bf16 instance,
// as bf16 activation storage runs it). aligned: every input's rows start on 16 bytes.
template <int HD>
void EmulatedForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                     bool causal, bool aligned = true) {
  const flash::Dims d{static_cast<int>(q.dim(1)), static_cast<int>(q.dim(2)),
                      static_cast<int>(k.dim(2)), aligned, false};
  const flash::Scale scale{FlashScale(HD), FlashScaleLog2(HD)};
  const EmuDim3 grid{static_cast<unsigned>((d.s + flash::kBr - 1) / flash::kBr),
                     static_cast<unsigned>(d.hq), static_cast<unsigned>(q.dim(0))};
  WithInputs(q, [&](auto* ip) {
    using TI = std::remove_const_t<std::remove_pointer_t<decltype(ip)>>;
    Launch(grid, flash::Sizes<HD>::kForward, [&] {
      if (out.dtype() == DType::kBF16) {
        flash::FlashForwardKernel<HD, TI>(In<TI>(q), In<TI>(k), In<TI>(v),
                                          static_cast<BFloat16*>(out.raw_data()),
                                          lse.data<float>(), d, causal, scale);
      } else {
        flash::FlashForwardKernel<HD, TI>(In<TI>(q), In<TI>(k), In<TI>(v), out.data<float>(),
                                          lse.data<float>(), d, causal, scale);
      }
    });
  });
}

template <int HD>
void EmulatedBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                      const Tensor& dout, const Tensor& delta, Tensor& dq, Tensor& dk, Tensor& dv,
                      bool causal, bool aligned = true, std::optional<bool> aligned_dout = {}) {
  const flash::Dims d{static_cast<int>(q.dim(1)), static_cast<int>(q.dim(2)),
                      static_cast<int>(k.dim(2)), aligned, aligned_dout.value_or(aligned)};
  const flash::Scale scale{FlashScale(HD), FlashScaleLog2(HD)};
  const unsigned blocks = static_cast<unsigned>((d.s + flash::kBr - 1) / flash::kBr);
  const unsigned batch = static_cast<unsigned>(q.dim(0));
  WithInputs(q, [&](auto* ip) {
    using TI = std::remove_const_t<std::remove_pointer_t<decltype(ip)>>;
    Launch({blocks, static_cast<unsigned>(d.hkv), batch}, flash::Sizes<HD>::kBackwardKv, [&] {
      flash::FlashBackwardKvKernel<HD, TI>(In<TI>(q), In<TI>(k), In<TI>(v), lse.data<float>(),
                                           dout.data<float>(), delta.data<float>(),
                                           dk.data<float>(), dv.data<float>(), d, causal, scale);
    });
    Launch({blocks, static_cast<unsigned>(d.hq), batch}, flash::Sizes<HD>::kBackwardQ, [&] {
      flash::FlashBackwardQKernel<HD, TI>(In<TI>(q), In<TI>(k), In<TI>(v), lse.data<float>(),
                                          dout.data<float>(), delta.data<float>(),
                                          dq.data<float>(), d, causal, scale);
    });
  });
}

void ExpectTwice(const Tensor& got, const Tensor& want, const std::vector<double>& bound,
                 const std::string& what) {
  test_util::ExpectWithinAttentionBound(got.ToVector<float>(), want.ToVector<float>(), bound, 2.0,
                                        what);
}

template <int HD>
void CheckCase(const Case& c, AttentionMask mask, uint64_t seed) {
  ASSERT_EQ(c.hd, HD);
  const bool causal = mask == AttentionMask::kCausal;
  const std::string name = c.Name() + (causal ? " causal" : " full");
  const Shape q_shape{c.b, c.s, c.hq, c.hd}, kv_shape{c.b, c.s, c.hkv, c.hd};
  const Shape l_shape{c.b, c.hq, c.s};
  Tensor q = RandomBf16(q_shape, seed), k = RandomBf16(kv_shape, seed + 1);
  Tensor v = RandomBf16(kv_shape, seed + 2), dout = RandomBf16(q_shape, seed + 3);
  const AttentionRef ref = test_util::FlashAttentionWithBound(q, k, v, dout, causal, 0.0);

  // The twin.
  Tensor out = NanFilled(q_shape), lse = NanFilled(l_shape), delta = NanFilled(l_shape);
  cpu::FlashAttentionForward(q, k, v, out, lse, mask);
  AttentionBackwardDelta(out, dout, delta);
  Tensor dq = NanFilled(q_shape), dk = NanFilled(kv_shape), dv = NanFilled(kv_shape);
  cpu::FlashAttentionBackward(q, k, v, lse, dout, delta, dq, dk, dv, mask);

  // The kernels, every output NaN-filled first (written, not accumulated).
  Tensor out_e = NanFilled(q_shape), lse_e = NanFilled(l_shape);
  EmulatedForward<HD>(q, k, v, out_e, lse_e, causal);
  ExpectTwice(out_e, out, ref.out_bound, name + " out");
  ExpectTwice(lse_e, lse, ref.lse_bound, name + " lse");
  // A bf16 out: the f32 out rounded, element for element, with the same lse; and the twin's
  // bf16 out (the dispatch's) its f32 out rounded. delta reads a bf16 out widened.
  {
    Tensor out16 = Tensor::Empty(q_shape, DType::kBF16), lse16 = NanFilled(l_shape);
    EmulatedForward<HD>(q, k, v, out16, lse16, causal);
    Tensor want16 = Tensor::Empty(q_shape, DType::kBF16);
    Cast(out_e, want16);
    EXPECT_EQ(0, std::memcmp(out16.raw_data(), want16.raw_data(), out16.numel() * 2))
        << name << " bf16 out";
    EXPECT_EQ(0, std::memcmp(lse16.raw_data(), lse_e.raw_data(), lse16.numel() * 4))
        << name << " bf16 out: lse";
    auto bf16_ctx = DeviceContext::Create(Device::Cpu());
    bf16_ctx->set_matmul_dtype(DType::kBF16);
    Tensor twin16 = Tensor::Empty(q_shape, DType::kBF16), twin_lse = NanFilled(l_shape);
    AttentionForward(q, k, v, twin16, twin_lse, bf16_ctx.get(), mask);
    Cast(out, want16);
    EXPECT_EQ(0, std::memcmp(twin16.raw_data(), want16.raw_data(), twin16.numel() * 2))
        << name << " the twin's bf16 out";
    Tensor wide = Tensor::Empty(q_shape, DType::kF32), d16 = NanFilled(l_shape);
    Tensor dw = NanFilled(l_shape);
    Cast(twin16, wide);
    AttentionBackwardDelta(twin16, dout, d16);
    AttentionBackwardDelta(wide, dout, dw);
    EXPECT_EQ(0, std::memcmp(d16.raw_data(), dw.raw_data(), d16.numel() * 4))
        << name << " delta of a bf16 out";
  }
  Tensor dq_e = NanFilled(q_shape), dk_e = NanFilled(kv_shape), dv_e = NanFilled(kv_shape);
  EmulatedBackward<HD>(q, k, v, lse, dout, delta, dq_e, dk_e, dv_e, causal);
  ExpectTwice(dq_e, dq, ref.dq_bound, name + " dq");
  ExpectTwice(dk_e, dk, ref.dk_bound, name + " dk");
  ExpectTwice(dv_e, dv, ref.dv_bound, name + " dv");

  // The same bits from every way the tiles come in: q, k and v in bf16 (cp.async copies), and
  // (the causal cases, which visit both the masked and the unmasked tiles) rows not on 16
  // bytes, loaded element by element, in f32 and in bf16.
  auto expect_same = [&](const Tensor& qi, const Tensor& ki, const Tensor& vi, const Tensor& di,
                         bool aligned, const std::string& how) {
    Tensor out_u = NanFilled(q_shape), lse_u = NanFilled(l_shape);
    EmulatedForward<HD>(qi, ki, vi, out_u, lse_u, causal, aligned);
    Tensor dq_u = NanFilled(q_shape), dk_u = NanFilled(kv_shape), dv_u = NanFilled(kv_shape);
    // dout's alignment as it is (the kernels take it apart from q, k and v's).
    const bool dout_aligned = reinterpret_cast<uintptr_t>(di.raw_data()) % 16 == 0;
    EmulatedBackward<HD>(qi, ki, vi, lse, di, delta, dq_u, dk_u, dv_u, causal, aligned, dout_aligned);
    for (const auto& [got, want, what] : {std::tuple{&out_u, &out_e, "out"},
                                          {&lse_u, &lse_e, "lse"}, {&dq_u, &dq_e, "dq"},
                                          {&dk_u, &dk_e, "dk"}, {&dv_u, &dv_e, "dv"}}) {
      EXPECT_EQ(0, std::memcmp(got->raw_data(), want->raw_data(), got->numel() * 4))
          << name << " " << how << ": " << what;
    }
  };
  const Tensor q16 = InBf16(q), k16 = InBf16(k), v16 = InBf16(v);
  expect_same(q16, k16, v16, dout, true, "bf16 inputs");
  if (!causal) return;
  const Tensor du = Unaligned(dout);
  expect_same(Unaligned(q), Unaligned(k), Unaligned(v), du, false, "unaligned rows");
  expect_same(Unaligned(q16), Unaligned(k16), Unaligned(v16), du, false, "unaligned bf16 rows");
  // One of the two on 16 bytes: bf16 q, k, v by cp.async with dout element by element, and
  // the converse.
  expect_same(q16, k16, v16, du, true, "bf16 rows on 16 bytes, dout not");
  expect_same(Unaligned(q16), Unaligned(k16), Unaligned(v16), dout, false, "bf16 rows not on 16 bytes, dout on");
}

TEST(FlashAttentionEmulationTest, KernelsMatchTheTwinHeadDim64) {
  const Case cases[] = {
      {1, 1, 1, 1, 64},   // one token
      {2, 37, 4, 2, 64},  // GQA 4:2, S below the block
      {1, 130, 2, 1, 64}, // MQA, three key blocks, the last of 2 keys
  };
  uint64_t seed = 9000;
  for (const Case& c : cases) {
    for (AttentionMask mask : {AttentionMask::kCausal, AttentionMask::kFull}) {
      CheckCase<64>(c, mask, seed += 10);
    }
  }
}

TEST(FlashAttentionEmulationTest, KernelsMatchTheTwinHeadDim128) {
  const Case cases[] = {
      {2, 1, 2, 2, 128},   // S = 1
      {1, 64, 3, 3, 128},  // exactly one block, multi-head
      {1, 100, 4, 2, 128}, // GQA 4:2, two blocks
  };
  uint64_t seed = 9500;
  for (const Case& c : cases) {
    for (AttentionMask mask : {AttentionMask::kCausal, AttentionMask::kFull}) {
      CheckCase<128>(c, mask, seed += 10);
    }
  }
}

}  // namespace
}  // namespace switchyard::kernels
