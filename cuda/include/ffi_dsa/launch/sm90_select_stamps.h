// The select's phase stamps and the scoring kernel's (launch/tuning.h: stamp_select), a benchmark's
// instrument: one buffer per device, owned by the module, that the selects write
// (impls/sm90_select_stamps.cuh: kSelectStampWords words a slot, kMaxSelectStampSlots slots), then
// a region that ScorePagesKernel's CTAs write (impls/sm90_score_stamps.cuh: kScoreStampWords words
// a CTA, kMaxScoreStampSlots CTAs); the module's select_stamps and score_stamps read them back.
// Defined in cuda/csrc/sm_90a/decode.cu.
#pragma once

#include <cstdint>
#include <vector>

namespace ffi_dsa::sm90 {

// The device's stamp buffer, allocated and zeroed on first use (the device is current).
unsigned long long* SelectStampBuffer(int device);
// Its scoring region (the same allocation).
unsigned long long* ScoreStampBuffer(int device);

// The first `slots` slots' words (at most the buffer's kMaxSelectStampSlots: later slots are never
// stamped) after the device's work so far; `clear` zeroes them afterwards,
// so that the next read shows only what later calls wrote.
std::vector<int64_t> ReadSelectStamps(int device, int64_t slots, bool clear);
// The same for the scoring region's first `ctas` slots (at most kMaxScoreStampSlots).
std::vector<int64_t> ReadScoreStamps(int device, int64_t ctas, bool clear);

}  // namespace ffi_dsa::sm90
