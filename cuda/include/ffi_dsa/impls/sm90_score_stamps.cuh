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
  kScoreStampWords
};
constexpr int kMaxScoreStampSlots = 1024;

// CTA `cta`'s slot of the scoring stamps (`buffer`: the region's start), or null.
__device__ __forceinline__ unsigned long long* ScoreStampSlot(unsigned long long* buffer, uint32_t cta) {
  return buffer != nullptr && cta < kMaxScoreStampSlots ? buffer + cta * kScoreStampWords : nullptr;
}
// By one thread of the CTA (null words: nothing).
__device__ __forceinline__ void StampScoreStart(unsigned long long* words) {
  if (words != nullptr) words[kScoreStartNs] = GlobalTimerNs(), words[kScoreStartCycles] = clock64();
}
__device__ __forceinline__ void StampScoreAt(unsigned long long* words, ScoreStamp at) {
  if (words != nullptr) words[at] = clock64();
}
// By the first thread of each math warpgroup: the CTA's end is the last of theirs.
__device__ __forceinline__ void StampScoreEnd(unsigned long long* words) {
  if (words != nullptr) {
    atomicMax(words + kScoreEndCycles, static_cast<unsigned long long>(clock64()));
    atomicMax(words + kScoreEndNs, static_cast<unsigned long long>(GlobalTimerNs()));
  }
}

}  // namespace ffi_dsa::sm90
