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
};

// FusedRowsKernel streams each row with the row's own CTA, and one CTA's TMA unit moves pages far
// slower than HBM delivers them: HBM speed takes most of the SMs streaming at once. So the fused
// path is chosen only when the batch has a row for at least kFusedMinSmShare of the SMs and every
// row fits its CTA's shared memory; otherwise the split path spreads all pages evenly over every
// SM. Example on 132 SMs (threshold 92.4 rows): B = 128 rows of 8K tokens -> fused; B = 64 or
// B = 8 x 64K -> split. From shapes only: the table width, not seq_lens. (With N queries per row
// the CTA scores each page for all of them and selects them one after the other: the batch of
// rows, not of query rows, keeps the SMs streaming.)
constexpr double kFusedMinSmShare = 0.7;

// Up to 16 CTAs per select cluster (sm_90's non-portable maximum): a 128K row on 16 x 8K-key
// slices. A power of two, as every cluster size is.
constexpr int kMaxSelectCluster = 16;
static_assert((kMaxSelectCluster & (kMaxSelectCluster - 1)) == 0, "cluster sizes are powers of two");

// Select clusters of c CTAs the device holds at once, for c = 1..kMaxSelectCluster (from the
// driver's occupancy query; 0 where c does not fit).
struct ClusterOccupancy {
  int32_t active[kMaxSelectCluster + 1];
};

// SelectRowsKernel selects a row of at most `slice_keys` tokens (sm90_register_select.cuh:
// kRegSliceKeys) on one CTA, from registers; a longer row on a cluster of CTAs, one slice of at most
// `slice_keys` keys each, their histograms summed through distributed shared memory. The cluster
// size is a power of two (the histogram exchange pairs a bin's ranks on adjacent lanes), the
// smallest whose slices hold the longest row the call plans for, `planned_tokens` (the block
// table's width, or the caller's bound on the batch's longest row); a row planned for that way
// never takes the general passes (longer ones do: slower, never wrong). Then, if the device holds
// every query row's cluster at twice that size at once, twice that size: slices of half the keys
// shorten every step of the select, and an exchange costs about the same at any size. A size the
// device cannot place at all is halved. Examples on 132 SMs: 8 rows of 64K tokens take clusters of
// 8 (8K keys per CTA); 64 rows of up to 32K clusters of 2 (rows of at most 16K use the first CTA
// only); one row of 8K, or 16 of 4K, one CTA each.
// `fused_fits`: the fused path is enabled (launch/tuning.h) and a CTA's shared memory holds the row's
// N queries and N x the table's width of keys.
inline Schedule PlanSchedule(int64_t batch, int64_t queries, int64_t max_pages, int64_t planned_tokens, int num_sms,
                             int64_t slice_keys, const ClusterOccupancy& occupancy, bool fused_fits) {
  Schedule s;
  s.score_ctas = static_cast<int32_t>(std::clamp<int64_t>(batch * std::max<int64_t>(1, max_pages), 1,
                                                          std::max(1, num_sms)));
  const int64_t rows = batch * std::max<int64_t>(1, queries);
  int cluster = 1;
  while (cluster < kMaxSelectCluster && cluster * slice_keys < planned_tokens) cluster *= 2;
  if (cluster > 1 && cluster < kMaxSelectCluster && occupancy.active[2 * cluster] >= rows) cluster *= 2;
  while (cluster > 1 && occupancy.active[cluster] == 0) cluster /= 2;
  s.cluster_size = cluster;
  s.fused = fused_fits && static_cast<double>(batch) >= kFusedMinSmShare * num_sms;
  return s;
}

}  // namespace ffi_dsa::sm90
