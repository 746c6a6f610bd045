"""Decode over an MXFP4 cache (docs/contract.md §9, DeepSeek-V4's and GLM-5.2's "mxfp4" indexer
cache): the DPS call and the allocating form, as one more instance of the op pattern (_op.py).

The page format is the only difference from decode (decode.py): 68-byte tokens (64 bytes of E2M1
values, then 4 UE8M0 scale bytes, one per 32 values) instead of 132, and E2M1 queries with their
own scale bytes (``q_scale``, one int32 per head). The selection (ties, NaN, ``ids``,
``max_seq_len``, ``sorted``, the -1 tail, the clamps of device-only values) is decode's, its very
code on the CPU. The CUDA kernel is still to come: a CUDA tensor raises NotImplementedError.
"""

from __future__ import annotations

from . import _arrays, _op, decode
from .contract import DEFAULT_TOPK


def _validate_inputs(q, q_scale, k_cache, weights, seq_lens, block_table) -> None:
    decode.validate_pages(k_cache, seq_lens, block_table)


OP = _op.Op(
    name="mxfp4_topk_indexer",
    params=("q", "q_scale", "k_cache", "weights", "seq_lens", "block_table", "topk_indices"),
    # the parameter names are the messages' names: kMxfp4ArgNames of cuda/include/ffi_dsa/validate/mxfp4.h
    arg_names=("q", "q_scale", "k_cache", "weights", "seq_lens", "block_table", "topk_indices"),
    fp8_args=frozenset(),
    row_args=(0, 1, 3, 4, 5),
    length_args=(4,),
    options=decode.OP.options,  # decode's selection options, so decode's attributes
    output_shape=decode.output_shape,
    validate=_validate_inputs,
    validate_with="ffi_dsa.validate_pages(k_cache, seq_lens, block_table)",
    devices=("cpu",),
)


def mxfp4_call(q, q_scale, k_cache, weights, seq_lens, block_table, topk_indices, sorted: bool = False,
               validate: bool = False, *, ids: str = "slots", max_seq_len: int | None = None) -> None:
    """Destination-passing style: write the top-K token ids of each query row into `topk_indices`,
    scoring MXFP4 pages (docs/contract.md §9).

    q is uint8 ``[B, H, 64]`` or ``[B, N, H, 64]`` (H 64 or 32; a head's 128 E2M1 values, two per
    byte, element 2j in the low nibble of byte j), q_scale int32 ``[B, H]`` or ``[B, N, H]`` (byte c
    of each scales elements ``[32c, 32c + 32)`` of its head by ``2 ** (byte - 127)``), k_cache uint8
    ``[num_pages, 64, 1, 68]`` (pack_mxfp4_k_cache); weights, seq_lens, block_table, topk_indices and
    the options are :func:`ffi_dsa.call`'s. weights do not include any query scale. Mistakes (dtype,
    shape, device, an FP8 page or an FP8 query) raise TypeError/ValueError naming the argument before
    anything is written; a CUDA tensor raises NotImplementedError (no CUDA kernel yet).
    ``validate=True`` checks page ids and lengths on the host, as decode does.
    """
    _op.call(OP, (q, q_scale, k_cache, weights, seq_lens, block_table, topk_indices),
             OP.attrs({"sorted": sorted, "ids": ids, "max_seq_len": max_seq_len}), validate)


def mxfp4_topk_indexer(q, q_scale, k_cache, weights, seq_lens, block_table, topk: int = DEFAULT_TOPK,
                       sorted: bool = False, validate: bool = False, *, ids: str = "slots",
                       max_seq_len: int | None = None):
    """Allocating form of :func:`mxfp4_call`: int32 ``[B, topk]`` (``[B, N, topk]`` for a rank-4 q)
    in q's framework (numpy, torch, JAX) and on its device. On JAX arrays it is an XLA FFI call
    (ffi_dsa.jax_ops) under ``jax.jit`` (``topk``, ``sorted``, ``ids``, ``max_seq_len`` static),
    ``jax.vmap`` and over a mesh, as ffi_dsa.topk_indexer is."""
    inputs = (q, q_scale, k_cache, weights, seq_lens, block_table)
    options = {"sorted": sorted, "ids": ids, "max_seq_len": max_seq_len}
    if _arrays.framework(q) == "jax":
        from . import jax_ops

        return jax_ops.call(OP, inputs, topk, options, validate)
    return _op.allocate_and_call(OP, inputs, topk, options, validate)


__all__ = ["mxfp4_call", "mxfp4_topk_indexer", "OP"]
