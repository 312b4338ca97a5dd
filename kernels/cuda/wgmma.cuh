// Hopper's warpgroup tensor-core product, wgmma.mma_async (sm_90a), on bf16 operands that both
// lie in shared memory in the 128-byte swizzled layout, f32 accumulators in registers. The
// grouped expert GEMMs' Hopper tiles (kernels/cuda/grouped_gemm_kernels.cuh) use it.
//
// Shared layout (PTX ISA, "Shared Memory Matrix Layout", 128-byte swizzle). An operand tile is
// cut into atoms of 8 rows of 128 bytes (64 bf16), 1024 bytes, each at a 1024-byte aligned
// shared address; inside an atom the 16-byte chunk c of row r lies at chunk c ^ r (the XOR of
// address bits 4-6 with bits 7-9, which the hardware applies to the address it computes).
//  - K-major (an operand whose K is the contiguous dimension): an atom's rows are 8 rows of
//    M (or N), 64 values of K each. Atoms follow each other down M at the stride byte offset
//    (SBO); one instruction reads K = 16, 32 bytes of each row, from the start address, which
//    moves 32 bytes per 16 of K inside the atom. The leading byte offset is unused.
//  - MN-major (M or N contiguous): an atom's rows are 8 values of K, 64 of M (N) each. Atoms
//    follow each other along M (N) at the leading byte offset (LBO) and along K at SBO.
// The matrix descriptor (64 bits): start address >> 4 in bits 0-13, LBO >> 4 in 16-29, SBO >> 4
// in 32-45, base offset 0 (the atoms are aligned), swizzle mode 1 (128 bytes) in bits 62-63.
//
// wgmma.mma_async.m64nNk16: the 128 threads of a warpgroup (4 consecutive warps, the first a
// multiple of 4) each hold N / 2 f32 accumulators of the 64 x N tile D += A (64 x 16) B (16 x
// N): warp w of the group, lane l = 4 g + t, register 4 j + r holds D[16 w + g + 8 (r / 2)]
// [8 j + 2 t + r % 2] (the mma.sync m16n8 accumulator layout, repeated along N). It runs
// asynchronously: WgmmaFence before the first product that touches registers written
// otherwise, WgmmaCommit closes a group of products, WgmmaWait<N> waits until at most N groups
// are in flight (only then may the accumulators be read or the shared tiles be overwritten),
// and shared memory written by ordinary stores or cp.async must be made visible to the async
// proxy (FenceProxyAsync, by the writing threads) before the barrier that precedes the product.
//
// The host model of CUDA (tests/kernels/cuda_emulation_wgmma.h) defines the same functions:
// it decodes the descriptors with the layout above and computes a product when a wait covers
// it, reading the shared tiles then.
#pragma once

#include <cstdint>

namespace switchyard::kernels::cuda {

// The descriptor of a 128-byte swizzled operand at shared address `addr` (1024-byte aligned
// atoms; addr may sit 32, 64 or 96 bytes into one, K-major, for the later K steps).
__host__ __device__ constexpr uint64_t SwizzledDescriptor(uint32_t addr, uint32_t lbo,
                                                          uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) |
         static_cast<uint64_t>((lbo & 0x3FFFFu) >> 4) << 16 |
         static_cast<uint64_t>((sbo & 0x3FFFFu) >> 4) << 32 | uint64_t{1} << 62;
}

// Byte offset of 16-byte chunk c (of 8 bf16) in row r of a swizzled tile of `rows` rows whose
// rows run along the contiguous dimension: chunks 8 i to 8 i + 7 of every row form column
// block i (rows x 128 bytes, 8-row atoms stacked), chunk c % 8 lands at (c % 8) ^ (r % 8).
__host__ __device__ constexpr int SwizzledOffset(int rows, int r, int c) {
  return (c / 8) * rows * 128 + r * 128 + (((c % 8) ^ (r % 8)) << 4);
}

#ifdef __CUDACC__
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SY_WGMMA_ASM 1
#endif

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void WgmmaFence() {
#ifdef SY_WGMMA_ASM
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void WgmmaCommit() {
#ifdef SY_WGMMA_ASM
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void WgmmaWait() {
#ifdef SY_WGMMA_ASM
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
__device__ __forceinline__ void FenceProxyAsync() {
#ifdef SY_WGMMA_ASM
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// d += A B, m64nNk16 (N = 128: 64 accumulators a thread, N = 256: 128), A and B from their
// descriptors; kTransA / kTransB: the operand is MN-major (else K-major). Compiled for sm_90a
// only; elsewhere it traps (the host launches the kernels that call it only where
// kernels/cuda/grouped_gemm.cu finds them compiled). WgmmaM64N<N> names them by N.
template <bool kTransA, bool kTransB>
__device__ __forceinline__ void WgmmaM64N128(float (&d)[64], uint64_t a, uint64_t b) {
#ifdef SY_WGMMA_ASM
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
      "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "
      "%60, %61, %62, %63}, "
      "%64, %65, 1, 1, 1, %66, %67;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(a), "l"(b), "n"(kTransA ? 1 : 0), "n"(kTransB ? 1 : 0));
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

template <bool kTransA, bool kTransB>
__device__ __forceinline__ void WgmmaM64N256(float (&d)[128], uint64_t a, uint64_t b) {
#ifdef SY_WGMMA_ASM
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
      "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "
      "%60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, "
      "%72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, "
      "%84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, "
      "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, "
      "%120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, 1, 1, 1, %130, %131;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
        "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
        "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
        "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
        "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
        "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
        "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),
        "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "n"(kTransA ? 1 : 0), "n"(kTransB ? 1 : 0));
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

template <int N, bool kTransA, bool kTransB>
__device__ __forceinline__ void WgmmaM64N(float (&d)[N / 2], uint64_t a, uint64_t b) {
  static_assert(N == 128 || N == 256, "m64n128k16 or m64n256k16");
  if constexpr (N == 128) {
    WgmmaM64N128<kTransA, kTransB>(d, a, b);
  } else {
    WgmmaM64N256<kTransA, kTransB>(d, a, b);
  }
}

#endif  // __CUDACC__

}  // namespace switchyard::kernels::cuda
