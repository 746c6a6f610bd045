// What the CUDA binding and every arch's launch need to know about a device, asked of the driver
// once per device (not per call: keeps the launch path free of driver queries, and capture-safe).
// Each arch adds what its own kernels need (sm90_device_facts.h), found once per device the same way.
#pragma once

#include <cuda_runtime.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/cuda/base.h>

#include <array>
#include <cstddef>
#include <mutex>

namespace ffi_dsa {

struct DeviceFacts {
  int sm_count = 0, major = 0, minor = 0;
  size_t max_smem_optin = 0;
};

// `make(device)`, run once per device id and kept for the process (a device's facts and the kernel
// attributes set on it do not change while it runs); one store per call site (per `make`).
template <typename T, typename Make>
const T& OncePerDevice(int device, Make make) {
  constexpr int kMaxDevices = 64;
  static std::array<T, kMaxDevices> values;
  static std::array<std::once_flag, kMaxDevices> once;
  if (device < 0 || device >= kMaxDevices) TVM_FFI_THROW(ValueError) << "CUDA device id " << device << " out of range";
  std::call_once(once[device], [&] { values[device] = make(device); });
  return values[device];
}

inline const DeviceFacts& GetDeviceFacts(int device) {
  return OncePerDevice<DeviceFacts>(device, [](int d) {
    DeviceFacts f;
    TVM_FFI_CHECK_CUDA_ERROR(cudaDeviceGetAttribute(&f.sm_count, cudaDevAttrMultiProcessorCount, d));
    TVM_FFI_CHECK_CUDA_ERROR(cudaDeviceGetAttribute(&f.major, cudaDevAttrComputeCapabilityMajor, d));
    TVM_FFI_CHECK_CUDA_ERROR(cudaDeviceGetAttribute(&f.minor, cudaDevAttrComputeCapabilityMinor, d));
    int optin = 0;
    TVM_FFI_CHECK_CUDA_ERROR(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, d));
    f.max_smem_optin = static_cast<size_t>(optin);
    return f;
  });
}

}  // namespace ffi_dsa
