// The seam between the arch-neutral CUDA binding (cuda/csrc/cuda_binding.cc) and the kernels of each
// GPU architecture. An arch's kernels are compiled in translation units of their own
// (cuda/csrc/sm_90a/*.cu, with that arch's -gencode only, in parallel with the others'), which
// define its entry points below; the build defines FFI_DSA_ARCH_SM_90A (and so on) for each arch it
// compiled, so the binding lists exactly those. What each arch is (name, compute capability) and
// what is known of it without a GPU is cuda_archs.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ffi_dsa/validate/decode.h"
#include "ffi_dsa/validate/prefill.h"

namespace ffi_dsa {

// Decode's scalar attributes: the output order, the ids' kind (ids="positions"), and the caller's
// bound on the batch's longest row (<= 0: unknown), which an arch may use to plan its work but
// never to cut a row.
struct DecodeOptions {
  bool sorted_by_score = false;
  bool positions = false;
  int64_t max_seq_len = 0;
};

// Each op's entry point on one arch: checked arguments (q's device is current), the caller's stream,
// the op's scalar attributes. It launches on that stream and returns; nothing is read back.
using DecodeEntry = void (*)(const IndexerArgs& a, cudaStream_t stream, const DecodeOptions& options);
using PrefillEntry = void (*)(const PrefillArgs& a, cudaStream_t stream, bool sorted_by_score, bool absolute_ids);

struct CudaArchEntries {
  const char* arch;  // a name of cuda_archs.h's kCudaArchs
  DecodeEntry topk_indexer;
  PrefillEntry prefill_topk_indexer;
};

namespace sm90 {
void TopkIndexer(const IndexerArgs& a, cudaStream_t stream, const DecodeOptions& options);  // csrc/sm_90a/decode.cu
void PrefillTopkIndexer(const PrefillArgs& a, cudaStream_t stream, bool sorted_by_score,
                        bool absolute_ids);  // csrc/sm_90a/prefill.cu
}  // namespace sm90

// The archs this module was built with; the last entry (no arch) ends the list.
inline constexpr CudaArchEntries kCompiledArchs[] = {
#ifdef FFI_DSA_ARCH_SM_90A
    {"sm_90a", sm90::TopkIndexer, sm90::PrefillTopkIndexer},
#endif
    {nullptr, nullptr, nullptr},
};

}  // namespace ffi_dsa
