// The CUDA module's exports (Hopper, sm_90a). Each entry point reads as three steps: check the
// arguments (validate.h), take the device and the caller's stream, launch (launch/sm90_launch.cuh).
// Every export carries its type schema (tvm-ffi's function metadata), checked against the typed
// stubs of ffi_dsa/_native.py by tests/test_native_stubs.py.
#define TVM_FFI_DLL_EXPORT_INCLUDE_METADATA 1
#include <cuda_runtime.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>

#include <cstdint>
#include <limits>
#include <utility>

#include "ffi_dsa/launch/device_facts.h"
#include "ffi_dsa/launch/sm90_launch.cuh"
#include "ffi_dsa/launch/sm90_prefill_launch.cuh"
#include "ffi_dsa/launch/tuning.h"
#include "ffi_dsa/validate.h"
#include "ffi_dsa/validate_prefill.h"

namespace {

using tvm::ffi::TensorView;
namespace sm90 = ffi_dsa::sm90;

// What the kernels take beyond validate.h's contract checks: TMA and vector loads need 16-byte
// aligned q and k_cache, and TMA box coordinates are int32, so B * N query rows x H heads must fit.
void CheckCudaLimits(const ffi_dsa::IndexerArgs& a) {
  for (const auto& [name, data] : {std::pair<const char*, const void*>{"q (q_index_fp8)", a.q},
                                    {"k_cache (k_index_cache_fp8)", a.k_cache}}) {
    if (reinterpret_cast<uintptr_t>(data) % 16 != 0) {
      TVM_FFI_THROW(ValueError) << name << " must start on a 16-byte boundary (TMA and vector loads); "
                                << "got a view at an offset that is not";
    }
  }
  const int64_t max_query_rows = std::numeric_limits<int32_t>::max() / a.heads;  // ~274 GB of q
  if (a.query_rows() > max_query_rows) {
    TVM_FFI_THROW(ValueError) << "B * N = " << a.query_rows() << " query rows exceed the CUDA kernel's limit of "
                              << max_query_rows;
  }
}

// The device this call runs on, made current, after checking it is a Hopper GPU.
const sm90::DeviceFacts& HopperDevice(int device) {
  const sm90::DeviceFacts& facts = sm90::GetDeviceFacts(device);
  if (!(facts.major == 9 && facts.minor == 0)) {
    TVM_FFI_THROW(RuntimeError) << "the ffi_dsa CUDA kernel needs a Hopper GPU (sm_90a); device " << device
                                << " is sm_" << facts.major << facts.minor;
  }
  return facts;
}

void TopkIndexerCuda(TensorView q, TensorView k_cache, TensorView weights, TensorView seq_lens,
                     TensorView block_table, TensorView topk_indices, bool sorted_by_score) {
  const ffi_dsa::IndexerArgs a =
      ffi_dsa::CheckIndexerArgs(q, k_cache, weights, seq_lens, block_table, topk_indices, kDLCUDA);
  CheckCudaLimits(a);
  if (a.batch == 0 || a.topk == 0) return;

  const int device = a.device.device_id;
  tvm::ffi::CUDADeviceGuard guard(device);
  const sm90::DeviceFacts& facts = HopperDevice(device);
  auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device));

  const sm90::Tuning tuning = sm90::CurrentTuning();
  bool launched = false;
  sm90::ForEachQueryShape([&](auto heads, auto queries) {
    if (a.heads == heads() && a.queries == queries()) {
      sm90::LaunchIndexer<heads(), queries()>(a, facts, tuning, stream, sm90::CallOptions{sorted_by_score});
      launched = true;
    }
  });
  if (!launched) TVM_FFI_THROW(RuntimeError) << "internal: no kernel for H=" << a.heads << ", N=" << a.queries;
}

