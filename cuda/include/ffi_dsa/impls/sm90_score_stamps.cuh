// The scoring kernel's stamps (launch/tuning.h: stamp_select, which stamps the selects too), a
// benchmark's instrument that changes no output: each ScorePagesKernel CTA writes when it starts and
// when its last math warpgroup is done (global timer), and the SM's cycle counter at the milestones
// of the chain from its start to its first page: past the grid wait, the page range known, the first
// page's load issued, the first segment's Q arrived, the first page arrived. On a small batch that
// chain is most of the kernel (W1: one page a CTA), and only stamps inside the CTA can split it.
// One slot of kScoreStampWords words per CTA (blockIdx.x), in the module's stamp buffer after the
// selects' slots (launch/sm90_select_stamps.h).
#pragma once
#include <cstdint>

#include "ffi_dsa/impls/sm90_ptx.cuh"

namespace ffi_dsa::sm90 {

enum ScoreStamp : int {
  kScoreStartNs,         // the CTA's first instruction (global timer, ns)
  kScoreEndNs,           // its last math warpgroup done (global timer, ns)
  kScoreStartCycles,     // the same start, SM cycles; then the milestones, SM cycles:
  kScoreWaitedCycles,    // past griddepcontrol.wait (the stream's previous kernel done)
  kScoreRangedCycles,    // the CTA's page range and first row known (0: a CTA with no pages)
  kScoreIssuedCycles,    // the first page's TMA issued (producer warp 0)
  kScoreQReadyCycles,    // the first segment's Q arrived (math thread 0)
  kScoreFirstPageCycles, // the first page arrived (math thread 0, the CTA's page 0)
  kScoreEndCycles,       // the last math warpgroup done
  // Inside the spans above (SM cycles), each stamped once its loaded value is in a register:
  kScoreLensCycles,      // thread 0's seq_lens entry arrived (inside "ranged")
  kScoreScannedCycles,   // the first tile of rows scanned (inside "ranged")
  kScoreQIssuedCycles,   // the first segment's Q TMA issued (producer warp 0, inside "issued")
  kScoreIdsCycles,       // the first page's id arrived from the block table (inside "issued")
  kScoreL2HitCycles,     // not a mark: cycles of one load of a line L2 holds, timed in the CTA
  kScoreStampWords
};
constexpr int kMaxScoreStampSlots = 1024;
constexpr long long kNeverLoaded = -0x5bd1e995;  // no seq_lens entry, page id or scan total

// CTA `cta`'s slot of the scoring stamps (`buffer`: the region's start), or null.
__device__ __forceinline__ unsigned long long* ScoreStampSlot(unsigned long long* buffer, uint32_t cta) {
  return StampSlotIn<kScoreStampWords, kMaxScoreStampSlots>(buffer, cta);
}
// By one thread of the CTA (null words: nothing).
__device__ __forceinline__ void StampScoreStart(unsigned long long* words) {
  StampTimesInto(words, kScoreStartNs, kScoreStartCycles);
}
__device__ __forceinline__ void StampScoreAt(unsigned long long* words, ScoreStamp at) { StampCyclesInto(words, at); }
// The same once `loaded` (a load's result) is in a register: the branch on it waits for the load,
// so the cycle counter is read after it (only an input holding kNeverLoaded itself skips the stamp).
__device__ __forceinline__ void StampScoreOnceLoaded(unsigned long long* words, ScoreStamp at, long long loaded) {
  if (loaded != kNeverLoaded) StampScoreAt(words, at);
}
// One L2 round trip timed in place: `line` was read moments before by this CTA, so it is in L2;
// ld.global.cg skips L1. The chain's own loads are compared with it.
__device__ __forceinline__ void StampScoreL2Hit(unsigned long long* words, const int32_t* line) {
  if (words == nullptr) return;
  const long long t0 = clock64();
  int32_t value;
  asm volatile("ld.global.cg.b32 %0, [%1];" : "=r"(value) : "l"(line) : "memory");
  if (value != static_cast<int32_t>(kNeverLoaded)) words[kScoreL2HitCycles] = clock64() - t0;
}
// By the first thread of each math warpgroup: the CTA's end is the last of theirs.
__device__ __forceinline__ void StampScoreEnd(unsigned long long* words) {
  if (words != nullptr) {
    atomicMax(words + kScoreEndCycles, static_cast<unsigned long long>(clock64()));
    atomicMax(words + kScoreEndNs, static_cast<unsigned long long>(GlobalTimerNs()));
  }
}

}  // namespace ffi_dsa::sm90
