// Thin wrappers over the sm_90a instructions the indexer uses: mbarriers, TMA / bulk copies and
// FP8 wgmma. Each wrapper is one PTX instruction; the ideas follow the PTX ISA and the way
// CUTLASS/DeepGEMM drive them (descriptor bit layout, swizzle-128B K-major operands).
#pragma once
#include <cuda.h>
#include <cstdint>

namespace ffi_dsa::sm90 {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The first `Align`-aligned byte of a dynamic shared-memory buffer (allocated with Align - 1
// bytes of slack). Offsetting the array itself, not a pointer rebuilt from an integer, keeps the
// compiler aware that the result is shared memory: through an integer cast every access became a
// generic LD/ST/ATOM (the one kernel's whole select and kernel 1's block scan, v13.3 SASS).
template <uint32_t Align>
__device__ __forceinline__ uint8_t* AlignedSmem(uint8_t* raw) {
  return raw + ((Align - (SmemAddr(raw) & (Align - 1))) & (Align - 1));
}

// ---- mbarrier -------------------------------------------------------------------------------
__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddr(bar)), "r"(count));
}
__device__ __forceinline__ void FenceBarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(SmemAddr(bar)) : "memory");
}
__device__ __forceinline__ void MbarArriveExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SmemAddr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(SmemAddr(bar)),
      "r"(parity)
      : "memory");
}

// ---- TMA and bulk copies --------------------------------------------------------------------
__device__ __forceinline__ void TmaLoad3d(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1,
                                          int32_t c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(SmemAddr(bar))
      : "memory");
}
__device__ __forceinline__ void TmaLoad2d(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(SmemAddr(bar))
      : "memory");
}
__device__ __forceinline__ void BulkLoad(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          SmemAddr(dst)),
      "l"(src), "r"(bytes), "r"(SmemAddr(bar))
      : "memory");
}
// Asks L2 for the 128-byte line holding `address` (no register result, no fault semantics needed:
// callers pass addresses inside the buffer).
__device__ __forceinline__ void PrefetchL2(const void* address) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(address));
}

__device__ __forceinline__ void PrefetchTensorMap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ---- programmatic dependent launch ----------------------------------------------------------
// The next kernel in the stream (launched with programmatic stream serialization) may start its
// prologue once every CTA of this one has signalled; it must wait before reading our output.
__device__ __forceinline__ void AllowDependentLaunch() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
// Returns once the preceding kernel has completed and its memory operations are visible. A no-op
// when this kernel was launched without the programmatic attribute.
__device__ __forceinline__ void WaitForPrecedingGrid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// ---- wgmma ----------------------------------------------------------------------------------
// Shared-memory matrix descriptor for a K-major operand in the 128-byte swizzle layout: rows of
// 128 bytes, 8-row (1024-byte) swizzle atoms stacked along M/N. The tile must be 1024-aligned.
__device__ __forceinline__ uint64_t SmemDescSw128(const void* tile) {
  const uint64_t addr = SmemAddr(tile);
  uint64_t desc = 0;
  desc |= (addr & 0x3FFFF) >> 4;             // start address, 16-byte units
  desc |= uint64_t(1) << 16;                 // leading byte offset: unused for swizzled K-major
  desc |= uint64_t(1024 >> 4) << 32;         // stride byte offset: one 8-row swizzle atom
  desc |= uint64_t(1) << 62;                 // layout: 128-byte swizzle
  return desc;
}
// Advancing along K inside the swizzle atom is a plain start-address offset (the hardware
// applies the XOR to the final address), 32 bytes per k32 step of FP8.
__device__ __forceinline__ uint64_t DescAdvance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void WgmmaCommit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// relu that propagates NaN (fmaxf would turn NaN into 0, against the SPEC): one instruction.
__device__ __forceinline__ float ReluNaN(float x) {
  float y;
  asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(y) : "f"(x));
  return y;
}

// Keeps the compiler from moving reads or writes of wgmma accumulators across the async
// window (between issue and wait the registers belong to the tensor cores).
template <int kRegs>
__device__ __forceinline__ void FenceOperand(float (&d)[kRegs]) {
#pragma unroll
  for (int i = 0; i < kRegs; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D[64x64] (+)= A[64x32] * B[64x32]^T, e4m3 x e4m3 -> f32, both operands K-major in shared memory.
__device__ __forceinline__ void WgmmaM64N64K32E4M3(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                   bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
        "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

// D[64x32] (+)= A[64x32] * B[32x32]^T: the same for a 32-head query.
__device__ __forceinline__ void WgmmaM64N32K32E4M3(float (&d)[16], uint64_t desc_a, uint64_t desc_b,
                                                   bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
        "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

// The m64nN k32 FP8 wgmma with N = kHeads (64 or 32): kHeads / 2 accumulators per thread.
template <int kHeads>
__device__ __forceinline__ void WgmmaHeadsK32(float (&d)[kHeads / 2], uint64_t desc_a, uint64_t desc_b,
                                              bool accumulate) {
  static_assert(kHeads == 64 || kHeads == 32, "the contract's head counts");
  if constexpr (kHeads == 64) {
    WgmmaM64N64K32E4M3(d, desc_a, desc_b, accumulate);
  } else {
    WgmmaM64N32K32E4M3(d, desc_a, desc_b, accumulate);
  }
}

}  // namespace ffi_dsa::sm90
