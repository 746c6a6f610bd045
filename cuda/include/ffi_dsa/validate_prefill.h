// The argument checks of the prefill op (docs/contract.md, prefill), in validate.h's style and with
// its helpers: caller mistakes raise ValueError/TypeError naming the argument, before anything is
// written. The values only the device sees (ks, ke) are not checked here; the kernels clamp them.
#pragma once
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

#include <cstdint>
#include <limits>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/validate.h"

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
// ffi_dsa.prefill_topk_indexer. ffi_dsa/prefill.py ARG_NAMES holds the same strings.
inline constexpr const char* kPrefillArgNames[7] = {"q", "k", "k_scale", "weights", "ks", "ke", "topk_indices"};

// Checks dtypes, ranks, shapes against each other, K, devices and contiguity. Argument order:
// q [M, H, 128], k [N, 128], k_scale [N], weights [M, H], ks [M], ke [M], topk_indices [M, K].
inline PrefillShape CheckPrefillMeta(const ArgMeta& q, const ArgMeta& k, const ArgMeta& k_scale,
                                     const ArgMeta& weights, const ArgMeta& ks, const ArgMeta& ke,
                                     const ArgMeta& topk_indices) {
  using namespace detail;
  const char* fp8 = "float8_e4m3fn (or a uint8/int8 view of the same bytes)";
  CheckDType(q, Is(q.dtype, kDLFloat8_e4m3fn, 8) || IsByte(q.dtype), fp8);
  CheckDType(k, Is(k.dtype, kDLFloat8_e4m3fn, 8) || IsByte(k.dtype), fp8);
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
  if (!SupportedHeads(q.size(1))) {
    TVM_FFI_THROW(ValueError) << q.name << " dimension 1 (H, index heads) must be " << kNumHeads << " or "
                              << kNumHeadsNarrow << ", got shape " << ShapeString(q);
  }
  s.heads = static_cast<int32_t>(q.size(1));
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
  s.topk = topk_indices.size(1);
  if (s.topk > kMaxTopK) {
    TVM_FFI_THROW(ValueError) << "topk_indices has K=" << s.topk << " columns (topk=" << s.topk
                              << " where the entry point allocates it); the kernel supports K <= " << kMaxTopK;
  }
  for (const ArgMeta* t : {&q, &k, &k_scale, &weights, &ks, &ke, &topk_indices}) CheckPlacement(*t, q.device);
  return s;
}

// `expected_device_type` is the device the calling module serves (kDLCPU or kDLCUDA).
inline PrefillArgs CheckPrefillArgs(const tvm::ffi::TensorView& q, const tvm::ffi::TensorView& k,
                                    const tvm::ffi::TensorView& k_scale, const tvm::ffi::TensorView& weights,
                                    const tvm::ffi::TensorView& ks, const tvm::ffi::TensorView& ke,
                                    const tvm::ffi::TensorView& topk_indices, DLDeviceType expected_device_type) {
  using detail::DataAs;
  const auto& names = kPrefillArgNames;
  if (q.device().device_type != expected_device_type) {
    TVM_FFI_THROW(ValueError) << names[0] << " is on device type " << q.device().device_type
                              << " but this module serves device type " << expected_device_type;
  }
  PrefillArgs args;
  static_cast<PrefillShape&>(args) =
      CheckPrefillMeta(MetaOf(names[0], q), MetaOf(names[1], k), MetaOf(names[2], k_scale),
                       MetaOf(names[3], weights), MetaOf(names[4], ks), MetaOf(names[5], ke),
                       MetaOf(names[6], topk_indices));
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
