// What every op's argument checks share (validate/decode.h, validate/prefill.h): an argument's
// metadata, the checks on one argument, and the preamble and tail of an op's check. Caller mistakes
// raise ValueError/TypeError naming the argument; nothing is launched or written before an op's
// check returns.
#pragma once
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "ffi_dsa/contract.h"

namespace ffi_dsa {

// What validation needs to know of one argument. Built from a TensorView, or from a bare shape
// and dtype for callers that have no buffer yet (JAX tracing), so both share every check.
struct ArgMeta {
  const char* name = "";
  std::vector<int64_t> shape;
  DLDataType dtype{};
  DLDevice device{kDLCPU, 0};
  bool contiguous = true;

  int ndim() const { return static_cast<int>(shape.size()); }
  int64_t size(int i) const { return shape[i]; }
};

inline ArgMeta MetaOf(const char* name, const tvm::ffi::TensorView& t) {
  ArgMeta m;
  m.name = name;
  m.shape.assign(t.shape().begin(), t.shape().end());
  m.dtype = t.dtype();
  m.device = t.device();
  m.contiguous = t.IsContiguous();
  return m;
}

inline ArgMeta MetaOf(const char* name, const tvm::ffi::Array<int64_t>& shape, DLDataType dtype) {
  ArgMeta m;
  m.name = name;
  m.shape.assign(shape.begin(), shape.end());
  m.dtype = dtype;
  return m;
}

// The preamble of an op's check: q (the first argument) is on the device type the calling module
// serves (kDLCPU or kDLCUDA), and every argument's metadata, named `names` in the op's order.
template <size_t N>
std::array<ArgMeta, N> ServedArgMetas(const char* const (&names)[N],
                                      std::initializer_list<tvm::ffi::TensorView> tensors,
                                      DLDeviceType expected_device_type) {
  const tvm::ffi::TensorView& q = *tensors.begin();
  if (q.device().device_type != expected_device_type) {
    TVM_FFI_THROW(ValueError) << names[0] << " is on device type " << q.device().device_type
                              << " but this module serves device type " << expected_device_type;
  }
  std::array<ArgMeta, N> metas;
  size_t i = 0;
  for (const tvm::ffi::TensorView& t : tensors) {
    metas[i] = MetaOf(names[i], t);
    ++i;
  }
  return metas;
}

// The metadata of an op's arguments from their shapes and dtypes alone, for callers that check
// before any buffer exists (JAX at trace time), named `names` in the op's order.
template <size_t N>
std::array<ArgMeta, N> ShapeArgMetas(const char* const (&names)[N], const tvm::ffi::Array<tvm::ffi::Array<int64_t>>& shapes,
                                     const tvm::ffi::Array<DLDataType>& dtypes) {
  if (shapes.size() != N || dtypes.size() != N) {
    TVM_FFI_THROW(ValueError) << "expected the shapes and dtypes of " << N << " arguments, got " << shapes.size()
                              << " shapes and " << dtypes.size() << " dtypes";
  }
  std::array<ArgMeta, N> metas;
  for (size_t i = 0; i < N; ++i) metas[i] = MetaOf(names[i], shapes[i], dtypes[i]);
  return metas;
}

namespace detail {

inline std::string DTypeName(DLDataType t) {
  switch (t.code) {
    case kDLInt: return "int" + std::to_string(t.bits);
    case kDLUInt: return "uint" + std::to_string(t.bits);
    case kDLFloat: return "float" + std::to_string(t.bits);
    case kDLBfloat: return "bfloat" + std::to_string(t.bits);
    case kDLFloat8_e4m3fn: return "float8_e4m3fn";
    case kDLFloat8_e5m2: return "float8_e5m2";
    default: return "dtype(code=" + std::to_string(t.code) + ", bits=" + std::to_string(t.bits) + ")";
  }
}

inline std::string ShapeString(const ArgMeta& t) {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < t.ndim(); ++i) os << (i ? ", " : "") << t.size(i);
  os << "]";
  return os.str();
}

inline bool IsByte(DLDataType t) {
  return t.lanes == 1 && t.bits == 8 && (t.code == kDLInt || t.code == kDLUInt);
}
inline bool Is(DLDataType t, int code, int bits) {
  return t.lanes == 1 && t.bits == bits && t.code == code;
}
// FP8 E4M3 values, or a uint8/int8 view of the same bytes.
inline bool IsFp8(DLDataType t) { return Is(t, kDLFloat8_e4m3fn, 8) || IsByte(t); }
constexpr const char* kFp8Expected = "float8_e4m3fn (or a uint8/int8 view of the same bytes)";

// `accepted`, when not empty, ends a shape message: the shapes that would do, in the caller's numbers
// (AcceptedShapes), so that a mistake in one dimension is answered with the whole fix.
inline void CheckRank(const ArgMeta& t, int rank, const char* layout, const std::string& accepted = "") {
  if (t.ndim() != rank) {
    TVM_FFI_THROW(ValueError) << t.name << " must have rank " << rank << " " << layout << ", got shape "
                              << ShapeString(t) << accepted;
  }
}

inline void CheckRankIn(const ArgMeta& t, int rank_a, const char* layout_a, int rank_b, const char* layout_b,
                        const std::string& accepted = "") {
  if (t.ndim() != rank_a && t.ndim() != rank_b) {
    TVM_FFI_THROW(ValueError) << t.name << " must have rank " << rank_a << " " << layout_a << " or rank " << rank_b
                              << " " << layout_b << ", got shape " << ShapeString(t) << accepted;
  }
}

inline void CheckDim(const ArgMeta& t, int dim, int64_t expected, const char* what, const std::string& accepted = "") {
  if (t.size(dim) != expected) {
    TVM_FFI_THROW(ValueError) << t.name << " dimension " << dim << " must be " << expected << " ("
                              << what << "), got shape " << ShapeString(t) << accepted;
  }
}

// One shape an argument may take: its dimensions in the caller's numbers (or a name where any size
// does, such as "K") and its layout in the contract's letters ("[B * N, H]").
struct AcceptedShape {
  std::vector<std::string> dims;
  const char* layout;
};

// "; weights must be [6, 64] ([B * N, H]) or [3, 2, 64] ([B, N, H]), with B = 3, N = 2, H = 64 from
// q of shape [3, 2, 64, 128]": the end of a shape message (`sizes` says where the numbers come from).
inline std::string AcceptedShapes(const ArgMeta& t, std::initializer_list<AcceptedShape> shapes,
                                  const std::string& sizes) {
  std::ostringstream os;
  os << "; " << t.name << " must be ";
  const char* sep = "";
  for (const AcceptedShape& shape : shapes) {
    os << sep << "[";
    for (size_t i = 0; i < shape.dims.size(); ++i) os << (i ? ", " : "") << shape.dims[i];
    os << "] (" << shape.layout << ")";
    sep = " or ";
  }
  os << ", with " << sizes;
  return os.str();
}

inline std::string Dim(int64_t size) { return std::to_string(size); }

// Whether `t` has exactly the shape `dims` (an entry of -1 takes any size): the cheap test before
// the checks that name what is wrong, whose messages are built only when one is.
inline bool ShapeIs(const ArgMeta& t, std::initializer_list<int64_t> dims) {
  if (t.ndim() != static_cast<int>(dims.size())) return false;
  int i = 0;
  for (int64_t d : dims) {
    if (d >= 0 && t.size(i) != d) return false;
    ++i;
  }
  return true;
}

inline void CheckDType(const ArgMeta& t, bool ok, const char* expected) {
  if (!ok) TVM_FFI_THROW(TypeError) << t.name << " must be " << expected << ", got " << DTypeName(t.dtype);
}

// q's dimension `axis` is H, the index heads: kNumHeads or kNumHeadsNarrow.
inline int32_t CheckHeads(const ArgMeta& q, int axis) {
  if (!SupportedHeads(q.size(axis))) {
    TVM_FFI_THROW(ValueError) << q.name << " dimension " << axis << " (H, index heads) must be " << kNumHeads
                              << " or " << kNumHeadsNarrow << ", got shape " << ShapeString(q);
  }
  return static_cast<int32_t>(q.size(axis));
}

// The output's K, its last dimension, within what the kernels support.
inline int64_t CheckTopK(const ArgMeta& topk_indices) {
  const int64_t topk = topk_indices.size(topk_indices.ndim() - 1);
  if (topk > kMaxTopK) {
    // The DPS caller made topk_indices; an allocating entry point's caller asked for topk.
    TVM_FFI_THROW(ValueError) << topk_indices.name << " has K=" << topk << " columns (topk=" << topk
                              << " where the entry point allocates it); the kernel supports K <= " << kMaxTopK;
  }
  return topk;
}

// Every argument on q's device (the first one's), each contiguous.
inline void CheckPlacements(std::initializer_list<const ArgMeta*> args) {
  const DLDevice device = (*args.begin())->device;
  for (const ArgMeta* t : args) {
    if (t->device.device_type != device.device_type || t->device.device_id != device.device_id) {
      TVM_FFI_THROW(ValueError) << t->name << " is on device (" << t->device.device_type << ", "
                                << t->device.device_id << ") but q is on (" << device.device_type
                                << ", " << device.device_id << "); every argument must be on one device";
    }
    if (!t->contiguous) {
      TVM_FFI_THROW(ValueError) << t->name << " must be contiguous (row-major, no gaps); call "
                                << ".contiguous() first";
    }
  }
}

template <typename T>
T* DataAs(const tvm::ffi::TensorView& t) {
  return reinterpret_cast<T*>(static_cast<char*>(t.data_ptr()) + t.byte_offset());
}

}  // namespace detail
}  // namespace ffi_dsa
