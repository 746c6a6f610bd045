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

  // q and k first: their M, H and N are the numbers the other shapes are checked (and explained) in
  CheckRank(q, 3, "[M, H, 128]");
  CheckRank(k, 2, "[N, 128]");
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
  const int64_t m = s.rows, h = s.heads, n = s.num_keys;
  auto sizes = [&] {
    return "M = " + Dim(m) + ", H = " + Dim(h) + " from q of shape " + ShapeString(q) + ", N = " + Dim(n) +
           " from k of shape " + ShapeString(k);
  };
  if (!ShapeIs(k_scale, {n})) {
    const std::string ok = AcceptedShapes(k_scale, {{{Dim(n)}, "[N]"}}, sizes());
    CheckRank(k_scale, 1, "[N]", ok);
    CheckDim(k_scale, 0, n, "N, keys, from k", ok);
  }
  if (!ShapeIs(weights, {m, h})) {
    const std::string ok = AcceptedShapes(weights, {{{Dim(m), Dim(h)}, "[M, H]"}}, sizes());
    CheckRank(weights, 2, "[M, H]", ok);
    CheckDim(weights, 0, m, "M, query rows, from q", ok);
    CheckDim(weights, 1, h, "H, index heads, from q", ok);
  }
  for (const ArgMeta* bound : {&ks, &ke}) {
    if (!ShapeIs(*bound, {m})) {
      const std::string ok = AcceptedShapes(*bound, {{{Dim(m)}, "[M]"}}, sizes());
      CheckRank(*bound, 1, "[M]", ok);
      CheckDim(*bound, 0, m, "M, query rows, from q", ok);
    }
  }
  if (!ShapeIs(topk_indices, {m, -1})) {
    const std::string ok =
        AcceptedShapes(topk_indices, {{{Dim(m), "K"}, "[M, K]"}}, sizes() + ", K <= " + Dim(kMaxTopK));
    CheckRank(topk_indices, 2, "[M, K]", ok);
    CheckDim(topk_indices, 0, m, "M, query rows, from q", ok);
  }
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
