"""A plain float64 reference of the MXFP4 op (docs/contract.md §9) and its tolerance check, beside
decode_reference.py, whose selection, candidates and checks it reuses: only the scores differ.

``score[t] = sum_h w[h] * relu(sum_c 2^(sq[h, c] + sk[t, c] - 254) * sum_{d in block c} e2m1(q[h, d]) *
e2m1(k[t, d]))``, in float64, where every term is exact (a UE8M0 byte of 255 is NaN, and makes its
block, so the logit and the score, NaN).
"""

from __future__ import annotations

import numpy as np

from ._arrays import to_numpy
from .contract import DEFAULT_TOPK, PAGE_TOKENS
from .decode import output_shape
from .decode_reference import (MAGNITUDE_TOLERANCE, TOLERANCE, RowScores, check_topk, row_scores, select_rows,
                               visible_lengths)
from .mxfp4_cache import dequantize, q_scale_bytes, unpack_mxfp4_k_cache, unpack_nibbles


def dequantized_queries(q, q_scale) -> np.ndarray:
    """float64 query values ``[B * N, H, 128]`` of q ``[B, (N,) H, 64]`` and q_scale ``[B, (N,) H]``."""
    q = to_numpy(q).view(np.uint8)
    heads = q.shape[-2]
    values = dequantize(unpack_nibbles(q), q_scale_bytes(q_scale).reshape(*q.shape[:-1], -1))
    return values.reshape(-1, heads, values.shape[-1])


def reference_mxfp4_scores(q, q_scale, k_cache, weights, seq_lens, block_table, magnitude: bool = True
                           ) -> list[RowScores]:
    """One RowScores per query row (query j of row b is query row b * N + j), as
    ffi_dsa.reference_scores gives for FP8 pages: tokens on pages outside [0, num_pages) are not
    candidates, lengths are clamped to [0, max_num_pages * 64]. M[t], the magnitude behind a score
    (the tolerance's second term), is over the same exact sums."""
    qf = dequantized_queries(q, q_scale)
    rows_count, heads = qf.shape[:2]
    q_shape = tuple(q.shape)
    queries = q_shape[1] if len(q_shape) == 4 else 1
    w = to_numpy(weights).astype(np.float64).reshape(rows_count, heads)
    table = to_numpy(block_table).astype(np.int64)
    codes, scale_bytes = unpack_mxfp4_k_cache(k_cache)
    num_pages, max_pages = codes.shape[0], table.shape[1]
    lens = visible_lengths(to_numpy(seq_lens), queries, max_pages)
    rows = []
    for r in range(rows_count):
        t = np.arange(lens[r])
        page = table[r // queries, t // PAGE_TOKENS]
        slot = t % PAGE_TOKENS
        valid = (page >= 0) & (page < num_pages)
        t, page, slot = t[valid], page[valid], slot[valid]
        keys = dequantize(codes[page, slot], scale_bytes[page, slot])
        rows.append(row_scores(keys, qf[r], w[r], t, page * PAGE_TOKENS + slot, magnitude))
    return rows


def reference_mxfp4(q, q_scale, k_cache, weights, seq_lens, block_table, topk: int = DEFAULT_TOPK,
                    sorted: bool = False, *, ids: str = "slots") -> np.ndarray:
    """The exact answer under float64 scores, int32 ``[B, topk]`` (``[B, N, topk]`` for a rank-4 q)."""
    rows = reference_mxfp4_scores(q, q_scale, k_cache, weights, seq_lens, block_table, magnitude=False)
    return select_rows(rows, topk, sorted, ids=ids).reshape(output_shape(to_numpy(q).shape, topk))


def check_mxfp4_topk(indices, q, q_scale, k_cache, weights, seq_lens, block_table, *, sorted: bool = False,
                     ids: str = "slots", rows: list[RowScores] | None = None, tolerance: float = TOLERANCE,
                     magnitude_tolerance: float = MAGNITUDE_TOLERANCE) -> list[str]:
    """Problems found in `indices` under decode's tolerance rule (ffi_dsa.check_topk) with the MXFP4
    reference scores; an empty list means correct."""
    rows = rows if rows is not None else reference_mxfp4_scores(q, q_scale, k_cache, weights, seq_lens, block_table)
    return check_topk(indices, None, None, None, None, None, sorted=sorted, ids=ids, rows=rows,
                      tolerance=tolerance, magnitude_tolerance=magnitude_tolerance)


__all__ = ["reference_mxfp4_scores", "reference_mxfp4", "check_mxfp4_topk", "dequantized_queries"]
