"""Prefill entry points (docs/contract.md, prefill): the DPS call, the allocating wrapper and the
host-side validation of ks / ke.

A chunk of M query tokens (the rows), each over its own range ``[ks[i], ke[i])`` of one contiguous
key buffer ``k [N, 128]`` with per-key scales: the rows of several requests in one call (ragged),
each seeing its request's keys up to itself (causal ke). Scores, ties, NaN, +-0 and both output
orders are decode's.
"""

from __future__ import annotations

import functools

import numpy as np

from . import _arrays, _ffi_api
from .api import checked_topk
from .contract import DEFAULT_TOPK

# How messages name the arguments, in the op's order; the same strings as kPrefillArgNames of the
# C++ checks (cuda/include/ffi_dsa/validate_prefill.h).
ARG_NAMES = ("q", "k", "k_scale", "weights", "ks", "ke", "topk_indices")
_Q, _K, _K_SCALE, _WEIGHTS, _KS, _KE, _TOPK_INDICES = ARG_NAMES
# What an output id counts from: the row's (clamped) start ks[i], or k's first row.
IDS = ("relative", "absolute")


def absolute_ids(ids) -> bool:
    """The native flag for the ``ids`` option, or ValueError naming it."""
    if ids not in IDS:
        raise ValueError(f"ids must be 'relative' (j - ks[i]) or 'absolute' (j, a row of k), got {ids!r}")
    return ids == "absolute"


@functools.cache
def kernel_for(device_type: str):
    """The exported DPS prefill function serving tensors of `device_type` ('cpu' or 'cuda'), looked
    up once."""
    if device_type == "cpu":
        return _ffi_api.cpu().prefill_topk_indexer
    if device_type == "cuda":
        return _ffi_api.cuda().prefill_topk_indexer
    raise ValueError(f"ffi_dsa supports CPU and CUDA tensors, got a tensor on {device_type!r}")


def named_argument_error(err: Exception, args) -> Exception:
    """_arrays.named_argument_error with the prefill op's argument names."""
    return _arrays.named_argument_error(err, args, ARG_NAMES)


def prefill_topk_indexer(q, k, k_scale, weights, ks, ke, topk_indices, sorted: bool = False,
                         validate: bool = False, *, ids: str = "relative") -> None:
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
    args = (q, k, k_scale, weights, ks, ke, topk_indices)
    absolute = absolute_ids(ids)
    try:
        ready = (
            _arrays.as_dlpack_ready(q, _Q, fp8_ok=True),
            _arrays.as_dlpack_ready(k, _K, fp8_ok=True),
            _arrays.as_dlpack_ready(k_scale, _K_SCALE),
            _arrays.as_dlpack_ready(weights, _WEIGHTS),
            _arrays.as_dlpack_ready(ks, _KS),
            _arrays.as_dlpack_ready(ke, _KE),
            _arrays.as_dlpack_ready(topk_indices, _TOPK_INDICES, output=True),
        )
        kernel = kernel_for(_arrays.device_type(q))
        if validate:
            validate_prefill(k, ks, ke)
    except (TypeError, ValueError, AttributeError, RuntimeError, BufferError) as err:
        raise named_argument_error(err, args) from None
    try:
        kernel(*ready, bool(sorted), absolute)
    except (TypeError, ValueError, RuntimeError, BufferError) as err:
        raise named_argument_error(err, args) from None


def prefill_topk(q, k, k_scale, weights, ks, ke, topk: int = DEFAULT_TOPK, sorted: bool = False,
                 ids: str = "relative", validate: bool = False):
    """Allocating form of :func:`prefill_topk_indexer`: int32 ``[M, topk]`` in q's framework and on
    its device (JAX arrays go to ``ffi_dsa.integration.jax_prefill``)."""
    absolute_ids(ids)
    if _arrays.framework(q) == "jax":
        from .integration import jax_prefill

        if validate:  # concrete arrays only: under jit there is nothing on the host to look at
            validate_prefill(k, ks, ke)
        return jax_prefill.prefill_topk(q, k, k_scale, weights, ks, ke, topk=topk, sorted=sorted, ids=ids)
    _arrays.check_tensor(q, _Q)
    topk = checked_topk(topk)
    kernel_for(_arrays.device_type(q))  # a device without a kernel fails before anything is allocated
    out = _arrays.empty_like_framework(q, (q.shape[0] if len(q.shape) else 0, topk), "int32")
    prefill_topk_indexer(q, k, k_scale, weights, ks, ke, out, sorted=sorted, validate=validate, ids=ids)
    return out


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


__all__ = ["prefill_topk_indexer", "prefill_topk", "validate_prefill", "ARG_NAMES", "IDS"]
