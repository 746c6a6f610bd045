// The CUDA module's op exports, arch-neutral. Each reads as three steps: check the arguments
// (validate/), take the device and the caller's stream, hand the call to the kernels of the device's
// arch (launch/cuda_arch_entries.h: cuda/csrc/sm_90a/ for Hopper). Every export carries its type
// schema (tvm-ffi's function metadata), checked against the typed stubs of ffi_dsa/_native.py by
// tests/test_native_stubs.py.
#define TVM_FFI_DLL_EXPORT_INCLUDE_METADATA 1
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>

#include "ffi_dsa/cuda_archs.h"
#include "ffi_dsa/launch/cuda_arch_entries.h"
#include "ffi_dsa/launch/device_facts.h"
#include "ffi_dsa/validate/decode.h"
#include "ffi_dsa/validate/prefill.h"

namespace {

using tvm::ffi::TensorView;

// What every arch's kernels take beyond the contract's checks: TMA and vector loads need 16-byte
// aligned tensors, and TMA box coordinates are int32, so the rows of q x H heads must fit.
void CheckCudaLimits(std::initializer_list<std::pair<const char*, const void*>> tma_tensors, const char* rows,
                     int64_t query_rows, int32_t heads) {
  for (const auto& [name, data] : tma_tensors) {
    if (reinterpret_cast<uintptr_t>(data) % 16 != 0) {
      TVM_FFI_THROW(ValueError) << name << " must start on a 16-byte boundary (TMA and vector loads); "
                                << "got a view at an offset that is not";
    }
  }
  const int64_t max_query_rows = std::numeric_limits<int32_t>::max() / heads;  // ~274 GB of q
  if (query_rows > max_query_rows) {
    TVM_FFI_THROW(ValueError) << rows << " = " << query_rows << " query rows exceed the CUDA kernel's limit of "
                              << max_query_rows;
  }
}

// The kernels of `device`'s arch (it is current), or an error naming the archs this module holds.
const ffi_dsa::CudaArchEntries& ArchOf(int device) {
  const ffi_dsa::DeviceFacts& facts = ffi_dsa::GetDeviceFacts(device);
  std::string built;
  for (const ffi_dsa::CudaArchEntries* e = ffi_dsa::kCompiledArchs; e->arch != nullptr; ++e) {
    for (const ffi_dsa::CudaArch& arch : ffi_dsa::kCudaArchs) {
      if (std::string(arch.name) == e->arch && arch.major == facts.major && arch.minor == facts.minor) return *e;
    }
    built += (built.empty() ? "" : ", ") + std::string(e->arch);
  }
  TVM_FFI_THROW(RuntimeError) << "the ffi_dsa CUDA module holds kernels for " << built << " (sm_90a: a Hopper GPU); device "
                              << device << " is sm_" << facts.major << facts.minor;
}

// The caller's stream on `device`, as tvm-ffi's environment holds it (torch's current stream, XLA's).
cudaStream_t CurrentStream(int device) { return static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device)); }

// positions: ids="positions". max_seq_len: the caller's bound on the batch's longest row (<= 0:
// unknown), which only plans the select's work: a row longer than it still gets its exact answer.
void TopkIndexerCuda(TensorView q, TensorView k_cache, TensorView weights, TensorView seq_lens,
                     TensorView block_table, TensorView topk_indices, bool sorted_by_score, bool positions,
                     int64_t max_seq_len) {
  const ffi_dsa::IndexerArgs a =
      ffi_dsa::CheckIndexerArgs(q, k_cache, weights, seq_lens, block_table, topk_indices, kDLCUDA);
  const auto& names = ffi_dsa::kArgNames;
  CheckCudaLimits({{names[0], a.q}, {names[1], a.k_cache}}, "B * N", a.query_rows(), a.heads);
  if (a.batch == 0 || a.topk == 0) return;

  const int device = a.device.device_id;
  tvm::ffi::CUDADeviceGuard guard(device);
  ArchOf(device).topk_indexer(a, CurrentStream(device), ffi_dsa::DecodeOptions{sorted_by_score, positions, max_seq_len});
}

// Prefill (docs/contract.md §8): DPS like the CPU module's export of the same name. Keys are int32
// by the contract, so only the M x H rows of q bound the TMA coordinates.
void PrefillTopkIndexerCuda(TensorView q, TensorView k, TensorView k_scale, TensorView weights, TensorView ks,
                            TensorView ke, TensorView topk_indices, bool sorted_by_score, bool absolute_ids) {
  const ffi_dsa::PrefillArgs a =
      ffi_dsa::CheckPrefillArgs(q, k, k_scale, weights, ks, ke, topk_indices, kDLCUDA);
  const auto& names = ffi_dsa::kPrefillArgNames;
  CheckCudaLimits({{names[0], a.q}, {names[1], a.k}, {names[2], a.k_scale}}, "q's M", a.rows, a.heads);
  if (a.rows == 0 || a.topk == 0) return;

  const int device = a.device.device_id;
  tvm::ffi::CUDADeviceGuard guard(device);
  ArchOf(device).prefill_topk_indexer(a, CurrentStream(device), sorted_by_score, absolute_ids);
}

}  // namespace

// DPS: (inputs..., output, scalar attrs), the CPU module's exports of the same names.
TVM_FFI_DLL_EXPORT_TYPED_FUNC(topk_indexer, TopkIndexerCuda);
// absolute_ids is ids="absolute".
TVM_FFI_DLL_EXPORT_TYPED_FUNC(prefill_topk_indexer, PrefillTopkIndexerCuda);
