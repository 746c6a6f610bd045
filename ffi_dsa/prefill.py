"""Prefill (docs/contract.md, prefill): the DPS call, the allocating form and the host-side
validation of ks / ke, as one instance of the op pattern (_op.py), laid out as decode.py is.

A chunk of M query tokens (the rows), each over its own range ``[ks[i], ke[i])`` of one contiguous
key buffer ``k [N, 128]`` with per-key scales: the rows of several requests in one call (ragged),
each seeing its request's keys up to itself (causal ke). Scores, ties, NaN, +-0 and both output
orders are decode's.
"""

from __future__ import annotations

import numpy as np

from . import _arrays, _op
from .contract import DEFAULT_TOPK, PREFILL_IDS

# What an output id counts from: the row's (clamped) start ks[i], or k's first row (contract.h).
IDS = PREFILL_IDS
# the ``ids`` option -> the native flag absolute_ids, or ValueError naming it
absolute_ids = _op.choice_attr("ids", IDS, ("j - ks[i]", "j, a row of k"))


def output_shape(q_shape, topk) -> tuple:
    """[M, topk]; a q of another rank still gets a shape, so that the C++ check names the mistake."""
    return (q_shape[0] if len(q_shape) else 0, topk)


def _validate_inputs(q, k, k_scale, weights, ks, ke) -> None:
    validate_prefill(k, ks, ke)


OP = _op.Op(
    name="prefill_topk_indexer",
    params=("q", "k", "k_scale", "weights", "ks", "ke", "topk_indices"),
    # the parameter names are the messages' names: kPrefillArgNames of cuda/include/ffi_dsa/validate/prefill.h
    arg_names=("q", "k", "k_scale", "weights", "ks", "ke", "topk_indices"),
    fp8_args=frozenset({0, 1}),
    row_args=(0, 3, 4, 5),
    length_args=(4, 5),
    options=(_op.Option("sorted", False, (False, True), "sorted", _op.bool_attr("sorted")),
             _op.Option("ids", "relative", IDS, "absolute_ids", absolute_ids)),
    output_shape=output_shape,
    validate=_validate_inputs,
    validate_with="ffi_dsa.validate_prefill(k, ks, ke)",
)


def prefill_call(q, k, k_scale, weights, ks, ke, topk_indices, sorted: bool = False, validate: bool = False, *,
                 ids: str = "relative") -> None:
    """Destination-passing style: write the top-K key ids of each query row into `topk_indices`.

    q ``[M, H, 128]`` (H 64 or 32) and k ``[N, 128]`` are float8_e4m3fn (or uint8/int8 views of
    the bytes), k_scale ``[N]`` and weights ``[M, H]`` float32, ks and ke ``[M]`` int32 (row i
    sees keys ``ks[i] <= j < ke[i]``), topk_indices ``[M, K]`` int32 with K <= 2048; all on one
    device. Row i gets the ``min(K, ke[i] - ks[i])`` best keys, then -1: ``j - ks[i]`` with
    ``ids="relative"``, ``j`` with ``ids="absolute"``. Mistakes (dtype, shape, device, no tensor)
    raise TypeError/ValueError naming the argument before anything is written. The kernels cut
    ``ke > N`` to N, count ``ks < 0`` as 0 and leave rows with ``ks >= ke`` empty;
    ``validate=True`` checks ks and ke on the host and raises instead (see validate_prefill).
    """
    _op.call(OP, (q, k, k_scale, weights, ks, ke, topk_indices), OP.attrs({"sorted": sorted, "ids": ids}), validate)


def prefill_topk_indexer(q, k, k_scale, weights, ks, ke, topk: int = DEFAULT_TOPK, sorted: bool = False,
                         validate: bool = False, *, ids: str = "relative"):
    """Allocating form of :func:`prefill_call`: int32 ``[M, topk]`` in q's framework (torch, numpy,
    JAX) and on its device. On JAX arrays it is an XLA FFI call (ffi_dsa.jax_ops) that works under
    ``jax.jit`` (``topk``, ``sorted`` and ``ids`` static) and ``jax.vmap``."""
    inputs, options = (q, k, k_scale, weights, ks, ke), {"sorted": sorted, "ids": ids}
    if _arrays.framework(q) == "jax":
        from . import jax_ops

        return jax_ops.call(OP, inputs, topk, options, validate)
    return _op.allocate_and_call(OP, inputs, topk, options, validate)


def validate_prefill(k, ks, ke) -> None:
    """Raise ValueError for what the kernels would otherwise clamp, naming the first such entry:
    ``ks[i] < 0``, ``ke[i] > N`` (k's rows) and ``ks[i] > ke[i]``. ``ks[i] == ke[i]`` is a valid
    empty row (its output is all -1), as a decode row of length 0 is."""
    starts = _arrays.to_numpy(ks).astype(np.int64)
    ends = _arrays.to_numpy(ke).astype(np.int64)
    if starts.ndim != 1 or starts.shape != ends.shape:
        raise ValueError(f"ks [M] and ke [M] disagree: {list(starts.shape)} vs {list(ends.shape)}")
    if len(k.shape) < 1:
        raise ValueError(f"k must have rank 2 [N, 128], got shape {list(k.shape)}")
    num_keys = int(k.shape[0])
    checks = ((starts < 0, lambda i: f"ks[{i}] = {starts[i]} is negative"),
              (ends > num_keys, lambda i: f"ke[{i}] = {ends[i]} exceeds N = {num_keys} (the rows of k)"),
              (starts > ends, lambda i: f"ks[{i}] = {starts[i]} is greater than ke[{i}] = {ends[i]}"))
    for bad, message in checks:
        if bad.any():
            raise ValueError(message(int(np.argmax(bad))))


__all__ = ["prefill_call", "prefill_topk_indexer", "validate_prefill", "OP", "IDS"]
