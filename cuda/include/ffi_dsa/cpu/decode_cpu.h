// Decode on the CPU over FP8 pages (docs/contract.md): the paged runner (paged_cpu.h) with the FP8
// scoring variant ActiveCpuKernel picks (dispatch.h).
#pragma once
#include "ffi_dsa/contract.h"
#include "ffi_dsa/cpu/dispatch.h"
#include "ffi_dsa/cpu/paged_cpu.h"
#include "ffi_dsa/validate/decode.h"

namespace ffi_dsa::cpu {

inline void RunIndexerCpu(const IndexerArgs& a, bool sorted_by_score, bool positions_as_ids) {
  RunPagedCpu(a, PagedQueries{kHeadDim}, ScoreRowPagesFor(ActiveCpuKernel(), a.heads), sorted_by_score,
              positions_as_ids);
}

}  // namespace ffi_dsa::cpu
