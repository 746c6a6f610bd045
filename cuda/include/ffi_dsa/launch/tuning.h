// Every run-time knob of the CUDA path, in one place. They exist for tests and A/B timing: each one
// switches between paths that give the same bytes. Process-wide, set through the module's
// set_cuda_options (ffi_dsa.cuda_options) and read on every call, so a test can flip them in-process.
#pragma once

#include <atomic>

#include "ffi_dsa/sm90_schedule.h"

namespace ffi_dsa::sm90 {

struct Tuning {
  // The fused path (FusedRowsKernel) may be chosen where a row fits its CTA (FusedFits); off, every
  // call takes the split path (ScorePagesKernel, then SelectRowsKernel), so both paths can be tested
  // and timed on the same shapes.
  bool fused = true;
  // The call's first kernel is launched with programmatic stream serialization, so its prologue
  // overlaps the end of the stream's previous kernel; off, it launches in plain stream order.
  bool programmatic_launch = true;
  // The largest select cluster SelectRowsKernel may use (1, 2, 4, 8 or 16): lets any Hopper GPU run
  // the smaller clusters a part with fewer SMs per GPC would get.
  int max_select_cluster = kMaxSelectCluster;
  // A measuring instrument, not a path: SelectRowsKernel stops once its keys are staged and binned
  // and writes no output, so a benchmark can time the split path's floor (the kernel boundary, the
  // staging) apart from the select's work. Every other knob gives the same bytes; this one gives none.
  bool select_floor = false;
  // A measuring instrument that changes no output: each select (the fused kernel's tail, or a
  // SelectRowsKernel CTA) stamps the global timer when it may start and when its last id is
  // written, and the SM's cycles at each phase's end, into a buffer of the module's
  // (sm90_select_stamps.h), so a benchmark can time the select and its phases on either path; and
  // each ScorePagesKernel CTA stamps its chain from its start to its first page and its end.
  bool stamp_select = false;
  // SelectRowsKernel's CTA size where the schedule gives a query row one CTA: 0 the schedule's
  // choice (sm90_schedule.h), or kSelectRowsThreads / kPairedSelectThreads for every such launch,
  // so both sizes can be tested and timed on the same shapes. Clusters are always of
  // kSelectRowsThreads.
  int select_threads = 0;
};

inline bool ValidSelectClusterCap(int cap) { return cap == 1 || cap == 2 || cap == 4 || cap == 8 || cap == 16; }
inline bool ValidSelectThreads(int threads) {
  return threads == 0 || threads == kSelectRowsThreads || threads == kPairedSelectThreads;
}

namespace tuning_detail {
inline std::atomic<bool> fused{true};
inline std::atomic<bool> programmatic_launch{true};
inline std::atomic<int> max_select_cluster{kMaxSelectCluster};
inline std::atomic<bool> select_floor{false};
inline std::atomic<bool> stamp_select{false};
inline std::atomic<int> select_threads{0};
}  // namespace tuning_detail

inline Tuning CurrentTuning() {
  Tuning t;
  t.fused = tuning_detail::fused.load(std::memory_order_relaxed);
  t.programmatic_launch = tuning_detail::programmatic_launch.load(std::memory_order_relaxed);
  t.max_select_cluster = tuning_detail::max_select_cluster.load(std::memory_order_relaxed);
  t.select_floor = tuning_detail::select_floor.load(std::memory_order_relaxed);
  t.stamp_select = tuning_detail::stamp_select.load(std::memory_order_relaxed);
  t.select_threads = tuning_detail::select_threads.load(std::memory_order_relaxed);
  return t;
}

// The caller checks max_select_cluster with ValidSelectClusterCap and select_threads with
// ValidSelectThreads first.
inline void SetTuning(const Tuning& t) {
  tuning_detail::fused.store(t.fused, std::memory_order_relaxed);
  tuning_detail::programmatic_launch.store(t.programmatic_launch, std::memory_order_relaxed);
  tuning_detail::max_select_cluster.store(t.max_select_cluster, std::memory_order_relaxed);
  tuning_detail::select_floor.store(t.select_floor, std::memory_order_relaxed);
  tuning_detail::stamp_select.store(t.stamp_select, std::memory_order_relaxed);
  tuning_detail::select_threads.store(t.select_threads, std::memory_order_relaxed);
}

// The device's select-cluster occupancy with the sizes above the cap taken away.
inline ClusterOccupancy CapClusters(ClusterOccupancy occupancy, int cap) {
  for (int size = cap + 1; size <= kMaxSelectCluster; ++size) occupancy.active[size] = 0;
  return occupancy;
}

}  // namespace ffi_dsa::sm90
