// The MXFP4 op on the CPU (docs/contract.md §9): the paged runner decode uses (paged_cpu.h: the
// same work items, selection, ids and masking), with 68-byte pages and the MXFP4 kernel of the
// scoring variant ActiveCpuKernel picks (the FP8 op's choice: set_cpu_kernel sets both).
#pragma once
#include "ffi_dsa/contract.h"
#include "ffi_dsa/cpu/dispatch.h"
#include "ffi_dsa/cpu/mxfp4_score_page.h"
#include "ffi_dsa/cpu/mxfp4_simd.h"
#include "ffi_dsa/cpu/paged_cpu.h"
#include "ffi_dsa/cpu/row_pages.h"
#include "ffi_dsa/validate/mxfp4.h"

namespace ffi_dsa::cpu {

template <typename Query, void (*Prepare)(const QueryRowView&, Query*),
          void (*Score)(const PageQueries<Query>&, const uint8_t*)>
void Mxfp4RowPages(const RowPages& r) {
  ScoreRowPages<Query, Prepare, Score, kMxfp4PageBytes>(r);
}

template <int kHeads>
ScoreRowPagesFn Mxfp4ScoreRowPagesFor(CpuKernel k) {
  switch (k) {
#if FFI_DSA_CPU_X86
    case CpuKernel::kAvx2:
      return Mxfp4RowPages<avx2::Mxfp4PreparedQuery<kHeads>, avx2::PrepareMxfp4Query<kHeads>,
                           avx2::ScoreMxfp4Page<kHeads>>;
    case CpuKernel::kAvx512:
      return Mxfp4RowPages<avx512::Mxfp4PreparedQuery<kHeads>, avx512::PrepareMxfp4Query<kHeads>,
                           avx512::ScoreMxfp4Page<kHeads>>;
    case CpuKernel::kAvx512Bf16:
      return Mxfp4RowPages<avx512bf16::Mxfp4PreparedQuery<kHeads>, avx512bf16::PrepareMxfp4Query<kHeads>,
                           avx512bf16::ScoreMxfp4Page<kHeads>>;
#endif
    default:
      return Mxfp4RowPages<scalar::Mxfp4PreparedQuery<kHeads>, scalar::PrepareMxfp4Query<kHeads>,
                           scalar::ScoreMxfp4Page<kHeads>>;
  }
}

inline void RunMxfp4Cpu(const Mxfp4Args& a, bool sorted_by_score, bool positions_as_ids) {
  const ScoreRowPagesFn score = a.heads == kNumHeadsNarrow ? Mxfp4ScoreRowPagesFor<kNumHeadsNarrow>(ActiveCpuKernel())
                                                           : Mxfp4ScoreRowPagesFor<kNumHeads>(ActiveCpuKernel());
  RunPagedCpu(a, PagedQueries{kMxfp4HeadBytes, a.q_scale}, score, sorted_by_score, positions_as_ids);
}

}  // namespace ffi_dsa::cpu
