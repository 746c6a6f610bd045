// Decode on sm_90a: once per device, the decode kernels' attributes and how many select clusters of
// each size the device holds; on every call, the launch of the call's (H, N) instantiation
// (launch/sm90_decode_launch.cuh picks the schedule).
#include <cuda_runtime.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/cuda/base.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/launch/cuda_arch_entries.h"
#include "ffi_dsa/launch/device_facts.h"
#include "ffi_dsa/launch/sm90_decode_launch.cuh"
#include "ffi_dsa/launch/sm90_device_facts.h"
#include "ffi_dsa/launch/tuning.h"

namespace ffi_dsa::sm90 {
namespace {

// How many select clusters of each size, at SelectRowsKernel's largest shared memory, can be
// resident at once. A cluster's CTAs share one GPC, so this is not SMs / size: a 16-CTA cluster
// needs 16 free SMs in one GPC, which a part with fewer SMs per GPC lacks (its launch would fail),
// and a GPC of fewer than 16 free SMs holds one 8-CTA cluster, not two.
ClusterOccupancy SelectClusterOccupancy() {
  ClusterOccupancy occupancy{};
  for (int size = 1; size <= kMaxSelectCluster; ++size) {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(size));
    config.blockDim = dim3(kSelectRowsThreads);
    config.dynamicSmemBytes = SelectSmemBytes<kSelectRowsThreads>(kMaxStagedKeys, true);
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = static_cast<unsigned>(size);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, SelectRowsKernel<kSelectRowsThreads>, &config) != cudaSuccess) {
      (void)cudaGetLastError();  // a refused size is an answer, not a sticky error
      clusters = 0;
    }
    occupancy.active[size] = clusters;
  }
  occupancy.active[1] = std::max(occupancy.active[1], 1);  // one CTA per row always launches
  return occupancy;
}

// The most keys (whole tiles) a kPairedSelectThreads CTA may stage with two such CTAs an SM, for
// unsorted and sorted launches (the sort storage comes on top), as the driver's occupancy
// calculator sees it (shared memory, the per-CTA reservation, registers); 0 where not even one
// tile leaves room for two.
void PairedStagedLimits(uint32_t (&limit)[2]) {
  constexpr uint32_t kTile = topk::Shape<kPairedSelectThreads>::kTileKeys;
  for (int sorted = 0; sorted < 2; ++sorted) {
    limit[sorted] = 0;
    for (uint32_t keys = kMaxStagedKeys; keys >= kTile && limit[sorted] == 0; keys -= kTile) {
      int ctas = 0;
      const size_t bytes = SelectSmemBytes<kPairedSelectThreads>(keys, sorted == 1);
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, SelectRowsKernel<kPairedSelectThreads>,
                                                        kPairedSelectThreads, bytes) != cudaSuccess) {
        (void)cudaGetLastError();  // a refused size is an answer, not a sticky error
        ctas = 0;
      }
      if (ctas >= 2) limit[sorted] = keys;
    }
  }
}

// Calls f(heads, queries) for every (H, N) the kernels are compiled for, each as a constexpr
// functor (heads() is usable as a template argument).
template <typename F>
void ForEachQueryShape(F&& f) {
  auto for_queries = [&](auto heads) {
    f(heads, std::integral_constant<int, 1>{});
    f(heads, std::integral_constant<int, 2>{});
    f(heads, std::integral_constant<int, 3>{});
    f(heads, std::integral_constant<int, 4>{});
  };
  static_assert(kMaxQueries == 4, "one instantiation per N");
  for_queries(std::integral_constant<int, kNumHeads>{});
  for_queries(std::integral_constant<int, kNumHeadsNarrow>{});
}