// What the prefill kernel takes beyond validate_prefill.h's checks: TMA needs 16-byte aligned q, k
// and k_scale, and its coordinates are int32 (M x H head rows; keys are int32 by the contract).
void CheckPrefillCudaLimits(const ffi_dsa::PrefillArgs& a) {
  const auto& names = ffi_dsa::kPrefillArgNames;
  for (const auto& [name, data] : {std::pair<const char*, const void*>{names[0], a.q}, {names[1], a.k},
                                    {names[2], a.k_scale}}) {
    if (reinterpret_cast<uintptr_t>(data) % 16 != 0) {
      TVM_FFI_THROW(ValueError) << name << " must start on a 16-byte boundary (TMA); got a view at an offset "
                                << "that is not";
    }
  }
  const int64_t max_rows = std::numeric_limits<int32_t>::max() / a.heads;
  if (a.rows > max_rows) {
    TVM_FFI_THROW(ValueError) << names[0] << " has M = " << a.rows << " query rows; the CUDA kernel's limit is "
                              << max_rows;
  }
}

// Prefill (docs/contract.md §8): DPS like the CPU module's export of the same name.
void PrefillTopkIndexerCuda(TensorView q, TensorView k, TensorView k_scale, TensorView weights, TensorView ks,
                            TensorView ke, TensorView topk_indices, bool sorted_by_score, bool absolute_ids) {
  const ffi_dsa::PrefillArgs a =
      ffi_dsa::CheckPrefillArgs(q, k, k_scale, weights, ks, ke, topk_indices, kDLCUDA);
  CheckPrefillCudaLimits(a);
  if (a.rows == 0 || a.topk == 0) return;

  const int device = a.device.device_id;
  tvm::ffi::CUDADeviceGuard guard(device);
  HopperDevice(device);
  auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device));

  const sm90::Tuning tuning = sm90::CurrentTuning();
  if (a.heads == ffi_dsa::kNumHeads) {
    sm90::LaunchPrefill<ffi_dsa::kNumHeads>(a, tuning, stream, sorted_by_score, absolute_ids);
  } else {
    sm90::LaunchPrefill<ffi_dsa::kNumHeadsNarrow>(a, tuning, stream, sorted_by_score, absolute_ids);
  }
}

tvm::ffi::Map<tvm::ffi::String, int64_t> TuningAsMap(const sm90::Tuning& t) {
  return {{"fused", t.fused}, {"pdl", t.programmatic_launch}, {"max_select_cluster", t.max_select_cluster}};
}

// The knobs of launch/tuning.h for later calls (ffi_dsa.cuda_options); -1 leaves one as it is.
// Returns the settings it replaced.
tvm::ffi::Map<tvm::ffi::String, int64_t> SetCudaOptions(int64_t fused, int64_t pdl, int64_t max_select_cluster) {
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"fused", fused}, {"pdl", pdl}}) {
    if (value != -1 && value != 0 && value != 1) {
      TVM_FFI_THROW(ValueError) << name << " must be True or False, got " << value;
    }
  }
  if (max_select_cluster != -1 && !sm90::ValidSelectClusterCap(static_cast<int>(max_select_cluster))) {
    TVM_FFI_THROW(ValueError) << "max_select_cluster must be 1, 2, 4, 8 or 16, got " << max_select_cluster;
  }
  const sm90::Tuning previous = sm90::CurrentTuning();
  sm90::Tuning next = previous;
  if (fused != -1) next.fused = fused == 1;
  if (pdl != -1) next.programmatic_launch = pdl == 1;
  if (max_select_cluster != -1) next.max_select_cluster = static_cast<int>(max_select_cluster);
  sm90::SetTuning(next);
  return TuningAsMap(previous);
}

tvm::ffi::Map<tvm::ffi::String, int64_t> CudaOptions() { return TuningAsMap(sm90::CurrentTuning()); }

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(topk_indexer, TopkIndexerCuda);
// DPS like topk_indexer: (inputs..., output, scalar attrs); absolute_ids is ids="absolute".
TVM_FFI_DLL_EXPORT_TYPED_FUNC(prefill_topk_indexer, PrefillTopkIndexerCuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(set_cuda_options, SetCudaOptions);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(cuda_options, CudaOptions);
