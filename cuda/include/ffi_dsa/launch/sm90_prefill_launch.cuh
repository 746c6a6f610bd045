// One prefill call on the sm90 path: PrefillRowsKernel, a CTA per block of query rows, on the
// caller's stream. No workspace and nothing read back on the host, so a call can be captured in a
// CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ffi_dsa/impls/sm90_prefill_rows.cuh"
#include "ffi_dsa/launch/kernel_launch.cuh"
#include "ffi_dsa/launch/sm90_prefill_tensor_maps.h"
#include "ffi_dsa/launch/tuning.h"
#include "ffi_dsa/validate/prefill.h"

namespace ffi_dsa::sm90 {

template <int kHeads>
void LaunchPrefill(const PrefillArgs& a, const Tuning& tuning, cudaStream_t stream, bool sorted_by_score,
                   bool absolute_ids) {
  PrefillParams p{};
  p.weights = a.weights;
  p.ks = a.ks;
  p.ke = a.ke;
  p.topk_indices = a.topk_indices;
  p.rows = a.rows;
  p.num_keys = a.num_keys;
  p.topk = static_cast<int32_t>(a.topk);
  p.sorted = sorted_by_score;
  p.absolute_ids = absolute_ids;
  const int64_t blocks = (a.rows + kPrefillBlockRows - 1) / kPrefillBlockRows;
  Launch(static_cast<unsigned>(blocks), kPrefillThreads, PrefillSmemBytes<kHeads>(), stream, 0,
         tuning.programmatic_launch)
      .Run(PrefillRowsKernel<kHeads>, PrefillKeysTensorMap(a), PrefillScalesTensorMap(a),
           PrefillQTensorMap(a, kPrefillBlockRows), p);
}

}  // namespace ffi_dsa::sm90
