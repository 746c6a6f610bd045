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

// Lane 0's value, on every lane. Applied to a value that every lane of the warp already holds, it
// changes nothing but tells ptxas that the value is warp-uniform: it may then live in a uniform
// register, and what is derived from it (loop counters, stage and barrier addresses, wgmma
// descriptors) is computed once per warp on the uniform datapath, with branches on it known not to
// diverge. DeepGEMM reads its warp index this way.
template <typename T>
__device__ __forceinline__ T WarpUniform(T value) {
  return __shfl_sync(0xFFFFFFFFu, value, 0);
}
__device__ __forceinline__ bool WarpUniform(bool value) { return __shfl_sync(0xFFFFFFFFu, static_cast<int>(value), 0) != 0; }

// The same pointer, which the compiler can no longer see through: a loop that stores at
// p + (uniform offset) then keeps p in registers and adds the offset (two instructions), instead
// of rebuilding p from its parts (base, row, lane) on every iteration.
template <typename T>
__device__ __forceinline__ T* OpaquePointer(T* p) {
  asm("" : "+l"(p));
  return p;
}

// A 32-bit store to global memory through such a pointer: the compiler no longer knows where it
// points, and would otherwise emit a generic store.
__device__ __forceinline__ void StoreGlobal(uint32_t* p, uint32_t value) {
  asm volatile("st.global.u32 [%0], %1;" ::"l"(p), "r"(value) : "memory");
}
// The same for an output the kernel never reads back (the select's ids): no memory clobber, so
// the compiler may still move shared-memory loads across it.
__device__ __forceinline__ void StoreOutput(int32_t* p, int32_t value) {
  asm volatile("st.global.s32 [%0], %1;" ::"l"(p), "r"(value));
}

// The lanes below this one in its warp (a special register: no shift of the lane index).
__device__ __forceinline__ uint32_t LaneMaskLt() {
  uint32_t mask;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(mask));
  return mask;
}

// The first `Align`-aligned byte of a dynamic shared-memory buffer (allocated with Align - 1
// bytes of slack). Offsetting the array itself, not a pointer rebuilt from an integer, keeps the
// compiler aware that the result is shared memory: through an integer cast every access becomes a
// generic LD/ST/ATOM instead of LDS/STS/ATOMS (FusedRowsKernel's whole select, ScorePagesKernel's
// block scan).
template <uint32_t Align>
__device__ __forceinline__ uint8_t* AlignedSmem(uint8_t* raw) {
  return raw + ((Align - (SmemAddr(raw) & (Align - 1))) & (Align - 1));
}

// ---- mbarrier -------------------------------------------------------------------------------
__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddr(bar)), "r"(count));
}
// Before an mbarrier's memory is put to another use (the PTX rule for repurposing it).
__device__ __forceinline__ void MbarInval(uint64_t* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(SmemAddr(bar)) : "memory");
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

// MbarWait for a thread that has nothing else to do while it waits (a producer far ahead of its
// consumers): it sleeps between polls instead of spinning, so it leaves the issue slots of its
// scheduler to the warps that compute.
__device__ __forceinline__ void MbarWaitBackoff(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (true) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(SmemAddr(bar)), "r"(parity)
        : "memory");
    if (done) return;
    __nanosleep(64);
  }
}

// ---- TMA and bulk copies --------------------------------------------------------------------
// The 3-D loads (the K cache's pages) and the bulk copies (their scales) take an L2 cache policy
// (EvictFirstPolicy).
__device__ __forceinline__ void TmaLoad3d(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1,
                                          int32_t c2, uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(SmemAddr(bar)), "l"(policy)
      : "memory");
}
__device__ __forceinline__ void TmaLoad2d(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(SmemAddr(bar))
      : "memory");
}
__device__ __forceinline__ void BulkLoad(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          SmemAddr(dst)),
      "l"(src), "r"(bytes), "r"(SmemAddr(bar)), "l"(policy)
      : "memory");
}
// An L2 policy for bytes a call reads once (the K cache's pages): L2 evicts their lines first, so
// that the page stream, many times L2's size on large batches, does not push out what the call
// reads back soon (the split path's keys in the workspace, read by the select from L2).
__device__ __forceinline__ uint64_t EvictFirstPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
// Asks L2 for the 128-byte line holding `address` (no register result, no fault semantics needed:
// callers pass addresses inside the buffer).
__device__ __forceinline__ void PrefetchL2(const void* address) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(address));
}

