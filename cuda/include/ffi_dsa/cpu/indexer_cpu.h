// The CPU path: score every token (pages spread over threads), then select per row (rows spread
// over threads). Device-only facts are masked here exactly as on the GPU: invalid page ids are
// never dereferenced, lengths are clamped to [0, max_pages * 64].
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/cpu/dispatch.h"
#include "ffi_dsa/cpu/select_topk.h"
#include "ffi_dsa/validate.h"

namespace ffi_dsa::cpu {

inline int64_t ClampedLength(const IndexerArgs& a, int64_t b) {
  return ClampLength(a.seq_lens[b], a.max_pages);
}

constexpr int kMaxCpuThreads = 1024;  // more would only add start-up cost

// Threads the caller asked for with SetCpuThreads (ffi_dsa.set_cpu_threads); 0 = not set.
inline std::atomic<int>& RequestedCpuThreads() {
  static std::atomic<int> requested{0};
  return requested;
}

// Threads: set_cpu_threads if set, else FFI_DSA_NUM_THREADS if set (read on every call), else every
// core, at most kMaxCpuThreads whichever it is; small calls stay on the caller's thread because
// starting a thread costs more than scoring a few pages.
inline int ThreadCount(int64_t total_pages) {
  constexpr int64_t kPagesPerThreadMin = 64;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  if (const char* env = std::getenv("FFI_DSA_NUM_THREADS")) threads = std::atoi(env);
  if (const int requested = RequestedCpuThreads().load(std::memory_order_relaxed); requested > 0) threads = requested;
  threads = std::clamp(threads, 1, kMaxCpuThreads);
  return static_cast<int>(std::min<int64_t>(threads, std::max<int64_t>(1, total_pages / kPagesPerThreadMin)));
}

template <typename Fn>
void ParallelFor(int threads, int64_t count, Fn&& fn) {
  if (threads <= 1 || count <= 1) {
    for (int64_t i = 0; i < count; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) fn(i);
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
}

// The calling thread's key buffer, kept between calls: a fresh one (4 bytes a token) would be
// page-faulted and zeroed by the kernel on every call. Every key is written before it is read.
inline std::vector<uint32_t>& CallerKeyBuffer() {
  thread_local std::vector<uint32_t> keys;
  return keys;
}

inline void RunIndexerCpu(const IndexerArgs& a, bool sorted_by_score) {
  if (a.batch == 0 || a.topk == 0) return;
  // Token offsets of each row in one flat key buffer.
  std::vector<int64_t> row_offset(a.batch + 1, 0);
  for (int64_t b = 0; b < a.batch; ++b) row_offset[b + 1] = row_offset[b] + ClampedLength(a, b);
  std::vector<uint32_t>& keys = CallerKeyBuffer();  // a reference: the workers must share this one
  keys.resize(static_cast<size_t>(row_offset[a.batch]));

  // Work items are groups of pages of one row, so a single long row still uses every core.
  constexpr int64_t kPagesPerItem = 16;
  struct Item { int64_t row, first_page, end_page; };
  std::vector<Item> items;
  int64_t total_pages = 0;
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t pages = (ClampedLength(a, b) + kPageTokens - 1) / kPageTokens;
    total_pages += pages;
    for (int64_t p = 0; p < pages; p += kPagesPerItem) items.push_back({b, p, std::min(pages, p + kPagesPerItem)});
  }
  const int threads = ThreadCount(total_pages);
  const ScoreRowPagesFn score = ScoreRowPagesFor(ActiveCpuKernel());

  ParallelFor(threads, static_cast<int64_t>(items.size()), [&](int64_t i) {
    const Item& it = items[i];
    score({a.q + it.row * kNumHeads * kHeadDim, a.weights + it.row * kNumHeads, a.k_cache,
           a.block_table + it.row * a.max_pages, it.first_page, it.end_page, ClampedLength(a, it.row),
           a.num_pages, keys.data() + row_offset[it.row]});
  });
  ParallelFor(std::min<int64_t>(threads, a.batch), a.batch, [&](int64_t b) {
    thread_local SelectScratch scratch;
    thread_local std::vector<int64_t> positions;
    positions.resize(a.topk);
    const int64_t n = ClampedLength(a, b);
    SelectTopK(keys.data() + row_offset[b], n, a.topk, sorted_by_score, &scratch, positions.data());
    int32_t* out = a.topk_indices + b * a.topk;
    const int32_t* table = a.block_table + b * a.max_pages;
    for (int64_t i = 0; i < a.topk; ++i) {
      const int64_t t = positions[i];
      out[i] = t < 0 ? -1 : GlobalTokenId(table, t);
    }
  });
}

}  // namespace ffi_dsa::cpu
