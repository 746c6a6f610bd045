// Host-side schedule of the Hopper path, from shapes only (seq_lens stays on the device, so the
// launch is the same on every call and can be captured in a CUDA graph). The balance by actual
// lengths happens on the device (sm90_score_pages.cuh).
#pragma once
#include <algorithm>
#include <cstdint>

#include "ffi_dsa/contract.h"

namespace ffi_dsa::sm90 {

struct Schedule {
  bool fused;            // the fused path: FusedRowsKernel, one CTA per row; else the split path below
  int32_t score_ctas;    // ScorePagesKernel: one persistent CTA per SM (fewer if there are fewer pages)
  int32_t cluster_size;  // SelectRowsKernel: CTAs per query row
  int32_t select_threads;  // SelectRowsKernel: threads a CTA (kSelectRowsThreads or kPairedSelectThreads)
  bool longest_first;      // SelectRowsKernel: CTA c selects the query row of the c-th longest length
};

// ScorePagesKernel's split of the flat page sequence over `ctas` CTAs multiplies by this,
// ceil(2^32 / ctas) (sm90_score_pages.cuh: ShareStart), where a division would sit on every CTA's
// chain to its first page. 2^32 itself for one CTA, hence 64 bits.
inline uint64_t ScoreShareMultiplier(int64_t ctas) {
  return ((uint64_t(1) << 32) + static_cast<uint64_t>(ctas) - 1) / static_cast<uint64_t>(ctas);
}

// SelectRowsKernel's CTA sizes: one CTA an SM (and every cluster's), or two an SM.
constexpr int kSelectRowsThreads = 1024;
constexpr int kPairedSelectThreads = 512;

// FusedRowsKernel streams each row with the row's own CTA, and one CTA's TMA unit moves pages far
// slower than HBM delivers them: HBM speed takes most of the SMs streaming at once. So the fused
// path is chosen only when the batch has a row for at least kFusedMinSmShare of the SMs and every
// row fits its CTA's shared memory; otherwise the split path spreads all pages evenly over every
// SM. Example on 132 SMs (threshold 92.4 rows): B = 128 rows of 8K tokens -> fused; B = 64 or
// B = 8 x 64K -> split. From shapes only: the table width, not seq_lens. (With N queries per row
// the CTA scores each page for all of them and selects them one after the other: the batch of
// rows, not of query rows, keeps the SMs streaming.)
constexpr double kFusedMinSmShare = 0.7;

// Most query rows a longest-first launch ranks: every CTA ranks every row's length (rows^2 / 32
// compares a warp), before its own wait for the scoring kernel's keys. Whole warps of rows.
constexpr int kLongestFirstMaxRows = 288;
static_assert(kLongestFirstMaxRows % 32 == 0 && kLongestFirstMaxRows < 512, "ranked in whole warps; 9-bit row ids");

// Up to 16 CTAs per select cluster (sm_90's non-portable maximum): a 128K row on 16 x 8K-key
// slices.
constexpr int kMaxSelectCluster = 16;

// Select clusters of c CTAs the device holds at once, for c = 1..kMaxSelectCluster (from the
// driver's occupancy query; 0 where c does not fit).
struct ClusterOccupancy {
  int32_t active[kMaxSelectCluster + 1];
};

// SelectRowsKernel gives a row one CTA up to slice_keys keys (sm90_select_rows.cuh: kSliceKeys), and
// a cluster of more CTAs beyond: cluster barriers and DSMEM reads add latency, so a cluster pays
// only for rows too long for one SM. Rows longer than the largest cluster's slices give each CTA a
// longer slice. The clusters are sized for `planned_tokens`, the longest row the call plans for:
// the block table's width, or the caller's bound on the batch's longest row (a serving engine's
// table is far wider than its rows). A row longer than planned still gets its exact top-K, from
// longer slices; a row of at most slice_keys tokens is a cluster's first CTA's alone.
// `fused_fits`: the fused path is enabled (launch/tuning.h) and a CTA's shared memory holds the row's
// N queries and N x the table's width of keys.
//
// Select CTAs of 1024 threads fill an SM each, so more single-CTA query rows than SMs (N = 4:
// B = 64 is 256 query rows, B = 128 is 512) run in waves, each wave waiting for its slowest row.
// There the select takes CTAs of 512 threads, two an SM: half the waves (one for up to 2 x SMs
// rows), each row on half the threads. `paired_staged_keys`: the keys such a CTA stages with two
// an SM at the launch's shared memory (sm90_device_facts.h; 0: two do not fit).
// But a row longer than a paired CTA stages reads L2 on every pass at half an SM's threads, and
// alone sets the tail of the one wave. So where the planned row is that long, yet staged whole by
// a 1024-thread CTA (`staged_keys`), and the query rows take two waves of those (at most 2 x SMs,
// and at most kLongestFirstMaxRows), the select keeps 1024 threads and runs the rows longest
// first: the first wave takes the long rows, each on a whole SM, and the second the short ones,
// which finish within the first's longest. A planned row past `staged_keys` is most often a wide
// table of short rows (no max_seq_len), which two waves would cost; those stay paired.
// `select_threads`: launch/tuning.h's knob (0: this rule). Clusters keep 1024 threads: their rows
// are the long ones. Any launch of single-CTA 1024-thread rows past one wave (up to
// kLongestFirstMaxRows) runs longest first: the order changes no output.
inline Schedule PlanSchedule(int64_t batch, int64_t queries, int64_t max_pages, int64_t planned_tokens, int num_sms,
                             int64_t slice_keys, const ClusterOccupancy& occupancy, bool fused_fits,
                             int64_t paired_staged_keys, int64_t staged_keys, int select_threads) {
  Schedule s;
  s.score_ctas = static_cast<int32_t>(std::clamp<int64_t>(batch * std::max<int64_t>(1, max_pages), 1,
                                                          std::max(1, num_sms)));
  int cluster =
      static_cast<int>(std::clamp<int64_t>((planned_tokens + slice_keys - 1) / slice_keys, 1, kMaxSelectCluster));
  // At most one wave (a second wave of clusters costs more than longer slices per CTA): the
  // largest cluster of which every query row's cluster is resident at once. A GPC holds whole
  // clusters, so that is not SMs / cluster size; a size that does not fit at all has 0. Example:
  // B = 8 rows of 64K tokens with N = 2 is 16 query rows that want 8 CTAs each; on a device that
  // holds 15 clusters of 8 or of 7 at once but 17 of 6 (an H100 SXM), each gets 6 CTAs of ~10.9K keys.
  const int64_t rows = batch * std::max<int64_t>(1, queries);
  while (cluster > 1 && occupancy.active[cluster] < rows) --cluster;
  s.cluster_size = cluster;
  const bool waves = rows > num_sms;
  const bool long_rows_two_waves = rows <= std::min<int64_t>(2 * int64_t(num_sms), kLongestFirstMaxRows) &&
                                   planned_tokens > paired_staged_keys && planned_tokens <= staged_keys;
  int one_cta = waves && !long_rows_two_waves ? kPairedSelectThreads : kSelectRowsThreads;
  if (select_threads != 0) one_cta = select_threads;
  s.select_threads = cluster == 1 && paired_staged_keys > 0 ? one_cta : kSelectRowsThreads;
  s.longest_first = cluster == 1 && waves && rows <= kLongestFirstMaxRows && s.select_threads == kSelectRowsThreads;
  s.fused = fused_fits && static_cast<double>(batch) >= kFusedMinSmShare * num_sms;
  return s;
}

}  // namespace ffi_dsa::sm90
