// What a CPU work item is, for every page format (FP8, MXFP4): a run of one row's pages and the
// query rows that see them, and the loop that prepares those queries and scores each page with a
// variant's functions, never dereferencing an invalid page id.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/cpu/page_queries.h"
#include "ffi_dsa/rank_key.h"

namespace ffi_dsa::cpu {

// One query row of a work item: its q and weights, the tokens it sees, and its keys by position.
struct QueryRowView {
  const uint8_t* q;
  const float* weights;
  int64_t length;
  uint32_t* keys;
  const int32_t* q_scale = nullptr;  // the page formats whose queries carry scales (MXFP4): H of them
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

// Scores one work item with a variant's query preparation and page scoring, on pages of
// kBytesPerPage bytes (the page format's); plain code around the variant's functions, so it needs
// no ISA of its own.
template <typename Query, void (*Prepare)(const QueryRowView&, Query*),
          void (*Score)(const PageQueries<Query>&, const uint8_t*), int64_t kBytesPerPage>
void ScoreRowPages(const RowPages& r) {
  // Every item prepares its own queries (small next to scoring the item's pages). The prepared
  // queries (kMaxQueries of them, too large for a thread's stack) live in thread-local memory.
  thread_local std::vector<Query> prepared(kMaxQueries);
  for (int i = 0; i < r.num_queries; ++i) Prepare(r.queries[i], &prepared[i]);
  for (int64_t p = r.first_page; p < r.end_page; ++p) {
    const PageQueries<Query> queries = QueriesOfPage(r, prepared.data(), p);
    const int32_t page = r.table_row[p];
    if (page < 0 || page >= r.num_pages) {  // never dereferenced: its tokens are no candidates
      for (int i = 0; i < queries.size; ++i) std::fill_n(queries.keys[i], queries.count[i], kNotCandidate);
      continue;
    }
    // (queries.size >= 1: an item's pages end at its longest query's last page, WorkItems)
    Score(queries, r.k_cache + static_cast<int64_t>(page) * kBytesPerPage);
  }
}

using ScoreRowPagesFn = void (*)(const RowPages&);

// A query preparation that reads only a row's q and weights (the FP8 variants'), as ScoreRowPages calls it.
template <typename Query, void (*Prepare)(const uint8_t*, const float*, Query*)>
void PrepareFromQandWeights(const QueryRowView& v, Query* out) {
  Prepare(v.q, v.weights, out);
}

}  // namespace ffi_dsa::cpu
