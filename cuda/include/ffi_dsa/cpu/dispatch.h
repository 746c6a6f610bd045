// Run-time choice of the CPU scoring variant: the best one this CPU supports, unless the caller
// forces one (SetCpuKernel, exported to Python as ffi_dsa.set_cpu_kernel; the tests force each).
// The choice is read on every call, so it can change between calls of one process.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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

// One work item: pages [first_page, end_page) of one row, whose keys go to row_keys by position.
struct RowPages {
  const uint8_t* q_row;
  const float* weights_row;
  const uint8_t* k_cache;
  const int32_t* table_row;
  int64_t first_page, end_page, length, num_pages;
  uint32_t* row_keys;
};

// Scores one work item with a variant's query preparation and page scoring; plain code around
// the variant's functions, so it needs no ISA of its own.
template <typename Query, void (*Prepare)(const uint8_t*, const float*, Query*),
          void (*Score)(const Query&, const uint8_t*, int, uint32_t*)>
void ScoreRowPages(const RowPages& r) {
  // Preparing the query costs a few percent of an item's scoring, so every item does its own.
  Query pq;
  Prepare(r.q_row, r.weights_row, &pq);
  for (int64_t p = r.first_page; p < r.end_page; ++p) {
    const int64_t first = p * kPageTokens;
    const int count = static_cast<int>(std::min<int64_t>(kPageTokens, r.length - first));
    const int32_t page = r.table_row[p];
    if (page < 0 || page >= r.num_pages) {  // never dereferenced: its tokens are no candidates
      std::fill(r.row_keys + first, r.row_keys + first + count, kNotCandidate);
      continue;
    }
    Score(pq, r.k_cache + static_cast<int64_t>(page) * kPageBytes, count, r.row_keys + first);
  }
}

using ScoreRowPagesFn = void (*)(const RowPages&);

inline ScoreRowPagesFn ScoreRowPagesFor(CpuKernel k) {
  switch (k) {
#if FFI_DSA_CPU_X86
    case CpuKernel::kAvx2:
      return ScoreRowPages<avx2::PreparedQuery, avx2::PrepareQuery, avx2::ScorePage>;
    case CpuKernel::kAvx512:
      return ScoreRowPages<avx512::PreparedQuery, avx512::PrepareQuery, avx512::ScorePage>;
    case CpuKernel::kAvx512Bf16:
      return ScoreRowPages<avx512bf16::PreparedQuery, avx512bf16::PrepareQuery, avx512bf16::ScorePage>;
#endif
    default:
      return ScoreRowPages<scalar::PreparedQuery, scalar::PrepareQuery, scalar::ScorePage>;
  }
}

}  // namespace ffi_dsa::cpu
