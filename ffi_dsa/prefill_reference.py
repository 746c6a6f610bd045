"""The float64 reference of the prefill op and its tolerance check (docs/contract.md, prefill):
decode's reference (ffi_dsa.reference) applied to each query row's key range.

A row's candidates are its keys ``j`` in ``[max(ks, 0), min(ke, N))`` in ascending ``j`` (their
positions, which break ties), named by ``j - max(ks, 0)`` (``ids="relative"``) or ``j``
(``ids="absolute"``). Inputs may be numpy, torch or JAX arrays on any device.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ._arrays import _strict_bool, to_numpy
from .contract import DEFAULT_TOPK
from .prefill import absolute_ids
from .decode_reference import MAGNITUDE_TOLERANCE, TOLERANCE, RowScores, check_topk, row_scores, select_rows


def key_ranges(ks, ke, num_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """(begin, count) int64 ``[M]`` of each row's keys, clamped as the kernels clamp them."""
    begin = np.maximum(to_numpy(ks).astype(np.int64), 0)
    end = np.minimum(to_numpy(ke).astype(np.int64), num_keys)
    return begin, np.maximum(end - begin, 0)


def decoded_keys(k, k_scale) -> tuple[np.ndarray, np.ndarray]:
    """(float64 ``[N, 128]`` fp8 values, float64 ``[N]`` scales) of the keys."""
    fp8 = to_numpy(k).view(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return fp8, to_numpy(k_scale).astype(np.float64)


def reference_prefill_scores(q, k, k_scale, weights, ks, ke, ids: str = "relative",
                             magnitude: bool = True) -> list[RowScores]:
    """score[i, j] = sum_h w[i, h] * relu(k_scale[j] * sum_d q[i, h, d] * k[j, d]) in float64, one
    RowScores per query row: positions ``j - begin``, ids as ``ids`` says (``magnitude`` as in
    ffi_dsa.reference.row_scores)."""
    base = absolute_ids(ids)
    qf = to_numpy(q).view(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    w = to_numpy(weights).astype(np.float64)
    keys, scales = decoded_keys(k, k_scale)
    begin, count = key_ranges(ks, ke, keys.shape[0])
    rows = []
    for i in range(qf.shape[0]):
        positions = np.arange(count[i])
        at = slice(begin[i], begin[i] + count[i])
        rows.append(row_scores(keys[at], qf[i], w[i], positions, positions + begin[i] * base, magnitude,
                               scales=scales[at]))
    return rows


def reference_prefill(q, k, k_scale, weights, ks, ke, topk: int = DEFAULT_TOPK, sorted: bool = False,
                      ids: str = "relative") -> np.ndarray:
    """The exact answer under float64 scores, int32 ``[M, topk]`` (numpy)."""
    sorted = _strict_bool("sorted", sorted)
    rows = reference_prefill_scores(q, k, k_scale, weights, ks, ke, ids=ids, magnitude=False)
    return select_rows(rows, topk, sorted)


def check_prefill_topk(indices, q, k, k_scale, weights, ks, ke, *, sorted: bool = False, ids: str = "relative",
                       rows: list[RowScores] | None = None, tolerance: float = TOLERANCE,
                       magnitude_tolerance: float = MAGNITUDE_TOLERANCE) -> list[str]:
    """Problems found in `indices` ``[M, K]`` under decode's tolerance rule (ffi_dsa.check_topk) on
    each row's keys; an empty list means correct. `rows` may be given (reference_prefill_scores with
    the same `ids`) to check several outputs against one computation."""
    rows = rows if rows is not None else reference_prefill_scores(q, k, k_scale, weights, ks, ke, ids=ids)
    shape = to_numpy(indices).shape
    if len(shape) != 2 or shape[0] != len(rows):
        return [f"expected [M, K] = [{len(rows)}, K] ids, got shape {list(shape)}"]
    return check_topk(indices, None, None, None, None, None, sorted=sorted, rows=rows, tolerance=tolerance,
                      magnitude_tolerance=magnitude_tolerance)


__all__ = ["reference_prefill_scores", "reference_prefill", "check_prefill_topk", "key_ranges", "decoded_keys"]
