// The select's phase stamps (launch/tuning.h: stamp_select), a benchmark's instrument that changes
// no output: the first thread of a select writes the global timer when the select may start (the
// fused kernel: its row's last page scored; SelectRowsKernel: the scoring grid's keys readable) and
// when its last id is written, and the SM's cycle counter at each phase boundary; the fused kernel
// also the global timer when its CTA starts on the row's pages (the page loop's own time). Into a
// buffer of the module's (launch/sm90_select_stamps.h). One slot of kSelectStampWords words per select: slot
// rank x query rows + query row (rank: the CTA's in its cluster; 0 on the fused path). Cycles, not
// the global timer, for the phases: they are a few hundred ns to a few µs, and the cycle counter is
// the SM's own (every stamp of a slot comes from one SM). One word is a count, not a time: the
// threshold bin's keys, on which the resolve's cost depends.
#pragma once
#include <cstdint>

#include "ffi_dsa/impls/sm90_ptx.cuh"

namespace ffi_dsa::sm90 {

enum SelectStamp : int {
  kStampStartNs,          // the select may start (global timer, ns)
  kStampDoneNs,           // its last id is written (global timer, ns)
  kStampStartCycles,      // the same moments and the phase ends between them, SM cycles:
  kStampBinnedCycles,     // the histogram complete (SelectRowsKernel: the keys staged)
  kStampThresholdCycles,  // the threshold bin found
  kStampMembersCycles,    // the member pass and the totals
  kStampResolvedCycles,   // the cut decided (members ranked and marked, or the bin refined)
  kStampDoneCycles,       // the last id written
  kStampScoreNs,          // the fused kernel: its CTA starts on the row's pages (global timer, ns; 0 on the split path)
  kStampBinKeys,          // not a time: the row's keys in the threshold bin (what the resolve ranks)
  kSelectStampWords
};
constexpr int kMaxSelectStampSlots = 4096;

// Slot `slot` of a buffer, or null (no buffer, or past the buffer's slots). The select keeps its
// slot in shared memory (topk::Storage::stamps), not in a register: the split path's select runs
// at 64 registers a thread.
__device__ __forceinline__ unsigned long long* StampSlot(unsigned long long* buffer, int64_t slot) {
  return StampSlotIn<kSelectStampWords, kMaxSelectStampSlots>(buffer, slot);
}
// By one thread of the select (null words: nothing).
__device__ __forceinline__ void StampStart(unsigned long long* words) {
  StampTimesInto(words, kStampStartNs, kStampStartCycles);
}
__device__ __forceinline__ void StampAt(unsigned long long* words, SelectStamp at) { StampCyclesInto(words, at); }
__device__ __forceinline__ void StampCount(unsigned long long* words, SelectStamp at, uint32_t count) {
  if (words != nullptr) words[at] = count;
}
__device__ __forceinline__ void StampScore(unsigned long long* words) {
  if (words != nullptr) words[kStampScoreNs] = GlobalTimerNs();
}
__device__ __forceinline__ void StampDone(unsigned long long* words) {
  if (words != nullptr) words[kStampDoneCycles] = clock64(), words[kStampDoneNs] = GlobalTimerNs();
}

}  // namespace ffi_dsa::sm90
