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

#include "ffi_dsa/contract.h"
#include "ffi_dsa/cpu/page_queries.h"
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

// One query row of a work item: its q and weights, the tokens it sees, and its keys by position.
struct QueryRowView {
  const uint8_t* q;
  const float* weights;
  int64_t length;
  uint32_t* keys;
};

// One work item: pages [first_page, end_page) of one row, scored for each of the row's query rows
// that sees any of them (docs/contract.md §7: the N queries of a row share its block-table row).
struct RowPages {
  const uint8_t* k_cache;
  const int32_t* table_row;
  int64_t first_page, end_page, num_pages;
  QueryRowView queries[kMaxQueries];
  int num_queries;
};

// The query rows that see page p of a work item, with their prepared queries.
template <typename Query>
PageQueries<Query> QueriesOfPage(const RowPages& r, const Query* prepared, int64_t p) {
  PageQueries<Query> out;
  const int64_t first = p * kPageTokens;
  for (int i = 0; i < r.num_queries; ++i) {
    const int64_t seen = std::min<int64_t>(kPageTokens, r.queries[i].length - first);
    if (seen <= 0) continue;  // this query's prefix ends before the page
    out.query[out.size] = &prepared[i];
    out.count[out.size] = static_cast<int>(seen);
    out.keys[out.size] = r.queries[i].keys + first;
    ++out.size;
  }
  return out;
}

// Scores one work item with a variant's query preparation and page scoring; plain code around
// the variant's functions, so it needs no ISA of its own.
template <typename Query, void (*Prepare)(const uint8_t*, const float*, Query*),
          void (*Score)(const PageQueries<Query>&, const uint8_t*)>
void ScoreRowPages(const RowPages& r) {
  // Every item prepares its own queries (small next to scoring the item's pages). The prepared
  // queries (kMaxQueries of them, too large for a thread's stack) live in thread-local memory.
  thread_local std::vector<Query> prepared(kMaxQueries);
  for (int i = 0; i < r.num_queries; ++i) Prepare(r.queries[i].q, r.queries[i].weights, &prepared[i]);
  for (int64_t p = r.first_page; p < r.end_page; ++p) {
    const PageQueries<Query> queries = QueriesOfPage(r, prepared.data(), p);
    const int32_t page = r.table_row[p];
    if (page < 0 || page >= r.num_pages) {  // never dereferenced: its tokens are no candidates
      for (int i = 0; i < queries.size; ++i) std::fill_n(queries.keys[i], queries.count[i], kNotCandidate);
      continue;
    }
    // (queries.size >= 1: an item's pages end at its longest query's last page, WorkItems)
    Score(queries, r.k_cache + static_cast<int64_t>(page) * kPageBytes);
  }
}

using ScoreRowPagesFn = void (*)(const RowPages&);

template <int kHeads>
ScoreRowPagesFn ScoreRowPagesFor(CpuKernel k) {
  switch (k) {
#if FFI_DSA_CPU_X86
    case CpuKernel::kAvx2:
      return ScoreRowPages<avx2::PreparedQuery<kHeads>, avx2::PrepareQuery<kHeads>, avx2::ScorePage<kHeads>>;
    case CpuKernel::kAvx512:
      return ScoreRowPages<avx512::PreparedQuery<kHeads>, avx512::PrepareQuery<kHeads>, avx512::ScorePage<kHeads>>;
    case CpuKernel::kAvx512Bf16:
      return ScoreRowPages<avx512bf16::PreparedQuery<kHeads>, avx512bf16::PrepareQuery<kHeads>,
                           avx512bf16::ScorePage<kHeads>>;
#endif
    default:
      return ScoreRowPages<scalar::PreparedQuery<kHeads>, scalar::PrepareQuery<kHeads>, scalar::ScorePage<kHeads>>;
  }
}

// The scoring of variant k for H heads (validation admits kNumHeads and kNumHeadsNarrow only).
inline ScoreRowPagesFn ScoreRowPagesFor(CpuKernel k, int heads) {
  return heads == kNumHeadsNarrow ? ScoreRowPagesFor<kNumHeadsNarrow>(k) : ScoreRowPagesFor<kNumHeads>(k);
}

}  // namespace ffi_dsa::cpu
