// Host-side schedule of the Hopper path, from shapes only (seq_lens stays on the device, so the
// launch is the same on every call and can be captured in a CUDA graph). The balance by actual
// lengths happens on the device (sm90_score_pages.cuh).
#pragma once
#include <algorithm>
#include <cstdint>

#include "ffi_dsa/contract.h"

namespace ffi_dsa::sm90 {

struct Schedule {
  bool fused;            // one kernel, one CTA per row (impls/sm90_fused_rows.cuh); else the two below
  int32_t score_ctas;    // kernel 1: one persistent CTA per SM (fewer if there are fewer pages)
  int32_t cluster_size;  // kernel 2: CTAs per query row
};

// The fused kernel streams each row with the row's own CTA, and one CTA pulls at most ~33 GB/s
// (one 8.4 KB page per ~450 cycles, v5 trace): it is chosen only when the batch keeps most SMs
// streaming (~92 CTAs reach HBM speed on the H100) and every row fits its CTA's shared memory.
// From shapes only: the table width, not seq_lens. (With N queries per row the CTA scores each
// page for all of them and selects them one after the other: the batch of rows, not of query
// rows, keeps the SMs streaming.)
constexpr double kFusedMinSmShare = 0.7;

// Up to 16 CTAs per select cluster (H100's non-portable maximum): a 128K row on 16 x 8K-key
// slices.
constexpr int kMaxSelectCluster = 16;

// Select clusters of c CTAs the device holds at once, for c = 1..kMaxSelectCluster (from the
// driver's occupancy query; 0 where c does not fit).
struct ClusterOccupancy {
  int32_t active[kMaxSelectCluster + 1];
};

// Kernel 2 gives a row one CTA up to slice_keys keys (sm90_select_rows.cuh: kSliceKeys), and a
// cluster of more CTAs beyond: cluster barriers and DSMEM reads add latency, so a cluster pays only
// for rows too long for one SM. Rows longer than the largest cluster's slices give each CTA a
// longer slice.
// `fused_fits`: the one-kernel path is on and a CTA's shared memory holds the row's N queries
// and N x the table's width of keys.
inline Schedule PlanSchedule(int64_t batch, int64_t queries, int64_t max_pages, int num_sms, int64_t slice_keys,
                             const ClusterOccupancy& occupancy, bool fused_fits) {
  const int64_t max_tokens = std::max<int64_t>(1, max_pages) * kPageTokens;
  Schedule s;
  s.score_ctas = static_cast<int32_t>(std::clamp<int64_t>(batch * std::max<int64_t>(1, max_pages), 1,
                                                          std::max(1, num_sms)));
  int cluster =
      static_cast<int>(std::clamp<int64_t>((max_tokens + slice_keys - 1) / slice_keys, 1, kMaxSelectCluster));
  // At most one wave (a second wave of clusters costs more than longer slices per CTA: NOTES): the
  // largest cluster of which every query row's cluster is resident at once. A GPC holds whole
  // clusters, so that is not SMs / cluster size; a size that does not fit at all has 0.
  const int64_t rows = batch * std::max<int64_t>(1, queries);
  while (cluster > 1 && occupancy.active[cluster] < rows) --cluster;
  s.cluster_size = cluster;
  s.fused = fused_fits && static_cast<double>(batch) >= kFusedMinSmShare * num_sms;
  return s;
}

}  // namespace ffi_dsa::sm90
