// Run-time choice of the CPU scoring variant: the best one this CPU supports, unless the caller
// forces one (SetCpuKernel, exported to Python as ffi_dsa.set_cpu_kernel; the tests force each).
// The choice is read on every call, so it can change between calls of one process. It serves every
// page format: this file maps it to the FP8 kernels, mxfp4_cpu.h to the MXFP4 ones.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/cpu/page_queries.h"
#include "ffi_dsa/cpu/row_pages.h"
#include "ffi_dsa/cpu/score_page.h"
#include "ffi_dsa/cpu/score_simd.h"

namespace ffi_dsa::cpu {

enum class CpuKernel : int { kScalar = 0, kAvx2, kAvx512, kAvx512Bf16, kCount };
constexpr const char* kCpuKernelNames[] = {"scalar", "avx2", "avx512", "avx512bf16"};
static_assert(sizeof(kCpuKernelNames) / sizeof(kCpuKernelNames[0]) == static_cast<int>(CpuKernel::kCount));
constexpr int kAutoKernel = -1;

inline const char* CpuKernelName(CpuKernel k) { return kCpuKernelNames[static_cast<int>(k)]; }

inline std::optional<CpuKernel> ParseCpuKernel(const std::string& name) {
  for (int i = 0; i < static_cast<int>(CpuKernel::kCount); ++i) {
    if (name == kCpuKernelNames[i]) return static_cast<CpuKernel>(i);
  }
  return std::nullopt;
}

// Whether this CPU (and its OS, which must save the wider registers: the builtins check that)
// runs every instruction the variant was compiled for (its target attribute in score_simd.h).
inline bool CpuKernelSupported(CpuKernel k) {
#if FFI_DSA_CPU_X86
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  switch (k) {
    case CpuKernel::kScalar: return true;
    case CpuKernel::kAvx2: return avx2;
    case CpuKernel::kAvx512: return avx512;
    case CpuKernel::kAvx512Bf16: return avx512 && __builtin_cpu_supports("avx512bf16");
    default: return false;
  }
#else
  return k == CpuKernel::kScalar;
#endif
}

inline std::vector<CpuKernel> SupportedCpuKernels() {
  std::vector<CpuKernel> out;
  for (int i = 0; i < static_cast<int>(CpuKernel::kCount); ++i) {
    if (CpuKernelSupported(static_cast<CpuKernel>(i))) out.push_back(static_cast<CpuKernel>(i));
  }
  return out;
}

inline std::atomic<int>& ForcedCpuKernel() {
  static std::atomic<int> forced{kAutoKernel};
  return forced;
}

inline CpuKernel BestCpuKernel() {
  static const CpuKernel best = SupportedCpuKernels().back();  // the list runs slowest to fastest
  return best;
}

// The variant the next call uses: the forced one, else the best.
inline CpuKernel ActiveCpuKernel() {
  const int forced = ForcedCpuKernel().load(std::memory_order_relaxed);
  return forced == kAutoKernel ? BestCpuKernel() : static_cast<CpuKernel>(forced);
}

// An FP8 variant's work-item scoring: its query preparation reads a row's q and weights alone.
template <typename Query, void (*Prepare)(const uint8_t*, const float*, Query*),
          void (*Score)(const PageQueries<Query>&, const uint8_t*)>
void Fp8RowPages(const RowPages& r) {
  ScoreRowPages<Query, PrepareFromQandWeights<Query, Prepare>, Score, kPageBytes>(r);
}

template <int kHeads>
ScoreRowPagesFn ScoreRowPagesFor(CpuKernel k) {
  switch (k) {
#if FFI_DSA_CPU_X86
    case CpuKernel::kAvx2:
      return Fp8RowPages<avx2::PreparedQuery<kHeads>, avx2::PrepareQuery<kHeads>, avx2::ScorePage<kHeads>>;
    case CpuKernel::kAvx512:
      return Fp8RowPages<avx512::PreparedQuery<kHeads>, avx512::PrepareQuery<kHeads>, avx512::ScorePage<kHeads>>;
    case CpuKernel::kAvx512Bf16:
      return Fp8RowPages<avx512bf16::PreparedQuery<kHeads>, avx512bf16::PrepareQuery<kHeads>,
                           avx512bf16::ScorePage<kHeads>>;
#endif
    default:
      return Fp8RowPages<scalar::PreparedQuery<kHeads>, scalar::PrepareQuery<kHeads>, scalar::ScorePage<kHeads>>;
  }
}

// The scoring of variant k for H heads (validation admits kNumHeads and kNumHeadsNarrow only).
inline ScoreRowPagesFn ScoreRowPagesFor(CpuKernel k, int heads) {
  return heads == kNumHeadsNarrow ? ScoreRowPagesFor<kNumHeadsNarrow>(k) : ScoreRowPagesFor<kNumHeads>(k);
}

}  // namespace ffi_dsa::cpu
