// The scratch a decode call on the sm90 kernels may take, as a formula of shapes alone: callers that
// must hand the op its memory up front (XLA, through jax-tvm-ffi's workspace output) size it from
// here (cuda_workspace.h, by arch), and the launch takes exactly this much, so the two cannot
// disagree. Plain C++: the CPU module exports it too, because JAX asks at trace time, before any
// CUDA module is loaded.
#pragma once

#include <cstdint>

#include "ffi_dsa/contract.h"

namespace ffi_dsa::sm90 {

// Every workspace allocation is a multiple of this (and XLA's carve-outs start on 128 B).
constexpr int64_t kWorkspaceAlign = 256;

// The split path (ScorePagesKernel, then SelectRowsKernel) writes one 32-bit rank key per token slot
// of every query row's table width; the fused path and calls with no pages take nothing. This is the
// split path's need, so it bounds the call whichever path the schedule picks on the device.
inline int64_t WorkspaceBytes(int64_t query_rows, int64_t max_pages) {
  if (query_rows <= 0 || max_pages <= 0) return 0;
  const int64_t bytes = query_rows * max_pages * kPageTokens * static_cast<int64_t>(sizeof(uint32_t));
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

}  // namespace ffi_dsa::sm90
