// One decode call on the sm90 path: pick the schedule from shapes (sm90_schedule.h) and the knobs
// (tuning.h), then launch the kernels of impls/ on the caller's stream.
#pragma once

#include <cuda_runtime.h>
#include <tvm/ffi/extra/cuda/base.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "ffi_dsa/impls/sm90_fused_rows.cuh"
#include "ffi_dsa/impls/sm90_score_pages.cuh"
#include "ffi_dsa/impls/sm90_select_rows.cuh"
#include "ffi_dsa/launch/cuda_arch_entries.h"
#include "ffi_dsa/launch/kernel_launch.cuh"
#include "ffi_dsa/launch/sm90_decode_tensor_maps.h"
#include "ffi_dsa/launch/sm90_device_facts.h"
#include "ffi_dsa/launch/sm90_select_stamps.h"
#include "ffi_dsa/launch/sm90_workspace_bytes.h"
#include "ffi_dsa/launch/tuning.h"
#include "ffi_dsa/launch/workspace.h"
#include "ffi_dsa/sm90_schedule.h"
#include "ffi_dsa/validate/decode.h"

namespace ffi_dsa::sm90 {

// Whether FusedRowsKernel's CTA holds a row: its N queries' Q and N x the table's width of keys.
template <int kHeads, int kQueries>
bool FusedFits(const DeviceFacts& device, const Tuning& tuning, int64_t max_tokens) {
  return tuning.fused && kQueries * max_tokens <= kFusedMaxRowKeys &&
         FusedSmemBytes<kHeads, kQueries>(static_cast<uint32_t>(max_tokens)) <= device.max_smem_optin;
}

// The longest row the select plans for, in whole pages: the block table's width, or the caller's
// bound on the batch's longest row (DecodeOptions::max_seq_len, <= 0: unknown) when it is smaller.
// A bound only lowers the plan: rows beyond it stay correct. The one place the bound is clamped
// (beyond the table's capacity it says nothing more, and the clamp keeps the rounding in range).
inline int64_t PlannedTokens(const IndexerArgs& a, const DecodeOptions& o) {
  const int64_t max_tokens = std::max<int64_t>(1, a.max_pages) * kPageTokens;
  if (o.max_seq_len <= 0) return max_tokens;
  const int64_t bound = std::min(o.max_seq_len, max_tokens);
  return (bound + kPageTokens - 1) / kPageTokens * kPageTokens;
}

inline SelectParams SelectParamsOf(const IndexerArgs& a, const DecodeOptions& o, bool let_next_in) {
  SelectParams sel{};
  sel.seq_lens = a.seq_lens;
  sel.block_table = a.block_table;
  sel.topk_indices = a.topk_indices;
  sel.row_stride = a.max_pages * kPageTokens;
  sel.num_pages = a.num_pages;
  sel.max_pages = static_cast<int32_t>(a.max_pages);
  sel.topk = static_cast<int32_t>(a.topk);
  sel.qs = QueryShape{a.queries, a.per_query_lens};
  sel.sorted = o.sorted_by_score;
  sel.positions = o.positions;
  sel.let_next_in = let_next_in;
  return sel;
}

// The fused path: every row scored and selected by its own CTA, no workspace.
template <int kHeads, int kQueries>
void LaunchFused(const IndexerArgs& a, const SelectParams& sel, int64_t max_tokens, cudaStream_t stream,
                 bool programmatic) {
  FusedParams fp{};
  fp.k_cache = a.k_cache;
  fp.weights = a.weights;
  fp.key_stride = FusedKeyStride(static_cast<uint32_t>(max_tokens));
  fp.select = sel;
  Launch(static_cast<unsigned>(a.batch), kFusedThreads, FusedSmemBytes<kHeads, kQueries>(static_cast<uint32_t>(max_tokens)),
         stream, 0, programmatic)
      .Run(FusedRowsKernel<kHeads, kQueries>, KCacheTensorMap(a.k_cache, a.num_pages), QTensorMap(a), fp);
}

// ScorePagesKernel: every page into the workspace's rank keys (a row per query), balanced over all SMs.
template <int kHeads, int kQueries>
void LaunchScorePages(const IndexerArgs& a, const Schedule& plan, uint32_t* keys, bool sorted_by_score,
                      unsigned long long* stamps, cudaStream_t stream, bool programmatic) {
  ScoreParams sp{};
  sp.k_cache = a.k_cache;
  sp.weights = a.weights;
  sp.seq_lens = a.seq_lens;
  sp.block_table = a.block_table;
  sp.keys = keys;
  sp.row_stride = a.max_pages * kPageTokens;
  sp.num_pages = a.num_pages;
  sp.batch = static_cast<int32_t>(a.batch);
  sp.max_pages = static_cast<int32_t>(a.max_pages);
  sp.topk = static_cast<int32_t>(a.topk);
  sp.sorted = sorted_by_score;
  sp.qs = QueryShape{a.queries, a.per_query_lens};
  sp.stamps = stamps;
  sp.share_mul = ScoreShareMultiplier(plan.score_ctas);
  Launch launch(static_cast<unsigned>(plan.score_ctas), kScoreThreads, ScoreSmemBytes<kHeads, kQueries>(), stream, 0,
                programmatic);
  if (stamps != nullptr) {
    launch.Run(ScorePagesKernel<kHeads, kQueries, true>, KCacheTensorMap(a.k_cache, a.num_pages), QTensorMap(a), sp);
  } else {
    launch.Run(ScorePagesKernel<kHeads, kQueries>, KCacheTensorMap(a.k_cache, a.num_pages), QTensorMap(a), sp);
  }
}

// SelectRowsKernel with kThreads a CTA: one cluster of `cluster` CTAs per query row (kLongestFirst:
// one CTA a query row, the longest rows first). Its shared memory stages the longest slice the plan
// gives a CTA (`slice`; slices of longer rows, beyond the caller's bound, read L2), at most
// kMaxStagedKeys, or for CTAs of two an SM what lets two fit; the sort storage comes on top for
// sorted output.
template <int kThreads, bool kLongestFirst = false>
void LaunchSelectRows(SelectParams sel, int64_t slice, const DeviceFacts& device, int64_t query_rows, int cluster,
                      cudaStream_t stream, bool programmatic) {
  sel.staged_capacity = kThreads == kPairedSelectThreads
                            ? StagedCapacity<kThreads>(slice, device.paired_staged_limit[sel.sorted])
                            : StagedCapacity<kThreads>(slice);
  TVM_FFI_ICHECK(!kLongestFirst || (cluster == 1 && query_rows <= kLongestFirstMaxRows))
      << "a longest-first select takes one CTA a query row, at most " << kLongestFirstMaxRows;
  const unsigned grid = static_cast<unsigned>(query_rows * cluster);
  Launch(grid, kThreads, SelectSmemBytes<kThreads>(sel.staged_capacity, sel.sorted), stream, cluster, programmatic)
      .Run(SelectRowsKernel<kThreads, kLongestFirst>, sel);
}

// Picks the schedule from shapes and launches it on `stream`.
template <int kHeads, int kQueries>
void LaunchIndexer(const IndexerArgs& a, const DeviceFacts& device, const Tuning& tuning, cudaStream_t stream,
                   const DecodeOptions& o) {
  const bool sorted_by_score = o.sorted_by_score;
  const int64_t row_stride = a.max_pages * kPageTokens;
  const int64_t max_tokens = std::max<int64_t>(1, a.max_pages) * kPageTokens;
  const int64_t planned_tokens = PlannedTokens(a, o);
  const ClusterOccupancy clusters = CapClusters(device.select_clusters, tuning.max_select_cluster);
  const Schedule plan = PlanSchedule(a.batch, a.queries, a.max_pages, planned_tokens, device.sm_count, kSliceKeys,
                                     clusters, FusedFits<kHeads, kQueries>(device, tuning, max_tokens),
                                     device.paired_staged_limit[sorted_by_score], kMaxStagedKeys,
                                     tuning.select_threads);
  // Scores are needed unless no row has a token, or no query can be longer than K with the output
  // by position (sm90_rows.cuh: ScoresNeeded): then SelectRowsKernel alone, no workspace.
  const bool score = a.max_pages > 0 && ScoresNeeded(row_stride, static_cast<int32_t>(a.topk), sorted_by_score);
  const bool pdl = tuning.programmatic_launch;
  SelectParams sel = SelectParamsOf(a, o, pdl);
  sel.stamps = tuning.stamp_select ? SelectStampBuffer(a.device.device_id) : nullptr;
  if (score && plan.fused) {
    LaunchFused<kHeads, kQueries>(a, sel, max_tokens, stream, pdl);
    return;
  }
  // The split path: ScorePagesKernel, then SelectRowsKernel selects each query row from its keys.
  Workspace workspace(score ? static_cast<size_t>(WorkspaceBytes(a.query_rows(), a.max_pages)) : 0, a.device, stream);
  uint32_t* keys = reinterpret_cast<uint32_t*>(workspace.data());
  if (score) {
    LaunchScorePages<kHeads, kQueries>(a, plan, keys, sorted_by_score,
                                       tuning.stamp_select ? ScoreStampBuffer(a.device.device_id) : nullptr, stream, pdl);
  }
  sel.keys = keys;
  const int64_t slice =
      std::max(SliceLength(planned_tokens, plan.cluster_size), std::min<int64_t>(max_tokens, kSliceKeys));
  // One cluster per query row. Behind ScorePagesKernel the select CTAs are placed while it still
  // runs and read seq_lens and the block table at once (ScorePagesKernel lets them launch only after
  // its own wait for the stream's previous kernel), then wait for its keys. As the call's first
  // kernel (rows that need no scores) SelectRowsKernel waits before reading anything.
  sel.wait_before_inputs = !score && pdl;
  sel.stop_after_staging = tuning.select_floor;
  if (plan.select_threads == kPairedSelectThreads) {
    LaunchSelectRows<kPairedSelectThreads>(sel, slice, device, a.query_rows(), plan.cluster_size, stream, score || pdl);
  } else if (plan.longest_first) {
    LaunchSelectRows<kSelectRowsThreads, true>(sel, slice, device, a.query_rows(), plan.cluster_size, stream,
                                               score || pdl);
  } else {
    LaunchSelectRows<kSelectRowsThreads>(sel, slice, device, a.query_rows(), plan.cluster_size, stream, score || pdl);
  }
}

}  // namespace ffi_dsa::sm90
