// The fused attention kernel's device code (kernels/cuda/flash_attention_kernels.cuh) run on
// the CPU, without a GPU, against the CPU twin (kernels/cpu/flash_attention.cc): its tiling,
// indexing, masks, bounds checks for S not a multiple of the block, GQA sums, shared-memory
// layout and barriers, executed. The same source as the CUDA build, compiled here against a
// host model of what it uses:
//  - a CTA is 128 std::threads; __syncthreads is a std::barrier of the 128, __shfl_xor_sync an
//    exchange through memory between two barriers of the warp's 32; CTAs run one at a time,
//    and shared memory is one buffer filled with 0xFF bytes (NaN) before each CTA, so a read
//    of anything not written first shows;
//  - nvcuda::wmma: a fragment holds its whole 16 x 16 tile; load_matrix_sync reads it as the
//    layout says (row- or column-major, leading dimension ldm); an accumulator's row r belongs
//    to lane r (lanes 16-31 own none), which alone computes it in mma_sync (f32 sums of the bf16
//    products) and stores it in store_matrix_sync, so the kernel must keep the tile's other
//    rows out of any lane's arithmetic, as on the GPU where the distribution is opaque;
//  - __nv_bfloat16 is engine/core/dtype.h's BFloat16 (round to nearest even), expf/logf the C
//    library's, the __f*_rn intrinsics plain f32 operations (this project compiles with
//    -ffp-contract=off).
// What the model cannot show: the real fragment layout, timing races the barriers would hide
// on the GPU (the threads here do run concurrently, so a missing barrier is likely but not
// certain to show), and anything about speed. tests/gpu/flash_attention_gpu_test.cc runs
// the real kernel against the twin with the same tolerance.
//
// Tolerance: tests/kernels/flash_attention_bound.h with operand_unit = 0 (the inputs are rounded
// to bf16 first, so both sides read the same operands): |emulated - twin| <= 2 x the bound.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/dtype.h"
#include "engine/core/philox.h"
#include "kernels/attention.h"
#include "kernels/flash_attention.h"
#include "kernels/random.h"
#include "tests/kernels/flash_attention_bound.h"

// ---- The host model of the CUDA built-ins (global names, as CUDA's are).
struct EmuDim3 {
  unsigned x = 0, y = 0, z = 0;
};
thread_local EmuDim3 threadIdx, blockIdx, gridDim;
using __nv_bfloat16 = switchyard::BFloat16;

namespace emu {
constexpr int kThreads = 128, kWarps = kThreads / 32;
constexpr size_t kSharedBytes = 227 * 1024;  // sm_90's per-block limit
std::barrier<>* block_barrier = nullptr;
std::barrier<>* warp_barriers[kWarps] = {};
float shuffle_slots[kWarps][32];
}  // namespace emu

inline void __syncthreads() { emu::block_barrier->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  emu::shuffle_slots[warp][lane] = v;
  emu::warp_barriers[warp]->arrive_and_wait();
  const float other = emu::shuffle_slots[warp][lane ^ lane_mask];
  emu::warp_barriers[warp]->arrive_and_wait();
  return other;
}
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline int min(int a, int b) { return a < b ? a : b; }

namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

// The whole 16 x 16 tile, row-major (see the file comment for who owns what).
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static constexpr int num_elements = M * N;
  float x[M * N];
};

template <typename Use, typename T, typename L>
void fill_fragment(fragment<Use, 16, 16, 16, T, L>& f, float v) {
  for (float& e : f.x) e = v;
}

template <typename Use, typename L>
void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, L>& f, const __nv_bfloat16* p,
                      unsigned ldm) {
  static_assert(std::is_same_v<L, row_major> || std::is_same_v<L, col_major>);
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) {
      const __nv_bfloat16 e = std::is_same_v<L, row_major> ? p[r * ldm + c] : p[c * ldm + r];
      f.x[r * 16 + c] = static_cast<float>(e);
    }
  }
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout) {
  EXPECT_EQ(layout, mem_row_major);
  const int r = threadIdx.x % 32;
  if (r >= 16) return;
  for (int c = 0; c < 16; ++c) p[r * ldm + c] = f.x[r * 16 + c];
}

template <typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA>& a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  const int r = threadIdx.x % 32;
  if (r >= 16) return;
  for (int col = 0; col < 16; ++col) {
    float acc = c.x[r * 16 + col];
    for (int k = 0; k < 16; ++k) acc += a.x[r * 16 + k] * b.x[k * 16 + col];
    d.x[r * 16 + col] = acc;
  }
}
}  // namespace nvcuda::wmma

