// The argument checks of prefill, the ragged causal top-k indexer (docs/contract.md, prefill), for
// every caller and every device, on validate/common.h's helpers. The values only the device sees
// (ks, ke) are not checked here; the kernels clamp them.
#pragma once
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

#include <cstdint>
#include <limits>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/validate/common.h"

namespace ffi_dsa {

// The sizes the prefill arguments define: M query rows of H heads over N keys, K outputs a row.
struct PrefillShape {
  int64_t rows = 0, num_keys = 0, topk = 0;
  int32_t heads = kNumHeads;
};

// Raw views of validated prefill arguments; what the kernels consume.
struct PrefillArgs : PrefillShape {
  const uint8_t* q = nullptr;        // [M * H, 128] fp8 bytes
  const uint8_t* k = nullptr;        // [N, 128] fp8 bytes
  const float* k_scale = nullptr;    // [N]
  const float* weights = nullptr;    // [M, H]
  const int32_t* ks = nullptr;       // [M]
  const int32_t* ke = nullptr;       // [M]
  int32_t* topk_indices = nullptr;   // [M, K]
  DLDevice device{kDLCPU, 0};

  int64_t KeyBegin(int64_t row) const { return PrefillKeyBegin(ks[row]); }
  int64_t KeyCount(int64_t row) const { return PrefillKeyCount(ks[row], ke[row], num_keys); }
};

// How messages name the prefill arguments, in the op's order: the parameter names of
// ffi_dsa.prefill_call. ffi_dsa/prefill.py ARG_NAMES holds the same strings.
inline constexpr const char* kPrefillArgNames[7] = {"q", "k", "k_scale", "weights", "ks", "ke", "topk_indices"};

// Checks dtypes, ranks, shapes against each other, K, devices and contiguity. Argument order:
// q [M, H, 128], k [N, 128], k_scale [N], weights [M, H], ks [M], ke [M], topk_indices [M, K].
inline PrefillShape CheckPrefillMeta(const ArgMeta& q, const ArgMeta& k, const ArgMeta& k_scale,
                                     const ArgMeta& weights, const ArgMeta& ks, const ArgMeta& ke,
                                     const ArgMeta& topk_indices) {
  using namespace detail;
  CheckDType(q, IsFp8(q.dtype), kFp8Expected);
  CheckDType(k, IsFp8(k.dtype), kFp8Expected);
  CheckDType(k_scale, Is(k_scale.dtype, kDLFloat, 32), "float32");
  CheckDType(weights, Is(weights.dtype, kDLFloat, 32), "float32");
  CheckDType(ks, Is(ks.dtype, kDLInt, 32), "int32");
  CheckDType(ke, Is(ke.dtype, kDLInt, 32), "int32");
  CheckDType(topk_indices, Is(topk_indices.dtype, kDLInt, 32), "int32");

  CheckRank(q, 3, "[M, H, 128]");
  CheckRank(k, 2, "[N, 128]");
  CheckRank(k_scale, 1, "[N]");
  CheckRank(weights, 2, "[M, H]");
  CheckRank(ks, 1, "[M]");
  CheckRank(ke, 1, "[M]");
  CheckRank(topk_indices, 2, "[M, K]");

  PrefillShape s;
  s.rows = q.size(0);
  s.num_keys = k.size(0);
  s.heads = CheckHeads(q, 1);
  CheckDim(q, 2, kHeadDim, "head dim");
  CheckDim(k, 1, kHeadDim, "head dim");
  // Ids, ks and ke are int32: keys past that range could not be named.
  if (s.num_keys > std::numeric_limits<int32_t>::max()) {
    TVM_FFI_THROW(ValueError) << k.name << " has " << s.num_keys << " rows; ids are int32, so N must be <= "
                              << std::numeric_limits<int32_t>::max();
  }
  CheckDim(k_scale, 0, s.num_keys, "N, keys, from k");
  CheckDim(weights, 0, s.rows, "M, query rows, from q");
  CheckDim(weights, 1, s.heads, "H, index heads, from q");
  CheckDim(ks, 0, s.rows, "M, query rows, from q");
  CheckDim(ke, 0, s.rows, "M, query rows, from q");
  CheckDim(topk_indices, 0, s.rows, "M, query rows, from q");
  s.topk = CheckTopK(topk_indices);
  CheckPlacements({&q, &k, &k_scale, &weights, &ks, &ke, &topk_indices});
  return s;
}

// `expected_device_type` is the device the calling module serves (kDLCPU or kDLCUDA).
inline PrefillArgs CheckPrefillArgs(const tvm::ffi::TensorView& q, const tvm::ffi::TensorView& k,
                                    const tvm::ffi::TensorView& k_scale, const tvm::ffi::TensorView& weights,
                                    const tvm::ffi::TensorView& ks, const tvm::ffi::TensorView& ke,
                                    const tvm::ffi::TensorView& topk_indices, DLDeviceType expected_device_type) {
  using detail::DataAs;
  const auto m = ServedArgMetas(kPrefillArgNames, {q, k, k_scale, weights, ks, ke, topk_indices},
                                expected_device_type);
  PrefillArgs args;
  static_cast<PrefillShape&>(args) = CheckPrefillMeta(m[0], m[1], m[2], m[3], m[4], m[5], m[6]);
  args.q = DataAs<const uint8_t>(q);
  args.k = DataAs<const uint8_t>(k);
  args.k_scale = DataAs<const float>(k_scale);
  args.weights = DataAs<const float>(weights);
  args.ks = DataAs<const int32_t>(ks);
  args.ke = DataAs<const int32_t>(ke);
  args.topk_indices = DataAs<int32_t>(topk_indices);
  args.device = q.device();
  return args;
}

}  // namespace ffi_dsa
