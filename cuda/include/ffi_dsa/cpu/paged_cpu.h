// The CPU path of the paged ops (decode over FP8 pages, MXFP4 pages): score every token (pages
// spread over threads; each page once for all the query rows of its row that see it), then select
// per query row (query rows spread over threads). Only the scoring depends on the page format; the
// selection, ids, -1 tail and the masking of device-only facts are one code for all: invalid page
// ids are never dereferenced, lengths are clamped to [0, max_pages * 64], exactly as on the GPU.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/cpu/parallel.h"
#include "ffi_dsa/cpu/row_pages.h"
#include "ffi_dsa/cpu/select_topk.h"
#include "ffi_dsa/validate/decode.h"

namespace ffi_dsa::cpu {

// Where a page format's queries live: q_head_bytes per head of q, and (MXFP4) one int32 of scale
// bytes per head, [B * N, H].
struct PagedQueries {
  int64_t q_head_bytes;
  const int32_t* q_scale = nullptr;
};

// Tokens each query row sees (docs/contract.md §7), and where its keys start in one flat buffer.
struct QueryRowLayout {
  std::vector<int64_t> length;  // [B * N]
  std::vector<int64_t> offset;  // [B * N + 1]
};

inline QueryRowLayout LayOutQueryRows(const IndexerArgs& a) {
  const int64_t rows = a.query_rows();
  QueryRowLayout out{std::vector<int64_t>(rows), std::vector<int64_t>(rows + 1, 0)};
  for (int64_t qr = 0; qr < rows; ++qr) {
    out.length[qr] = a.VisibleLength(qr);
    out.offset[qr + 1] = out.offset[qr] + out.length[qr];
  }
  return out;
}

// Work items are groups of pages of one row, so a single long row still uses every core; each
// lists the row's query rows that see its pages. `query_pages` gets the pages the items score,
// counted once per query row that sees them.
inline std::vector<RowPages> WorkItems(const IndexerArgs& a, const PagedQueries& format, const QueryRowLayout& layout,
                                       uint32_t* keys, int64_t* query_pages) {
  constexpr int64_t kPagesPerItem = 16;
  std::vector<RowPages> items;
  *query_pages = 0;
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t first_qr = b * a.queries;
    const int64_t longest = *std::max_element(&layout.length[first_qr], &layout.length[first_qr] + a.queries);
    for (int64_t p = 0; p < PagesOf(longest); p += kPagesPerItem) {
      RowPages item{a.k_cache, a.block_table + b * a.max_pages, p, std::min(PagesOf(longest), p + kPagesPerItem),
                    a.num_pages, {}, 0};
      for (int64_t qr = first_qr; qr < first_qr + a.queries; ++qr) {
        if (layout.length[qr] <= p * kPageTokens) continue;  // its prefix ends before the item
        item.queries[item.num_queries++] = {
            a.q + qr * a.heads * format.q_head_bytes, a.weights + qr * a.heads, layout.length[qr],
            keys + layout.offset[qr], format.q_scale == nullptr ? nullptr : format.q_scale + qr * a.heads};
        *query_pages += std::min(PagesOf(layout.length[qr]), item.end_page) - p;
      }
      items.push_back(item);
    }
  }
  return items;
}

// Selects query row qr's top-K from its keys and writes their ids: each token's position t in its
// row (ids="positions"), or its global slot through the row's block table.
inline void SelectQueryRow(const IndexerArgs& a, const QueryRowLayout& layout, const uint32_t* keys, int64_t qr,
                           bool sorted_by_score, bool positions_as_ids) {
  thread_local SelectScratch scratch;
  thread_local std::vector<int64_t> positions;
  positions.resize(a.topk);
  SelectTopK(keys + layout.offset[qr], layout.length[qr], a.topk, sorted_by_score, &scratch, positions.data());
  int32_t* out = a.topk_indices + qr * a.topk;
  const int32_t* table = a.block_table + (qr / a.queries) * a.max_pages;
  for (int64_t i = 0; i < a.topk; ++i) {
    const int64_t t = positions[i];
    out[i] = t < 0 ? -1 : (positions_as_ids ? static_cast<int32_t>(t) : GlobalTokenId(table, t));
  }
}

// Scores every token a query row sees with `score` (the page format's, ActiveCpuKernel's variant)
// into the caller's key buffer, then selects each query row's top-K: the same selection, ids and
// masking for every page format.
inline void RunPagedCpu(const IndexerArgs& a, const PagedQueries& format, ScoreRowPagesFn score, bool sorted_by_score,
                        bool positions_as_ids) {
  if (a.batch == 0 || a.topk == 0) return;
  const QueryRowLayout layout = LayOutQueryRows(a);
  std::vector<uint32_t>& keys = CallerKeyBuffer();  // a reference: the workers must share this one
  keys.resize(static_cast<size_t>(layout.offset.back()));
  int64_t query_pages = 0;
  const std::vector<RowPages> items = WorkItems(a, format, layout, keys.data(), &query_pages);
  const int threads = ThreadCount(query_pages);

  ParallelFor(threads, static_cast<int64_t>(items.size()), [&](int64_t i) { score(items[i]); });
  const int64_t rows = a.query_rows();
  ParallelFor(std::min<int64_t>(threads, rows), rows,
              [&](int64_t qr) { SelectQueryRow(a, layout, keys.data(), qr, sorted_by_score, positions_as_ids); });
}

}  // namespace ffi_dsa::cpu
