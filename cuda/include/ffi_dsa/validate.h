// One place that checks the operator's arguments for every caller (torch, JAX, TVM, numpy) and
// every device. Caller mistakes raise ValueError/TypeError naming the argument; nothing is
// launched or written before this returns.
#pragma once
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "ffi_dsa/contract.h"

namespace ffi_dsa {

// The sizes validation reads off the arguments' shapes.
struct IndexerShape {
  int64_t batch = 0, topk = 0;
  int32_t queries = 1;          // N, 1..kMaxQueries
  int32_t heads = kNumHeads;    // H, kNumHeads or kNumHeadsNarrow
  bool per_query_lens = false;  // seq_lens is [B, N]
};

// Raw views of validated arguments and their sizes; what the kernels consume. A "query row" is one
// query token of one row: query j of row b is query row b * queries + j, the row of weights, q
// heads and output it owns; the N query rows of a row share its block-table row.
struct IndexerArgs : IndexerShape {
  const uint8_t* q = nullptr;          // [B * N * H, 128] fp8 bytes
  const uint8_t* k_cache = nullptr;    // [num_pages, 8448] packed pages
  const float* weights = nullptr;      // [B * N, H]
  const int32_t* seq_lens = nullptr;   // [B] (causal offsets) or [B * N] (per_query_lens)
  const int32_t* block_table = nullptr;  // [B, max_pages]
  int32_t* topk_indices = nullptr;     // [B * N, K]
  int64_t num_pages = 0, max_pages = 0;
  DLDevice device{kDLCPU, 0};