// Every decode kernel may use the device's whole opt-in shared memory; SelectRowsKernel's one-an-SM
// CTAs may form clusters beyond the portable 8 CTAs.
void SetKernelAttributes(int optin) {
  std::vector<const void*> kernels{reinterpret_cast<const void*>(SelectRowsKernel<kSelectRowsThreads>),
                                  reinterpret_cast<const void*>(SelectRowsKernel<kSelectRowsThreads, true>),
                                  reinterpret_cast<const void*>(SelectRowsKernel<kPairedSelectThreads>)};
  ForEachQueryShape([&kernels](auto heads, auto queries) {
    kernels.push_back(reinterpret_cast<const void*>(ScorePagesKernel<heads(), queries()>));
    kernels.push_back(reinterpret_cast<const void*>(ScorePagesKernel<heads(), queries(), true>));
    kernels.push_back(reinterpret_cast<const void*>(FusedRowsKernel<heads(), queries()>));
  });
  for (const void* kernel : kernels) {
    TVM_FFI_CHECK_CUDA_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
  }
  TVM_FFI_CHECK_CUDA_ERROR(
      cudaFuncSetAttribute(SelectRowsKernel<kSelectRowsThreads>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
}

// The device's facts, with the kernel attributes set on it, once per device (it is current).
const DeviceFacts& DecodeDeviceFacts(int device) {
  return OncePerDevice<DeviceFacts>(device, [](int d) {
    DeviceFacts f;
    static_cast<ffi_dsa::DeviceFacts&>(f) = ffi_dsa::GetDeviceFacts(d);
    // The kernels have fixed shared-memory footprints: check them once per device, not per call.
    const size_t select_bytes = SelectSmemBytes<kSelectRowsThreads>(kMaxStagedKeys, true);
    const size_t score_bytes = ScoreSmemBytes<kNumHeads, kMaxQueries>();
    if (std::max(score_bytes, select_bytes) > f.max_smem_optin) {
      TVM_FFI_THROW(RuntimeError) << "internal: the kernels need " << score_bytes << " and " << select_bytes
                                  << " B of shared memory, device " << d << " allows " << f.max_smem_optin;
    }
    SetKernelAttributes(static_cast<int>(f.max_smem_optin));
    f.select_clusters = SelectClusterOccupancy();
    PairedStagedLimits(f.paired_staged_limit);
    return f;
  });
}

constexpr size_t kSelectStampRegion = size_t(kMaxSelectStampSlots) * kSelectStampWords;
constexpr size_t kScoreStampRegion = size_t(kMaxScoreStampSlots) * kScoreStampWords;

// `slots` slots of `words` words from `region` of the device's stamp buffer, zeroed afterwards with
// `clear`. Synchronizes the device.
std::vector<int64_t> ReadStamps(int device, int64_t slots, int64_t max_slots, int words_per_slot,
                                unsigned long long* (*region)(int), bool clear) {
  if (slots < 0) TVM_FFI_THROW(ValueError) << "slots must be >= 0, got " << slots;
  slots = std::min<int64_t>(slots, max_slots);  // nothing is stamped past the region
  int current = 0;
  TVM_FFI_CHECK_CUDA_ERROR(cudaGetDevice(&current));
  TVM_FFI_CHECK_CUDA_ERROR(cudaSetDevice(device));
  unsigned long long* buffer = region(device);
  // Read as int64: every stamp (ns since the timer's epoch, the SM's cycle count) is below 2^63.
  std::vector<int64_t> words(static_cast<size_t>(slots) * words_per_slot);
  const size_t bytes = words.size() * sizeof(int64_t);
  TVM_FFI_CHECK_CUDA_ERROR(cudaDeviceSynchronize());
  TVM_FFI_CHECK_CUDA_ERROR(cudaMemcpy(words.data(), buffer, bytes, cudaMemcpyDeviceToHost));
  if (clear) TVM_FFI_CHECK_CUDA_ERROR(cudaMemset(buffer, 0, bytes));
  TVM_FFI_CHECK_CUDA_ERROR(cudaSetDevice(current));
  return words;
}

}  // namespace

unsigned long long* SelectStampBuffer(int device) {
  return OncePerDevice<unsigned long long*>(device, [](int) {
    unsigned long long* buffer = nullptr;
    const size_t bytes = (kSelectStampRegion + kScoreStampRegion) * sizeof(unsigned long long);
    TVM_FFI_CHECK_CUDA_ERROR(cudaMalloc(&buffer, bytes));
    TVM_FFI_CHECK_CUDA_ERROR(cudaMemset(buffer, 0, bytes));
    return buffer;
  });
}

unsigned long long* ScoreStampBuffer(int device) { return SelectStampBuffer(device) + kSelectStampRegion; }

std::vector<int64_t> ReadSelectStamps(int device, int64_t slots, bool clear) {
  return ReadStamps(device, slots, kMaxSelectStampSlots, kSelectStampWords, SelectStampBuffer, clear);
}

std::vector<int64_t> ReadScoreStamps(int device, int64_t ctas, bool clear) {
  return ReadStamps(device, ctas, kMaxScoreStampSlots, kScoreStampWords, ScoreStampBuffer, clear);
}

void TopkIndexer(const IndexerArgs& a, cudaStream_t stream, const DecodeOptions& options) {
  const DeviceFacts& facts = DecodeDeviceFacts(a.device.device_id);
  const Tuning tuning = CurrentTuning();
  bool launched = false;
  ForEachQueryShape([&](auto heads, auto queries) {
    if (a.heads == heads() && a.queries == queries()) {
      LaunchIndexer<heads(), queries()>(a, facts, tuning, stream, options);
      launched = true;
    }
  });
  if (!launched) TVM_FFI_THROW(RuntimeError) << "internal: no kernel for H=" << a.heads << ", N=" << a.queries;
}

}  // namespace ffi_dsa::sm90
