"""Public entry points: the DPS call and the allocating wrapper."""

from __future__ import annotations

import operator

import numpy as np

from . import _arrays, _ffi_api
from .contract import DEFAULT_TOPK, MAX_TOPK, PAGE_TOKENS

# module globals, not a tuple lookup per call: call() is on the eager hot path
_Q, _K_CACHE, _WEIGHTS, _SEQ_LENS, _BLOCK_TABLE, _TOPK_INDICES = _arrays.ARG_NAMES


def call(q, k_cache, weights, seq_lens, block_table, topk_indices, sorted: bool = False,
         validate: bool = False) -> None:
    """Destination-passing style: write the top-K token ids of each query row into `topk_indices`,
    as docs/contract.md defines them.

    Arguments are DLPack tensors (torch, CuPy, numpy on CPU; JAX through
    ``ffi_dsa.integration.jax_ffi``) that all live on one device. q is ``[B, H, 128]`` or, with N
    query tokens per row, ``[B, N, H, 128]`` (H is 64 or 32); weights ``[B * N, H]`` or
    ``[B, N, H]``; seq_lens ``[B]`` or ``[B, N]``; topk_indices ``[B * N, K]`` or ``[B, N, K]``.
    K is the last dimension of ``topk_indices``.
    Mistakes (dtype, shape, device, no tensor at all) raise TypeError/ValueError naming the
    argument before anything is written.
    ``validate=True`` also checks page ids and lengths on the host (a device-to-host copy for
    CUDA inputs) and raises instead of masking them.
    """
    args = (q, k_cache, weights, seq_lens, block_table, topk_indices)
    # The C++ check (and tvm-ffi's conversion) rejects whatever is wrong; which argument is no
    # tensor at all is worked out only then (named_argument_error), off the per-call path.
    try:
        ready = (
            _arrays.as_dlpack_ready(q, _Q, fp8_ok=True),
            _arrays.as_dlpack_ready(k_cache, _K_CACHE),
            _arrays.as_dlpack_ready(weights, _WEIGHTS),
            _arrays.as_dlpack_ready(seq_lens, _SEQ_LENS),
            _arrays.as_dlpack_ready(block_table, _BLOCK_TABLE),
            _arrays.as_dlpack_ready(topk_indices, _TOPK_INDICES, output=True),
        )
        if validate:
            validate_pages(k_cache, seq_lens, block_table)
        kernel = _ffi_api.topk_indexer_for(_arrays.device_type(q))
    except (TypeError, ValueError, AttributeError, RuntimeError, BufferError) as err:
        raise _arrays.named_argument_error(err, args) from None
    try:
        kernel(*ready, bool(sorted))
    except (TypeError, ValueError, RuntimeError, BufferError) as err:
        raise _arrays.named_argument_error(err, args) from None


def checked_topk(topk) -> int:
    """K as an int, or ValueError, shared by every entry point that allocates the output: a
    negative K is no output shape (C++ cannot see it), and a K above MAX_TOPK is refused here,
    naming topk (the C++ check would name the output, which the caller never made)."""
    try:
        topk = operator.index(topk)
    except TypeError:
        raise TypeError(f"topk must be an int, got {topk!r}") from None
    if topk < 0:
        raise ValueError(f"topk must be >= 0, got {topk}")
    if topk > MAX_TOPK:
        raise ValueError(f"topk must be <= {MAX_TOPK} (the kernel supports K <= {MAX_TOPK}), got {topk}")
    return topk


def topk_indexer(q, k_cache, weights, seq_lens, block_table, topk: int = DEFAULT_TOPK, sorted: bool = False,
                 validate: bool = False):
    """Allocating form of :func:`call`: returns int32 ``[B, topk]`` in the caller's array type, or
    ``[B, N, topk]`` for a rank-4 q ``[B, N, H, 128]``."""
    if _arrays.framework(q) == "jax":
        from .integration import jax_ffi

        if validate:  # concrete arrays only: under jit there is nothing on the host to look at
            validate_pages(k_cache, seq_lens, block_table)

        return jax_ffi.topk_indexer(q, k_cache, weights, seq_lens, block_table, topk=topk, sorted=sorted)
    _arrays.check_tensor(q, _Q)
    topk = checked_topk(topk)
    out = _arrays.empty_like_framework(q, _arrays.output_shape(q.shape, topk), "int32")
    call(q, k_cache, weights, seq_lens, block_table, out, sorted=sorted, validate=validate)
    return out


def validate_pages(k_cache, seq_lens, block_table) -> None:
    """Raise ValueError for what the kernels would otherwise mask: negative or too-long lengths
    and page ids outside ``[0, num_pages)`` among the pages a row uses.

    seq_lens is ``[B]`` (each row's length: its last query sees the whole row, docs/contract.md §7)
    or ``[B, N]`` (each query's own length, every entry checked; a row uses the pages of its longest
    query)."""
    lens = _arrays.to_numpy(seq_lens).astype(np.int64)
    table = _arrays.to_numpy(block_table).astype(np.int64)
    if table.ndim != 2 or lens.ndim not in (1, 2) or lens.shape[0] != table.shape[0]:
        raise ValueError(f"seq_lens [B] or [B, N] and block_table [B, max_num_pages] disagree: "
                         f"{list(lens.shape)} vs {list(table.shape)}")
    _check_lengths(lens, table.shape[1])
    num_pages = int(k_cache.shape[0])
    for b in range(lens.shape[0]):
        row = lens[b].reshape(-1)
        longest = int(np.argmax(row)) if row.size else 0
        n = int(row[longest]) if row.size else 0
        used = table[b, : (n + PAGE_TOKENS - 1) // PAGE_TOKENS]
        bad = np.nonzero((used < 0) | (used >= num_pages))[0]
        if bad.size:
            j = int(bad[0])
            entry = _entry_name(b, (longest,) if lens.ndim == 2 else ())
            raise ValueError(f"block_table[{b}, {j}] = {int(used[j])} is not a page id in [0, {num_pages}) "
                             f"and row {b} uses it ({entry} = {n})")


def _entry_name(b: int, query_index: tuple) -> str:
    """seq_lens[b] or seq_lens[b, j]."""
    return f"seq_lens[{', '.join(str(int(i)) for i in (b, *query_index))}]"


def _check_lengths(lens: np.ndarray, max_pages: int) -> None:
    """Every length in [0, max_pages * 64], or ValueError naming the first entry that is not."""
    capacity = max_pages * PAGE_TOKENS
    for bad, what in ((lens < 0, "is negative"),
                      (lens > capacity, f"exceeds block_table's capacity of {capacity} tokens "
                                        f"({max_pages} pages of {PAGE_TOKENS})")):
        where = np.argwhere(bad)
        if where.size:
            index = tuple(int(i) for i in where[0])
            raise ValueError(f"{_entry_name(index[0], index[1:])} = {int(lens[index])} {what}")
