// Prefill on the CPU (docs/contract.md, prefill): each query row scores its keys [ks, ke) with
// decode's scoring variants and selects with decode's SelectTopK, so scores, ranks, ties and NaN are
// decode's bit for bit. The variants read packed pages (64 fp8 rows, then 64 scales): a work item
// copies its keys and their scales into pages of that layout first (132 bytes a key, next to the
// 64 x H x 128 multiply-adds each query row spends on it), which also keeps the variants' reads
// past a query's last key inside the staged page rather than past the end of k.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/cpu/dispatch.h"
#include "ffi_dsa/cpu/parallel.h"
#include "ffi_dsa/cpu/select_topk.h"
#include "ffi_dsa/validate/prefill.h"

namespace ffi_dsa::cpu {

constexpr int64_t kPrefillBlocksPerItem = 16;  // 64-key blocks a work item stages and scores
// Keys (4 bytes each) one wave scores before it selects: bounds the key buffer however large M x N.
constexpr int64_t kPrefillWaveKeys = int64_t(1) << 22;

// A work item's staged pages are pages 0, 1, ... of its own little cache.
constexpr std::array<int32_t, kPrefillBlocksPerItem> kStagedPageIds = [] {
  std::array<int32_t, kPrefillBlocksPerItem> ids{};
  for (int32_t i = 0; i < kPrefillBlocksPerItem; ++i) ids[i] = i;
  return ids;
}();

// Consecutive query rows with one key start (a request's rows in a chunk), at most kMaxQueries: the
// rows one staged block is scored for, each over a prefix of the group's keys (causal ke).
struct PrefillGroup {
  int64_t first_row = 0, rows = 0, begin = 0, longest = 0;
};

inline std::vector<PrefillGroup> PrefillGroups(const PrefillArgs& a) {
  std::vector<PrefillGroup> groups;
  for (int64_t row = 0; row < a.rows; ++row) {
    const int64_t begin = a.KeyBegin(row), count = a.KeyCount(row);
    if (groups.empty() || groups.back().begin != begin || groups.back().rows == kMaxQueries) {
      groups.push_back({row, 0, begin, 0});
    }
    ++groups.back().rows;
    groups.back().longest = std::max(groups.back().longest, count);
  }
  return groups;
}

// Groups [first, end) whose rows score together: their keys fit kPrefillWaveKeys, or it is one group.
struct PrefillWave {
  size_t first = 0, end = 0;
  std::vector<int64_t> offset;  // each row's keys in the wave's buffer, [rows + 1]
};

inline PrefillWave NextWave(const PrefillArgs& a, const std::vector<PrefillGroup>& groups, size_t first) {
  PrefillWave w{first, first, {0}};
  while (w.end < groups.size()) {
    const PrefillGroup& g = groups[w.end];
    int64_t keys = w.offset.back();
    for (int64_t row = g.first_row; row < g.first_row + g.rows; ++row) keys += a.KeyCount(row);
    if (keys > kPrefillWaveKeys && w.end > w.first) break;
    for (int64_t row = g.first_row; row < g.first_row + g.rows; ++row) {
      w.offset.push_back(w.offset.back() + a.KeyCount(row));
    }
    ++w.end;
  }
  return w;
}

struct PrefillItem {
  const PrefillGroup* group;
  int64_t first_block, end_block;
};

inline std::vector<PrefillItem> PrefillItems(const std::vector<PrefillGroup>& groups, const PrefillWave& w) {
  std::vector<PrefillItem> items;
  for (size_t g = w.first; g < w.end; ++g) {
    const int64_t blocks = PagesOf(groups[g].longest);
    for (int64_t b = 0; b < blocks; b += kPrefillBlocksPerItem) {
      items.push_back({&groups[g], b, std::min(blocks, b + kPrefillBlocksPerItem)});
    }
  }
  return items;
}

// Copies the item's keys and scales into packed pages, one per 64-key block; a last block's unused
// rows keep older bytes, which the variants may decode but never rank.
inline void StageItemKeys(const PrefillArgs& a, const PrefillItem& item, uint8_t* pages) {
  const int64_t first_key = item.group->begin + item.first_block * kPageTokens;
  const int64_t keys = std::min(item.group->longest - item.first_block * kPageTokens,
                                (item.end_block - item.first_block) * kPageTokens);
  for (int64_t p = 0; p * kPageTokens < keys; ++p) {
    const int64_t key = first_key + p * kPageTokens, count = std::min<int64_t>(kPageTokens, keys - p * kPageTokens);
    uint8_t* page = pages + p * kPageBytes;
    std::memcpy(page, a.k + key * kHeadDim, static_cast<size_t>(count * kHeadDim));
    std::memcpy(page + kPageFp8Bytes, a.k_scale + key, static_cast<size_t>(count) * sizeof(float));
  }
}

// Scores one item's blocks for every row of its group that sees them, into the rows' key buffers.
inline void ScorePrefillItem(const PrefillArgs& a, const PrefillItem& item, const PrefillWave& w,
                             int64_t wave_first_row, uint32_t* keys, ScoreRowPagesFn score) {
  thread_local std::vector<uint8_t> pages(kPrefillBlocksPerItem * kPageBytes);
  StageItemKeys(a, item, pages.data());
  const int64_t blocks = item.end_block - item.first_block, skipped = item.first_block * kPageTokens;
  RowPages r{pages.data(), kStagedPageIds.data(), 0, blocks, blocks, {}, 0};
  const PrefillGroup& g = *item.group;
  for (int64_t row = g.first_row; row < g.first_row + g.rows; ++row) {
    const int64_t count = a.KeyCount(row);
    if (count <= skipped) continue;  // its keys end before the item
    r.queries[r.num_queries++] = {a.q + row * a.heads * kHeadDim, a.weights + row * a.heads, count - skipped,
                                  keys + w.offset[row - wave_first_row] + skipped};
  }
  score(r);
}

// Selects one row's top-K and writes its ids: positions relative to the row's clamped start, or
// (absolute_ids) rows of k.
inline void SelectPrefillRow(const PrefillArgs& a, const uint32_t* row_keys, int64_t row, bool sorted_by_score,
                             bool absolute_ids) {
  thread_local SelectScratch scratch;
  thread_local std::vector<int64_t> positions;
  positions.resize(a.topk);
  SelectTopK(row_keys, a.KeyCount(row), a.topk, sorted_by_score, &scratch, positions.data());
  const int64_t base = absolute_ids ? a.KeyBegin(row) : 0;
  int32_t* out = a.topk_indices + row * a.topk;
  for (int64_t i = 0; i < a.topk; ++i) out[i] = positions[i] < 0 ? -1 : static_cast<int32_t>(base + positions[i]);
}

inline void RunPrefillCpu(const PrefillArgs& a, bool sorted_by_score, bool absolute_ids) {
  if (a.rows == 0 || a.topk == 0) return;
  int64_t query_blocks = 0;
  for (int64_t row = 0; row < a.rows; ++row) query_blocks += PagesOf(a.KeyCount(row));
  const int threads = ThreadCount(query_blocks);  // may raise (FFI_DSA_NUM_THREADS): before any write
  const ScoreRowPagesFn score = ScoreRowPagesFor(ActiveCpuKernel(), a.heads);
  const std::vector<PrefillGroup> groups = PrefillGroups(a);
  std::vector<uint32_t>& keys = CallerKeyBuffer();  // a reference: the workers must share this one
  for (size_t next = 0; next < groups.size();) {
    const PrefillWave w = NextWave(a, groups, next);
    const int64_t first_row = groups[w.first].first_row;
    const int64_t rows = static_cast<int64_t>(w.offset.size()) - 1;
    keys.resize(static_cast<size_t>(w.offset.back()));
    const std::vector<PrefillItem> items = PrefillItems(groups, w);
    ParallelFor(threads, static_cast<int64_t>(items.size()),
                [&](int64_t i) { ScorePrefillItem(a, items[i], w, first_row, keys.data(), score); });
    ParallelFor(std::min<int64_t>(threads, rows), rows, [&](int64_t r) {
      SelectPrefillRow(a, keys.data() + w.offset[r], first_row + r, sorted_by_score, absolute_ids);
    });
    next = w.end;
  }
}

}  // namespace ffi_dsa::cpu