namespace switchyard::kernels::cuda {
constexpr unsigned kFullMask = 0xffffffffu;
inline __nv_bfloat16 ToBf16(float v) { return BFloat16(v); }
namespace flash {
alignas(128) unsigned char smem[emu::kSharedBytes];
}  // namespace flash
}  // namespace switchyard::kernels::cuda

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __restrict__ __restrict
#define __shared__
#define __align__(n)
#include "kernels/cuda/flash_attention_kernels.cuh"
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __restrict__
#undef __shared__
#undef __align__

namespace switchyard::kernels {
namespace {

namespace flash = cuda::flash;
using test_util::AttentionRef;

// Runs `kernel` (a call of one __global__ function) over the grid, one CTA at a time, each as
// 128 threads.
template <typename Kernel>
void Launch(EmuDim3 grid, int64_t shared_bytes, Kernel kernel) {
  ASSERT_LE(shared_bytes, static_cast<int64_t>(emu::kSharedBytes));
  std::barrier<> block(emu::kThreads);
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  for (int w = 0; w < emu::kWarps; ++w) {
    warps.push_back(std::make_unique<std::barrier<>>(32));
    emu::warp_barriers[w] = warps.back().get();
  }
  emu::block_barrier = &block;
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        std::memset(flash::smem, 0xFF, sizeof(flash::smem));
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < emu::kThreads; ++t) {
          threads.emplace_back([&, t, x, y, z] {
            threadIdx = {t, 0, 0};
            blockIdx = {x, y, z};
            gridDim = grid;
            kernel();
          });
        }
        for (std::thread& th : threads) th.join();
      }
    }
  }
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

Tensor NanFilled(const Shape& shape) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = NAN;
  return t;
}

template <int HD>
void EmulatedForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                     bool causal) {
  const flash::Dims d{static_cast<int>(q.dim(1)), static_cast<int>(q.dim(2)),
                      static_cast<int>(k.dim(2))};
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HD)));
  const EmuDim3 grid{static_cast<unsigned>((d.s + flash::kBr - 1) / flash::kBr),
                     static_cast<unsigned>(d.hq), static_cast<unsigned>(q.dim(0))};
  Launch(grid, flash::Sizes<HD>::kForward, [&] {
    flash::FlashForwardKernel<HD>(q.data<float>(), k.data<float>(), v.data<float>(),
                                  out.data<float>(), lse.data<float>(), d, causal, scale);
  });
}

template <int HD>
void EmulatedBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                      const Tensor& dout, const Tensor& delta, Tensor& dq, Tensor& dk, Tensor& dv,
                      bool causal) {
  const flash::Dims d{static_cast<int>(q.dim(1)), static_cast<int>(q.dim(2)),
                      static_cast<int>(k.dim(2))};
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HD)));
  const unsigned blocks = static_cast<unsigned>((d.s + flash::kBr - 1) / flash::kBr);
  const unsigned batch = static_cast<unsigned>(q.dim(0));
  Launch({blocks, static_cast<unsigned>(d.hkv), batch}, flash::Sizes<HD>::kBackward, [&] {
    flash::FlashBackwardKvKernel<HD>(q.data<float>(), k.data<float>(), v.data<float>(),
                                     lse.data<float>(), dout.data<float>(), delta.data<float>(),
                                     dk.data<float>(), dv.data<float>(), d, causal, scale);
  });
  Launch({blocks, static_cast<unsigned>(d.hq), batch}, flash::Sizes<HD>::kBackward, [&] {
    flash::FlashBackwardQKernel<HD>(q.data<float>(), k.data<float>(), v.data<float>(),
                                    lse.data<float>(), dout.data<float>(), delta.data<float>(),
                                    dq.data<float>(), d, causal, scale);
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
  Tensor dq_e = NanFilled(q_shape), dk_e = NanFilled(kv_shape), dv_e = NanFilled(kv_shape);
  EmulatedBackward<HD>(q, k, v, lse, dout, delta, dq_e, dk_e, dv_e, causal);
  ExpectTwice(dq_e, dq, ref.dq_bound, name + " dq");
  ExpectTwice(dk_e, dk, ref.dk_bound, name + " dk");
  ExpectTwice(dv_e, dv, ref.dv_bound, name + " dv");
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