  int64_t query_rows() const { return batch * queries; }
  // Tokens query row `qr` sees (docs/contract.md §7), clamped like any length.
  int64_t VisibleLength(int64_t qr) const {
    const int j = static_cast<int>(qr % queries);
    return VisibleTokens(seq_lens[SeqLensIndex(qr / queries, j, queries, per_query_lens)], j, queries,
                         per_query_lens, max_pages);
  }
};

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

// How messages name the arguments, in the op's order: the parameter names of ffi_dsa.call (and of
// the torch, JAX and TVM entry points), which is what the caller typed; docs/contract.md's names for
// q and k_cache follow in parentheses. ffi_dsa/_arrays.py ARG_NAMES holds the same strings.
inline constexpr const char* kArgNames[6] = {"q (q_index_fp8)", "k_cache (k_index_cache_fp8)", "weights",
                                              "seq_lens", "block_table", "topk_indices"};

inline ArgMeta MetaOf(const char* name, const tvm::ffi::TensorView& t) {
  ArgMeta m;
  m.name = name;
  m.shape.assign(t.shape().begin(), t.shape().end());
  m.dtype = t.dtype();
  m.device = t.device();
  m.contiguous = t.IsContiguous();
  return m;
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

inline void CheckRank(const ArgMeta& t, int rank, const char* layout) {
  if (t.ndim() != rank) {
    TVM_FFI_THROW(ValueError) << t.name << " must have rank " << rank << " " << layout << ", got shape "
                              << ShapeString(t);
  }
}

inline void CheckDim(const ArgMeta& t, int dim, int64_t expected, const char* what) {
  if (t.size(dim) != expected) {
    TVM_FFI_THROW(ValueError) << t.name << " dimension " << dim << " must be " << expected << " ("
                              << what << "), got shape " << ShapeString(t);
  }
}

inline void CheckDType(const ArgMeta& t, bool ok, const char* expected) {
  if (!ok) TVM_FFI_THROW(TypeError) << t.name << " must be " << expected << ", got " << DTypeName(t.dtype);
}

inline void CheckPlacement(const ArgMeta& t, DLDevice device) {
  if (t.device.device_type != device.device_type || t.device.device_id != device.device_id) {
    TVM_FFI_THROW(ValueError) << t.name << " is on device (" << t.device.device_type << ", "
                              << t.device.device_id << ") but q is on (" << device.device_type
                              << ", " << device.device_id << "); every argument must be on one device";
  }
  if (!t.contiguous) {
    TVM_FFI_THROW(ValueError) << t.name << " must be contiguous (row-major, no gaps); call "
                              << ".contiguous() first";
  }
}

template <typename T>
T* DataAs(const tvm::ffi::TensorView& t) {
  return reinterpret_cast<T*>(static_cast<char*>(t.data_ptr()) + t.byte_offset());
}



inline void CheckRankIn(const ArgMeta& t, int rank_a, const char* layout_a, int rank_b, const char* layout_b) {
  if (t.ndim() != rank_a && t.ndim() != rank_b) {
    TVM_FFI_THROW(ValueError) << t.name << " must have rank " << rank_a << " " << layout_a << " or rank " << rank_b
                              << " " << layout_b << ", got shape " << ShapeString(t);
  }
}

// An argument with one row per query token: [B, N, ...] (rank `split_rank`) or [B * N, ...].
inline void CheckQueryRows(const ArgMeta& t, int split_rank, const IndexerShape& s, const char* rows_layout) {
  if (t.ndim() == split_rank) {
    CheckDim(t, 0, s.batch, "B, from q");
    CheckDim(t, 1, s.queries, "N, query tokens per row, from q");
  } else {
    CheckDim(t, 0, s.batch * s.queries, rows_layout);
  }
}

}  // namespace detail

// Checks dtypes, ranks, shapes against each other, K, devices and contiguity, and returns the
// sizes they define. Argument order: q, k_cache, weights, seq_lens, block_table, topk_indices.
// docs/contract.md §2 and §7: q is [B, H, 128] (one query token per row) or [B, N, H, 128] with
// N in 1..4; H is 64 or 32; weights [B * N, H] or [B, N, H]; seq_lens [B] (the N queries are the
// row's last N tokens) or [B, N] (a length per query); topk_indices [B * N, K] or [B, N, K].
inline IndexerShape CheckIndexerMeta(const ArgMeta& q, const ArgMeta& k_cache, const ArgMeta& weights,
                                     const ArgMeta& seq_lens, const ArgMeta& block_table,
                                     const ArgMeta& topk_indices) {
  using namespace detail;
  // dtypes first: they are the most common mistake and the clearest message.
  CheckDType(q, Is(q.dtype, kDLFloat8_e4m3fn, 8) || IsByte(q.dtype),
             "float8_e4m3fn (or a uint8/int8 view of the same bytes)");
  CheckDType(k_cache, IsByte(k_cache.dtype), "int8 or uint8 (packed fp8 + scale bytes)");
  CheckDType(weights, Is(weights.dtype, kDLFloat, 32), "float32");
  CheckDType(seq_lens, Is(seq_lens.dtype, kDLInt, 32), "int32");
  CheckDType(block_table, Is(block_table.dtype, kDLInt, 32), "int32");
  CheckDType(topk_indices, Is(topk_indices.dtype, kDLInt, 32), "int32");

  CheckRankIn(q, 3, "[B, H, 128]", 4, "[B, N, H, 128]");
  CheckRank(k_cache, 4, "[num_pages, 64, 1, 132]");
  CheckRankIn(weights, 2, "[B * N, H]", 3, "[B, N, H]");
  CheckRankIn(seq_lens, 1, "[B]", 2, "[B, N]");
  CheckRank(block_table, 2, "[B, max_num_pages]");
  CheckRankIn(topk_indices, 2, "[B * N, K]", 3, "[B, N, K]");

  IndexerShape s;
  s.batch = q.size(0);
  const int head_dim = q.ndim() - 1, head_axis = q.ndim() - 2;
  if (q.ndim() == 4) {
    const int64_t n = q.size(1);
    if (n < 1 || n > kMaxQueries) {
      TVM_FFI_THROW(ValueError) << q.name << " dimension 1 (N, query tokens per row) must be in 1.." << kMaxQueries
                                << ", got shape " << ShapeString(q);
    }
    s.queries = static_cast<int32_t>(n);
  }
  if (!SupportedHeads(q.size(head_axis))) {
    TVM_FFI_THROW(ValueError) << q.name << " dimension " << head_axis << " (H, index heads) must be " << kNumHeads
                              << " or " << kNumHeadsNarrow << ", got shape " << ShapeString(q);
  }
  s.heads = static_cast<int32_t>(q.size(head_axis));
  CheckDim(q, head_dim, kHeadDim, "head dim");
  CheckDim(k_cache, 1, kPageTokens, "tokens per page");
  CheckDim(k_cache, 2, 1, "the layout's single key head");
  CheckDim(k_cache, 3, kTokenBytes, "128 fp8 bytes + 4 scale bytes");
  CheckQueryRows(weights, 3, s, "B * N, query rows, from q");
  CheckDim(weights, weights.ndim() - 1, s.heads, "H, index heads, from q");
  CheckDim(seq_lens, 0, s.batch, "B, from q");
  if (seq_lens.ndim() == 2) CheckDim(seq_lens, 1, s.queries, "N, query tokens per row, from q");
  s.per_query_lens = seq_lens.ndim() == 2;
  CheckDim(block_table, 0, s.batch, "B, from q");
  CheckQueryRows(topk_indices, 3, s, "B * N, query rows, from q");
  s.topk = topk_indices.size(topk_indices.ndim() - 1);
  if (s.topk > kMaxTopK) {
    // The DPS caller made topk_indices; an allocating entry point's caller asked for topk.
    TVM_FFI_THROW(ValueError) << "topk_indices has K=" << s.topk << " columns (topk=" << s.topk
                              << " where the entry point allocates it); the kernel supports K <= " << kMaxTopK;
  }
  for (const ArgMeta* t : {&q, &k_cache, &weights, &seq_lens, &block_table, &topk_indices}) {
    CheckPlacement(*t, q.device);
  }
  return s;
}

// `expected_device_type` is the device the calling module serves (kDLCPU or kDLCUDA).
inline IndexerArgs CheckIndexerArgs(const tvm::ffi::TensorView& q, const tvm::ffi::TensorView& k_cache,
                                    const tvm::ffi::TensorView& weights,
                                    const tvm::ffi::TensorView& seq_lens,
                                    const tvm::ffi::TensorView& block_table,
                                    const tvm::ffi::TensorView& topk_indices,
                                    DLDeviceType expected_device_type) {
  using detail::DataAs;
  if (q.device().device_type != expected_device_type) {
    TVM_FFI_THROW(ValueError) << kArgNames[0] << " is on device type " << q.device().device_type
                              << " but this module serves device type " << expected_device_type;
  }
  IndexerArgs args;
  static_cast<IndexerShape&>(args) =
      CheckIndexerMeta(MetaOf(kArgNames[0], q), MetaOf(kArgNames[1], k_cache), MetaOf(kArgNames[2], weights),
                       MetaOf(kArgNames[3], seq_lens), MetaOf(kArgNames[4], block_table),
                       MetaOf(kArgNames[5], topk_indices));
  args.q = DataAs<const uint8_t>(q);
  args.k_cache = DataAs<const uint8_t>(k_cache);
  args.weights = DataAs<const float>(weights);
  args.seq_lens = DataAs<const int32_t>(seq_lens);
  args.block_table = DataAs<const int32_t>(block_table);
  args.topk_indices = DataAs<int32_t>(topk_indices);
  args.num_pages = k_cache.size(0);
  args.max_pages = block_table.size(1);
  args.device = q.device();
  return args;
}

}  // namespace ffi_dsa
