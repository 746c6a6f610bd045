// Prefill on sm_90a: once per device, the prefill kernel's attributes; on every call, the launch of
// the call's H instantiation (launch/sm90_prefill_launch.cuh).
#include <cuda_runtime.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/cuda/base.h>

#include <cstddef>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/launch/cuda_arch_entries.h"
#include "ffi_dsa/launch/device_facts.h"
#include "ffi_dsa/launch/sm90_prefill_launch.cuh"
#include "ffi_dsa/launch/tuning.h"

namespace ffi_dsa::sm90 {
namespace {

// The kernel may use the device's whole opt-in shared memory: set once per device (it is current),
// after checking its fixed footprint fits.
void PreparePrefillKernels(int device) {
  OncePerDevice<bool>(device, [](int d) {
    const ffi_dsa::DeviceFacts& f = ffi_dsa::GetDeviceFacts(d);
    const size_t bytes = PrefillSmemBytes<kNumHeads>();
    if (bytes > f.max_smem_optin) {
      TVM_FFI_THROW(RuntimeError) << "internal: the prefill kernel needs " << bytes << " B of shared memory, device "
                                  << d << " allows " << f.max_smem_optin;
    }
    const int optin = static_cast<int>(f.max_smem_optin);
    for (const void* kernel : {reinterpret_cast<const void*>(PrefillRowsKernel<kNumHeads>),
                               reinterpret_cast<const void*>(PrefillRowsKernel<kNumHeadsNarrow>)}) {
      TVM_FFI_CHECK_CUDA_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
    }
    return true;
  });
}

}  // namespace

void PrefillTopkIndexer(const PrefillArgs& a, cudaStream_t stream, bool sorted_by_score, bool absolute_ids) {
  PreparePrefillKernels(a.device.device_id);
  const Tuning tuning = CurrentTuning();
  if (a.heads == kNumHeads) {
    LaunchPrefill<kNumHeads>(a, tuning, stream, sorted_by_score, absolute_ids);
  } else {
    LaunchPrefill<kNumHeadsNarrow>(a, tuning, stream, sorted_by_score, absolute_ids);
  }
}

}  // namespace ffi_dsa::sm90
