"""Decode, the paged top-k indexer (docs/contract.md): the DPS call, the allocating form and the
host-side validation of page ids and lengths, as one instance of the op pattern (_op.py).

For each query row, score every cached token of its sequence with 64 (or 32) FP8 index heads and
return the ids of the K best, -1 padded: their global slots (page * 64 + slot, ``ids="slots"``) or
their positions t in the row (``ids="positions"``). With N query tokens per row (q ``[B, N, H, 128]``)
each query scores the prefix of its row it sees and gets its own top-K.
"""

from __future__ import annotations

import numpy as np

from . import _arrays, _op
from .contract import DECODE_IDS, DEFAULT_TOPK, PAGE_TOKENS

# What an output id is: a token's global slot, or its position in its row (contract.h).
IDS = DECODE_IDS
# the ``ids`` option -> the native flag positions, or ValueError naming it
positions = _op.choice_attr("ids", IDS, ("page * 64 + slot", "the token's position t in its row"))
# Above every int32 length: a larger bound says nothing more (and stays an int64 on every path).
_UNBOUNDED = 2**31 - 1


def max_seq_len_attr(max_seq_len) -> int:
    """The native attribute of ``max_seq_len`` (the caller's bound on the batch's longest row, a
    host int): 0 for None or 0 (unknown), else the int itself, capped at 2**31 - 1; ValueError
    naming it for anything else. Only the CUDA path plans with it, and a bound below a row's real
    length never changes the answer (only the speed), so no device data is read to check it."""
    if max_seq_len is None:
        return 0
    # a host int only: no bool, no tensor (reading a device scalar would sync with the device)
    if isinstance(max_seq_len, (int, np.integer)) and not isinstance(max_seq_len, bool) and max_seq_len >= 0:
        return min(int(max_seq_len), _UNBOUNDED)
    raise ValueError(f"max_seq_len must be None or an int >= 0 (a host-side bound on the batch's longest row; "
                     f"None and 0: unknown), got {max_seq_len!r}")


def output_shape(q_shape, topk) -> tuple:
    """The shape of the output an allocating caller makes for a q of shape `q_shape`
    (docs/contract.md §7): ``[B, N, K]`` for a rank-4 q ``[B, N, H, 128]``, else ``[B, K]``.
    Dimensions may be symbolic (torch SymInts, TVM PrimExprs). A q of any other rank still gets a
    shape, so that the C++ check, not this, names the mistake."""
    rank = len(q_shape)
    if rank == 4:
        return (q_shape[0], q_shape[1], topk)
    return (q_shape[0] if rank else 0, topk)


def _validate_inputs(q, k_cache, weights, seq_lens, block_table) -> None:
    validate_pages(k_cache, seq_lens, block_table)


def _workspace_rows(shapes) -> tuple[int, int]:
    """(query rows B * N, table pages): what sizes a CUDA call's scratch."""
    q_shape, block_table_shape = shapes[0], shapes[4]
    return q_shape[0] * (q_shape[1] if len(q_shape) == 4 else 1), block_table_shape[1]


OP = _op.Op(
    name="topk_indexer",
    params=("q", "k_cache", "weights", "seq_lens", "block_table", "topk_indices"),
    # ffi_dsa.call's parameter names (what the caller typed), docs/contract.md's names for q and
    # k_cache in parentheses: kArgNames of cuda/include/ffi_dsa/validate/decode.h
    arg_names=("q (q_index_fp8)", "k_cache (k_index_cache_fp8)", "weights", "seq_lens", "block_table",
               "topk_indices"),
    fp8_args=frozenset({0}),
    row_args=(0, 2, 3, 4),
    length_args=(3,),
    options=(_op.Option("sorted", False, (False, True), "sorted", _op.bool_attr("sorted")),
             _op.Option("ids", IDS[0], IDS, "positions", positions),
             _op.Option("max_seq_len", None, None, "max_seq_len", max_seq_len_attr)),
    output_shape=output_shape,
    validate=_validate_inputs,
    validate_with="ffi_dsa.validate_pages(k_cache, seq_lens, block_table)",
    workspace_rows=_workspace_rows,
)


