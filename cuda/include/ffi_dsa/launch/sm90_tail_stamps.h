// The fused path's tail stamps (launch/tuning.h: stamp_fused_tail), a benchmark's instrument: one
// buffer per device, owned by the module, that FusedRowsKernel's CTAs write (sm90_fused_rows.cuh:
// kTailStampWords words per row, the first kMaxTailStampCtas rows) and the module's
// fused_tail_stamps reads back. Defined in cuda/csrc/sm_90a/decode.cu.
#pragma once

#include <cstdint>
#include <vector>

namespace ffi_dsa::sm90 {

// The device's stamp buffer, allocated and zeroed on first use (the device is current).
unsigned long long* FusedTailStampBuffer(int device);

// The first `rows` rows' stamps (kTailStampWords each) after the device's work so far; `clear`
// zeroes them afterwards, so that the next read shows only what later calls wrote.
std::vector<int64_t> ReadFusedTailStamps(int device, int64_t rows, bool clear);

}  // namespace ffi_dsa::sm90