__device__ __forceinline__ void PrefetchTensorMap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Barrier `id` (1..15; 0 is __syncthreads) over `threads` threads, whole warps.
__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// A named barrier that also tells every thread whether `pred` held in any of them.
__device__ __forceinline__ bool NamedBarrierAny(int id, int threads, bool pred) {
  uint32_t any;
  asm volatile(
      "{\n"
      ".reg .pred p, q;\n"
      "setp.ne.u32 p, %1, 0;\n"
      "bar.red.or.pred q, %2, %3, p;\n"
      "selp.u32 %0, 1, 0, q;\n"
      "}\n"
      : "=r"(any)
      : "r"(static_cast<uint32_t>(pred)), "r"(id), "r"(threads)
      : "memory");
  return any != 0u;
}

// ---- time stamps (a benchmark's instrument) ------------------------------------------------
// Nanoseconds of the GPU's global timer (the same clock on every SM, coarsely updated) and this
// SM's cycle counter (exact, but per SM).
__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// The instruments' buffers (impls/sm90_select_stamps.cuh, sm90_score_stamps.cuh): slot `slot` of
// kWords words in a buffer of kSlots slots, or null (no buffer, or past its slots); a null slot
// takes no stamp.
template <int kWords, int kSlots>
__device__ __forceinline__ unsigned long long* StampSlotIn(unsigned long long* buffer, int64_t slot) {
  return buffer != nullptr && slot < kSlots ? buffer + slot * kWords : nullptr;
}
// The global timer and the cycle counter, at once, into two words of a slot.
__device__ __forceinline__ void StampTimesInto(unsigned long long* words, int ns_word, int cycles_word) {
  if (words != nullptr) words[ns_word] = GlobalTimerNs(), words[cycles_word] = clock64();
}
__device__ __forceinline__ void StampCyclesInto(unsigned long long* words, int word) {
  if (words != nullptr) words[word] = clock64();
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
constexpr int kWarpgroupThreads = 128;  // four consecutive warps issue one wgmma together

// Shared-memory matrix descriptor for a K-major operand in the 128-byte swizzle layout: rows of
// 128 bytes, 8-row (1024-byte) swizzle atoms stacked along M/N. The tile must be 1024-aligned.
// The high word is the same for every such tile (stride byte offset: one 8-row atom; layout:
// 128-byte swizzle); the low word holds the start address in 16-byte units and the unused
// leading byte offset (1). Addresses are built on the low word alone: a shared address is below
// 2^18, so adding a K offset never carries into the high word, and 32-bit adds keep the
// descriptor arithmetic off the 64-bit path on every wgmma of the page loop.
constexpr uint32_t kDescSw128High = (1u << 30) | (1024u >> 4);
__device__ __forceinline__ uint32_t SmemDescLow(const void* tile) {
  return ((SmemAddr(tile) & 0x3FFFFu) >> 4) | (1u << 16);
}
__device__ __forceinline__ uint64_t SmemDesc(uint32_t low) { return (uint64_t(kDescSw128High) << 32) | low; }
// Advancing along K inside the swizzle atom is a plain start-address offset (the hardware
// applies the XOR to the final address), 32 bytes per k32 step of FP8; so is moving to another
// tile of the same buffer (a ring's next stage): the start-address field cannot carry over.
__device__ __forceinline__ uint32_t DescAdvance(uint32_t low, uint32_t bytes) { return low + (bytes >> 4); }

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

// D[64 x kCols] (+)= A[64x32] * B[kCols x 32]^T, e4m3 x e4m3 -> f32, both operands K-major in shared
// memory: kCols / 2 accumulators per thread. A page's tokens are M; the N side holds the heads
// of one or several queries (sm90_page_epilogue.cuh), so the widths used are 32..128.
template <int kCols>
struct WgmmaE4M3;

template <>
struct WgmmaE4M3<32> {
  __device__ __forceinline__ static void Run(float (&d)[16], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
    asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15 "
      "}, %16, %17, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
  }
};

template <>
struct WgmmaE4M3<64> {
  __device__ __forceinline__ static void Run(float (&d)[32], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
    asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31 "
      "}, %32, %33, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
  }
};

template <>
struct WgmmaE4M3<96> {
  __device__ __forceinline__ static void Run(float (&d)[48], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
    asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %50, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47 "
      "}, %48, %49, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
  }
};

template <>
struct WgmmaE4M3<128> {
  __device__ __forceinline__ static void Run(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
    asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63 "
      "}, %64, %65, p, 1, 1;\n"
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
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
  }
};

// ---- register reallocation between warpgroups ------------------------------------------------
// Each warpgroup of a role runs exactly one of these right after the role split; the counts must
// fit the CTA's launch allocation (threads x the register cap of __launch_bounds__).
template <uint32_t kRegs>
__device__ __forceinline__ void GrowRegisters() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void ShrinkRegisters() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

}  // namespace ffi_dsa::sm90