def call(q, k_cache, weights, seq_lens, block_table, topk_indices, sorted: bool = False,
         validate: bool = False, *, ids: str = "slots", max_seq_len: int | None = None) -> None:
    """Destination-passing style: write the top-K token ids of each query row into `topk_indices`,
    as docs/contract.md defines them.

    Arguments are DLPack tensors (torch, CuPy, numpy on CPU) that all live on one device (JAX
    arrays are immutable: :func:`topk_indexer` returns one). q is ``[B, H, 128]`` or, with N query
    tokens per row, ``[B, N, H, 128]`` (H is 64 or 32); weights ``[B * N, H]`` or ``[B, N, H]``;
    seq_lens ``[B]`` or ``[B, N]``; topk_indices ``[B * N, K]`` or ``[B, N, K]``. K is the last
    dimension of ``topk_indices``. ``sorted=True`` orders each row by descending score instead of
    ascending position. ``ids="slots"`` (the default) writes each token's global slot
    ``block_table[b, t // 64] * 64 + t % 64``; ``ids="positions"`` its position t in the row (the same
    selection, ties and order). ``max_seq_len``: a host int bounding the batch's longest row (vLLM's
    ``attn_metadata.max_seq_len``); None or 0 is unknown. The CUDA path plans its work for it instead
    of the block table's width (the CPU path has nothing to plan); a bound below a row's real length
    never changes the answer, only the speed. Mistakes (dtype, shape, device, no tensor at all, an
    option's value) raise TypeError/ValueError naming the argument before anything is written.
    ``validate=True`` also checks page ids and lengths on the host (a device-to-host copy for CUDA
    inputs) and raises instead of masking them.
    """
    _op.call(OP, (q, k_cache, weights, seq_lens, block_table, topk_indices),
             OP.attrs({"sorted": sorted, "ids": ids, "max_seq_len": max_seq_len}), validate)


def topk_indexer(q, k_cache, weights, seq_lens, block_table, topk: int = DEFAULT_TOPK, sorted: bool = False,
                 validate: bool = False, *, ids: str = "slots", max_seq_len: int | None = None):
    """Allocating form of :func:`call`: int32 ``[B, topk]`` in q's framework (torch, numpy, JAX)
    and on its device, or ``[B, N, topk]`` for a rank-4 q ``[B, N, H, 128]``. On JAX arrays it is
    an XLA FFI call (ffi_dsa.jax_ops) that works under ``jax.jit`` (``topk``, ``sorted``, ``ids`` and
    ``max_seq_len`` static: each value of the bound compiles once, so round it up to a few buckets),
    ``jax.vmap`` and ``jax.shard_map``."""
    inputs = (q, k_cache, weights, seq_lens, block_table)
    options = {"sorted": sorted, "ids": ids, "max_seq_len": max_seq_len}
    if _arrays.framework(q) == "jax":
        from . import jax_ops

        return jax_ops.call(OP, inputs, topk, options, validate)
    return _op.allocate_and_call(OP, inputs, topk, options, validate)


def validate_pages(k_cache, seq_lens, block_table) -> None:
    """Raise ValueError for what the kernels would otherwise mask or take as it stands: negative or
    too-long lengths, page ids outside ``[0, num_pages)`` among the pages a row uses, and a page id
    repeated among them (both columns named).

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
        entry = _entry_name(b, (longest,) if lens.ndim == 2 else ())
        if bad.size:
            j = int(bad[0])
            raise ValueError(f"block_table[{b}, {j}] = {int(used[j])} is not a page id in [0, {num_pages}) "
                             f"and row {b} uses it ({entry} = {n})")
        repeat = _repeated_page(used)
        if repeat:
            first, second = repeat
            raise ValueError(f"block_table[{b}, {first}] and block_table[{b}, {second}] are both page "
                             f"{int(used[first])} and row {b} uses both ({entry} = {n}): a page holds {PAGE_TOKENS} "
                             "consecutive tokens of a row, so a page listed twice in one row is a broken block table "
                             "(its tokens would be candidates twice, and with ids=\"slots\" their ids would repeat)")


def _repeated_page(used: np.ndarray) -> tuple[int, int] | None:
    """The columns (first, second) of the earliest repeat of a page id in a row's used pages, else None."""
    if used.size < 2:
        return None
    order = np.argsort(used, kind="stable")  # equal ids keep their columns' order
    same = np.nonzero(used[order[1:]] == used[order[:-1]])[0]
    if not same.size:
        return None
    i = same[np.argmin(order[same + 1])]  # the pair whose second column comes first
    return int(order[i]), int(order[i + 1])


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

__all__ = ["call", "topk_indexer", "validate_pages", "output_shape", "OP", "IDS"]
