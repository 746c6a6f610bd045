// The run-time knobs of the sm90 kernels (launch/tuning.h), exported as the CUDA module's
// set_cuda_options / cuda_options (ffi_dsa.cuda_options), and select_stamps and score_stamps, the
// readers of the stamp_select instrument (launch/sm90_select_stamps.h). An arch with knobs of its
// own would add them to these maps.
#define TVM_FFI_DLL_EXPORT_INCLUDE_METADATA 1
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <climits>
#include <cstdint>
#include <utility>
#include <vector>

#include "ffi_dsa/launch/sm90_select_stamps.h"
#include "ffi_dsa/launch/tuning.h"

namespace {

namespace sm90 = ffi_dsa::sm90;

tvm::ffi::Map<tvm::ffi::String, int64_t> TuningAsMap(const sm90::Tuning& t) {
  return {{"fused", t.fused},
          {"pdl", t.programmatic_launch},
          {"max_select_cluster", t.max_select_cluster},
          {"select_floor", t.select_floor},
          {"stamp_select", t.stamp_select},
          {"select_threads", t.select_threads}};
}

// The knobs for later calls; -1 leaves one as it is. Returns the settings it replaced.
tvm::ffi::Map<tvm::ffi::String, int64_t> SetCudaOptions(int64_t fused, int64_t pdl, int64_t max_select_cluster,
                                                          int64_t select_floor, int64_t stamp_select,
                                                          int64_t select_threads) {
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"fused", fused},
                                    {"pdl", pdl},
                                    {"select_floor", select_floor},
                                    {"stamp_select", stamp_select}}) {
    if (value != -1 && value != 0 && value != 1) {
      TVM_FFI_THROW(ValueError) << name << " must be True or False, got " << value;
    }
  }
  // Range first: a value past int would pass the checks below once narrowed.
  auto is_int = [](int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; };
  if (max_select_cluster != -1 &&
      (!is_int(max_select_cluster) || !sm90::ValidSelectClusterCap(static_cast<int>(max_select_cluster)))) {
    TVM_FFI_THROW(ValueError) << "max_select_cluster must be 1, 2, 4, 8 or 16, got " << max_select_cluster;
  }
  if (select_threads != -1 && (!is_int(select_threads) || !sm90::ValidSelectThreads(static_cast<int>(select_threads)))) {
    TVM_FFI_THROW(ValueError) << "select_threads must be 0 (the schedule's), " << sm90::kPairedSelectThreads << " or "
                              << sm90::kSelectRowsThreads << ", got " << select_threads;
  }
  const sm90::Tuning previous = sm90::CurrentTuning();
  sm90::Tuning next = previous;
  if (fused != -1) next.fused = fused == 1;
  if (pdl != -1) next.programmatic_launch = pdl == 1;
  if (max_select_cluster != -1) next.max_select_cluster = static_cast<int>(max_select_cluster);
  if (select_floor != -1) next.select_floor = select_floor == 1;
  if (stamp_select != -1) next.stamp_select = stamp_select == 1;
  if (select_threads != -1) next.select_threads = static_cast<int>(select_threads);
  sm90::SetTuning(next);
  return TuningAsMap(previous);
}

tvm::ffi::Map<tvm::ffi::String, int64_t> CudaOptions() { return TuningAsMap(sm90::CurrentTuning()); }

// The stamps of the first `slots` select slots of the calls on `device` so far, up to the buffer's
// slots (kSelectStampWords words a slot, impls/sm90_select_stamps.cuh; zeros for a slot no stamped
// select wrote); `clear`
// zeroes them after the read. Synchronizes the device.
tvm::ffi::Array<int64_t> SelectStamps(int64_t device, int64_t slots, bool clear) {
  const std::vector<int64_t> words = sm90::ReadSelectStamps(static_cast<int>(device), slots, clear);
  return tvm::ffi::Array<int64_t>(words.begin(), words.end());
}

// The same for the scoring kernel's stamps of its first `ctas` CTAs (kScoreStampWords words a CTA,
// impls/sm90_score_stamps.cuh).
tvm::ffi::Array<int64_t> ScoreStamps(int64_t device, int64_t ctas, bool clear) {
  const std::vector<int64_t> words = sm90::ReadScoreStamps(static_cast<int>(device), ctas, clear);
  return tvm::ffi::Array<int64_t>(words.begin(), words.end());
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(set_cuda_options, SetCudaOptions);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(cuda_options, CudaOptions);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(select_stamps, SelectStamps);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(score_stamps, ScoreStamps);
