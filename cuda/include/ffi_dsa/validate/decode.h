// The argument checks of decode, the paged top-k indexer (docs/contract.md), for every caller
// (torch, JAX, TVM, numpy) and every device, on validate/common.h's helpers. The values only the
// device sees (page ids, lengths) are not checked here; the kernels mask them.
#pragma once
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

#include <cstdint>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/validate/common.h"

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

// How messages name the arguments, in the op's order: the parameter names of ffi_dsa.call (and of
// the torch, JAX and TVM entry points), which is what the caller typed; docs/contract.md's names for
// q and k_cache follow in parentheses. ffi_dsa/_arrays.py ARG_NAMES holds the same strings.
inline constexpr const char* kArgNames[6] = {"q (q_index_fp8)", "k_cache (k_index_cache_fp8)", "weights",
                                              "seq_lens", "block_table", "topk_indices"};

namespace detail {

// An argument with one row per query token: [B, N, ...] (rank `split_rank`) or [B * N, ...].
inline void CheckQueryRows(const ArgMeta& t, int split_rank, const IndexerShape& s, const char* rows_layout,
                           const std::string& accepted = "") {
  if (t.ndim() == split_rank) {
    CheckDim(t, 0, s.batch, "B, from q", accepted);
    CheckDim(t, 1, s.queries, "N, query tokens per row, from q", accepted);
  } else {
    CheckDim(t, 0, s.batch * s.queries, rows_layout, accepted);
  }
}

// The checks every paged op shares (decode, MXFP4, docs/contract.md §7 and §9) on the arguments
// beside q and the cache: weights, seq_lens, block_table, topk_indices. Each step is one kind of
// check over all of them, so an op runs dtypes across all its arguments first, then q's and the
// cache's shapes, then these (CheckRowArgDims: ranks and sizes, explained in q's numbers).
inline void CheckRowArgDTypes(const ArgMeta& weights, const ArgMeta& seq_lens, const ArgMeta& block_table,
                              const ArgMeta& topk_indices) {
  CheckDType(weights, Is(weights.dtype, kDLFloat, 32), "float32");
  CheckDType(seq_lens, Is(seq_lens.dtype, kDLInt, 32), "int32");
  CheckDType(block_table, Is(block_table.dtype, kDLInt, 32), "int32");
  CheckDType(topk_indices, Is(topk_indices.dtype, kDLInt, 32), "int32");
}

// B, N and H from q ([B, H, bytes] or [B, N, H, bytes], already of rank 3 or 4), whose last
// dimension must be `head_bytes` (`head_what` says what they hold).
inline IndexerShape PagedQueryShape(const ArgMeta& q, int64_t head_bytes, const char* head_what) {
  IndexerShape s;
  s.batch = q.size(0);
  if (q.ndim() == 4) {
    const int64_t n = q.size(1);
    if (n < 1 || n > kMaxQueries) {
      TVM_FFI_THROW(ValueError) << q.name << " dimension 1 (N, query tokens per row) must be in 1.." << kMaxQueries
                                << ", got shape " << ShapeString(q);
    }
    s.queries = static_cast<int32_t>(n);
  }
  s.heads = CheckHeads(q, q.ndim() - 2);
  CheckDim(q, q.ndim() - 1, head_bytes, head_what);
  return s;
}

// k_cache's shape [num_pages, 64, 1, token_bytes] (its rank already checked).
inline void CheckPageDims(const ArgMeta& k_cache, int64_t token_bytes, const char* token_what) {
  CheckDim(k_cache, 1, kPageTokens, "tokens per page");
  CheckDim(k_cache, 2, 1, "the layout's single key head");
  CheckDim(k_cache, 3, token_bytes, token_what);
}

// The shapes of weights, seq_lens, block_table and topk_indices against q's B, N and H. The fast
// path compares integers; a message, built only for a mistake, names the dimension that is wrong
// and then every shape that would do, in the caller's numbers. Fills s.per_query_lens and s.topk.
inline void CheckRowArgDims(const ArgMeta& q, IndexerShape& s, const ArgMeta& weights, const ArgMeta& seq_lens,
                            const ArgMeta& block_table, const ArgMeta& topk_indices) {
  const int64_t b = s.batch, n = s.queries, h = s.heads, bn = s.batch * s.queries;
  auto sizes = [&] {
    return "B = " + Dim(b) + ", N = " + Dim(n) + ", H = " + Dim(h) + " from q of shape " + ShapeString(q);
  };
  if (!ShapeIs(weights, {bn, h}) && !ShapeIs(weights, {b, n, h})) {
    std::string ok = AcceptedShapes(
        weights, {{{Dim(bn), Dim(h)}, "[B * N, H]"}, {{Dim(b), Dim(n), Dim(h)}, "[B, N, H]"}}, sizes());
    if (ShapeIs(weights, {bn, h, 1})) ok += " (a [B * N, H, 1] buffer holds those bytes: squeeze its last dimension)";
    CheckRankIn(weights, 2, "[B * N, H]", 3, "[B, N, H]", ok);
    CheckQueryRows(weights, 3, s, "B * N, query rows, from q", ok);
    CheckDim(weights, weights.ndim() - 1, h, "H, index heads, from q", ok);
  }
  if (!ShapeIs(seq_lens, {b}) && !ShapeIs(seq_lens, {b, n})) {
    const std::string ok = AcceptedShapes(seq_lens, {{{Dim(b)}, "[B]"}, {{Dim(b), Dim(n)}, "[B, N]"}}, sizes());
    CheckRankIn(seq_lens, 1, "[B]", 2, "[B, N]", ok);
    CheckDim(seq_lens, 0, b, "B, from q", ok);
    if (seq_lens.ndim() == 2) CheckDim(seq_lens, 1, n, "N, query tokens per row, from q", ok);
  }
  if (!ShapeIs(block_table, {b, -1})) {
    const std::string ok = AcceptedShapes(block_table, {{{Dim(b), "max_num_pages"}, "[B, max_num_pages]"}}, sizes());
    CheckRank(block_table, 2, "[B, max_num_pages]", ok);
    CheckDim(block_table, 0, b, "B, from q", ok);
  }
  if (!ShapeIs(topk_indices, {bn, -1}) && !ShapeIs(topk_indices, {b, n, -1})) {
    const std::string ok =
        AcceptedShapes(topk_indices, {{{Dim(bn), "K"}, "[B * N, K]"}, {{Dim(b), Dim(n), "K"}, "[B, N, K]"}},
                       sizes() + ", K <= " + Dim(kMaxTopK));
    CheckRankIn(topk_indices, 2, "[B * N, K]", 3, "[B, N, K]", ok);
    CheckQueryRows(topk_indices, 3, s, "B * N, query rows, from q", ok);
  }
  s.per_query_lens = seq_lens.ndim() == 2;
  s.topk = CheckTopK(topk_indices);
}


// A cache whose tokens have the other page format's size, named as that format with the entry
// point that takes it (an FP8 page given to the MXFP4 op, or the reverse).
inline void CheckNotOtherPageFormat(const ArgMeta& k_cache, int64_t other_token_bytes, const char* other,
                                    const char* expected) {
  if (k_cache.ndim() == 4 && k_cache.size(3) == other_token_bytes) {
    TVM_FFI_THROW(ValueError) << k_cache.name << " holds " << other << " (" << other_token_bytes
                              << " bytes per token, shape " << ShapeString(k_cache) << "); this op takes "
                              << expected;
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
  CheckDType(q, IsFp8(q.dtype), kFp8Expected);
  CheckDType(k_cache, IsByte(k_cache.dtype), "int8 or uint8 (packed fp8 + scale bytes)");
  CheckRowArgDTypes(weights, seq_lens, block_table, topk_indices);

  // then q, whose B, N and H the other shapes are checked (and explained) in
  CheckRankIn(q, 3, "[B, H, 128]", 4, "[B, N, H, 128]");
  CheckRank(k_cache, 4, "[num_pages, 64, 1, 132]",
            k_cache.ndim() == 2 || k_cache.ndim() == 3
                ? "; a [num_pages, 8448] or [num_pages, 64, 132] buffer holds those bytes: view it as "
                  "[num_pages, 64, 1, 132]"
                : "");
  IndexerShape s = PagedQueryShape(q, kHeadDim, "head dim");
  CheckNotOtherPageFormat(k_cache, kMxfp4TokenBytes, "MXFP4 pages",
                          "FP8 pages of 132 bytes per token: call ffi_dsa.mxfp4_call / mxfp4_topk_indexer for "
                          "MXFP4 pages");
  CheckPageDims(k_cache, kTokenBytes, "128 fp8 bytes + 4 scale bytes");
  CheckRowArgDims(q, s, weights, seq_lens, block_table, topk_indices);
  CheckPlacements({&q, &k_cache, &weights, &seq_lens, &block_table, &topk_indices});
  return s;
}

namespace detail {
// The pointers and sizes of a paged op's checked arguments (decode's; the MXFP4 op adds q_scale).
inline void SetPagedArgs(IndexerArgs& args, const tvm::ffi::TensorView& q, const tvm::ffi::TensorView& k_cache,
                         const tvm::ffi::TensorView& weights, const tvm::ffi::TensorView& seq_lens,
                         const tvm::ffi::TensorView& block_table, const tvm::ffi::TensorView& topk_indices) {
  args.q = DataAs<const uint8_t>(q);
  args.k_cache = DataAs<const uint8_t>(k_cache);
  args.weights = DataAs<const float>(weights);
  args.seq_lens = DataAs<const int32_t>(seq_lens);
  args.block_table = DataAs<const int32_t>(block_table);
  args.topk_indices = DataAs<int32_t>(topk_indices);
  args.num_pages = k_cache.size(0);
  args.max_pages = block_table.size(1);
  args.device = q.device();
}
}  // namespace detail

// `expected_device_type` is the device the calling module serves (kDLCPU or kDLCUDA).
inline IndexerArgs CheckIndexerArgs(const tvm::ffi::TensorView& q, const tvm::ffi::TensorView& k_cache,
                                    const tvm::ffi::TensorView& weights,
                                    const tvm::ffi::TensorView& seq_lens,
                                    const tvm::ffi::TensorView& block_table,
                                    const tvm::ffi::TensorView& topk_indices,
                                    DLDeviceType expected_device_type) {
  const auto m = ServedArgMetas(kArgNames, {q, k_cache, weights, seq_lens, block_table, topk_indices},
                                expected_device_type);
  IndexerArgs args;
  static_cast<IndexerShape&>(args) = CheckIndexerMeta(m[0], m[1], m[2], m[3], m[4], m[5]);
  detail::SetPagedArgs(args, q, k_cache, weights, seq_lens, block_table, topk_indices);
  return args;
}

}  // namespace ffi_dsa
