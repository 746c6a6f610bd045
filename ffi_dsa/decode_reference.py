"""A plain float64 reference of the operator, and the tolerance check of docs/contract.md §4.

Readable on purpose: it is the definition the fast paths are measured against, and a way for
users to check their own setups. Inputs may be numpy, torch or JAX arrays on any device.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ._arrays import _strict_bool, to_numpy
from .decode import output_shape, positions
from .contract import DEFAULT_TOPK, PAGE_TOKENS
from .kv_cache import unpack_k_cache

TOLERANCE = 1e-3  # of max|score| of the row: Hopper FP8 accumulation may swap near-ties at the cut
# of max_t M[t], the magnitude of the sums behind a score (sum_h |w| * sum_d |q * k|): Hopper's FP8
# tensor cores add with truncation, which loses up to ~0.4% when a row's products share one sign
MAGNITUDE_TOLERANCE = 2.0 ** -12


@dataclass
class RowScores:
    """Candidates of one row: their positions t, global ids and float64 scores (NaN kept), and
    max_t M[t], the largest magnitude of the sums behind a score (docs/contract.md, precision)."""

    positions: np.ndarray
    ids: np.ndarray
    scores: np.ndarray
    magnitude: float = 0.0


def visible_lengths(seq_lens, queries: int, max_pages: int) -> np.ndarray:
    """Tokens each query row sees, ``[B * N]`` int64 (docs/contract.md §7): with seq_lens ``[B]``
    query j of row b sees ``seq_lens[b] - (N - 1 - j)``, with ``[B, N]`` its own entry; then clamped
    to ``[0, max_pages * 64]`` like any length."""
    lens = np.asarray(seq_lens, dtype=np.int64)
    if lens.ndim == 1:
        lens = lens[:, None] - (queries - 1 - np.arange(queries))[None, :]
    return np.clip(lens, 0, max_pages * PAGE_TOKENS).reshape(-1)


def reference_scores(q, k_cache, weights, seq_lens, block_table, magnitude: bool = True) -> list[RowScores]:
    """score[t] = sum_h w[h] * relu(scale[t] * sum_d q[h, d] * fp8[t, d]), in float64, one
    RowScores per query row (query j of row b is query row b * N + j; N = 1 for a rank-3 q).

    Tokens on pages outside [0, num_pages) are not candidates; lengths are clamped to
    [0, max_num_pages * 64], exactly as the kernels mask them on the device.
    """
    qf = to_numpy(q).view(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    if qf.ndim == 3:
        qf = qf[:, None]                                           # [B, N = 1, H, D]
    batch, queries, heads = qf.shape[:3]
    qf = qf.reshape(batch * queries, heads, qf.shape[-1])  # B = 0 leaves nothing to infer -1 from
    w = to_numpy(weights).astype(np.float64).reshape(batch * queries, heads)
    table = to_numpy(block_table).astype(np.int64)
    fp8, scale = unpack_k_cache(k_cache)
    num_pages, max_pages = fp8.shape[0], table.shape[1]
    lens = visible_lengths(to_numpy(seq_lens), queries, max_pages)

    rows = []
    for r in range(batch * queries):
        t = np.arange(lens[r])
        page = table[r // queries, t // PAGE_TOKENS]
        slot = t % PAGE_TOKENS
        valid = (page >= 0) & (page < num_pages)
        t, page, slot = t[valid], page[valid], slot[valid]
        rows.append(row_scores(fp8[page, slot], qf[r], w[r], t, page * PAGE_TOKENS + slot, magnitude,
                               scales=scale[page, slot]))
    return rows


def row_scores(keys: np.ndarray, q_row: np.ndarray, w_row: np.ndarray, positions, ids,
               magnitude: bool = True, scales: np.ndarray | None = None) -> RowScores:
    """One row's RowScores from its candidates' float64 fp8 key values ``[n, D]`` and their scales
    ``[n]`` (None: `keys` already scaled), the row's float64 q ``[H, D]`` and weights ``[H]``, and the
    candidates' positions and global ids. A token's scale multiplies its logit, the sum over d
    (docs/contract.md §2: with a +-inf scale, per-product scaling would make nearly every logit NaN).
    ``magnitude=False`` skips max M (a second product of the row's size), which only the tolerance
    check reads."""
    with np.errstate(invalid="ignore", over="ignore"):
        logits = keys @ q_row.T                                    # [n, H]
        if scales is not None:
            logits = logits * scales[:, None]
        relu = np.where(logits < 0, 0.0, logits)                   # keeps NaN, as torch.relu does
        score = relu @ w_row
        m = (np.abs(keys) @ np.abs(q_row).T) @ np.abs(w_row) if magnitude else np.zeros(0)  # M[t]
        if magnitude and scales is not None:
            m = m * np.abs(scales)
    finite = m[np.isfinite(m)]
    return RowScores(positions=positions, ids=ids, scores=score,
                     magnitude=float(finite.max()) if finite.size else 0.0)


def rank_order(row: RowScores) -> np.ndarray:
    """Candidate indices best first: larger score, then smaller position; NaN last."""
    s = row.scores
    nan = np.isnan(s)
    return np.lexsort((row.positions, -np.where(nan, -np.inf, s), nan))


def reference(q, k_cache, weights, seq_lens, block_table, topk: int = DEFAULT_TOPK, sorted: bool = False, *,
              ids: str = "slots") -> np.ndarray:
    """The exact answer under float64 scores, as int32 ``[B, topk]`` (numpy), or ``[B, N, topk]``
    for a rank-4 q; ``ids`` as in ffi_dsa.call (global slots, or positions in the row)."""
    sorted = _strict_bool("sorted", sorted)
    rows = reference_scores(q, k_cache, weights, seq_lens, block_table, magnitude=False)
    return select_rows(rows, topk, sorted, ids=ids).reshape(output_shape(q.shape, topk))


def ids_of(row: RowScores, ids: str = "slots") -> np.ndarray:
    """The row's candidates' ids of the kind `ids` names: their global slots or their positions."""
    return row.positions if positions(ids) else row.ids


def select_rows(rows: list[RowScores], topk: int, sorted: bool = False, *, ids: str = "slots") -> np.ndarray:
    """The exact top-K ids of each row's candidates, int32 ``[len(rows), topk]`` with the -1 tail."""
    out = np.full((len(rows), topk), -1, dtype=np.int32)
    for b, row in enumerate(rows):
        best = rank_order(row)[:topk]
        if not sorted:
            best = np.sort(best)  # candidates are stored by ascending position
        out[b, : len(best)] = ids_of(row, ids)[best]
    return out


def check_topk(indices, q, k_cache, weights, seq_lens, block_table, *, sorted: bool = False, ids: str = "slots",
               rows: list[RowScores] | None = None, tolerance: float = TOLERANCE,
               magnitude_tolerance: float = MAGNITUDE_TOLERANCE) -> list[str]:
    """Problems found in `indices` under the tolerance rule; an empty list means correct.
    `indices` is ``[B, K]``, or ``[B, N, K]`` / ``[B * N, K]`` for a rank-4 q: one row per query row;
    its ids are global slots, or with ``ids="positions"`` positions in the row.

    A row is correct when: the count of -1 is exact and they form the tail; every id belongs to
    the row and appears once; the smallest chosen score is no smaller than the K-th largest
    reference score minus ``tolerance * max|score| + magnitude_tolerance * max M`` (M: the magnitude
    of the sums behind a score, docs/contract.md); NaN is chosen only when fewer than K
    numbers exist; and the valid prefix is ordered (ascending position, or descending score
    within the tolerance when ``sorted``).
    """
    positions(ids)  # a bad value: ValueError naming ids
    sorted = _strict_bool("sorted", sorted)
    out = to_numpy(indices).astype(np.int64)
    out = out.reshape(-1, out.shape[-1]) if out.ndim else out
    rows = rows if rows is not None else reference_scores(q, k_cache, weights, seq_lens, block_table)
    problems: list[str] = []
    topk = out.shape[1]
    for b, row in enumerate(rows):
        got = out[b]
        expected_count = min(topk, len(row.ids))
        valid = got[:expected_count]
        if np.any(got[expected_count:] != -1) or np.any(valid == -1):
            problems.append(f"row {b}: expected exactly {expected_count} ids then -1, got "
                            f"{int(np.sum(got != -1))} ids (first -1 at {int(np.argmax(got == -1)) if np.any(got == -1) else None})")
            continue
        if expected_count == 0:
            continue
        if len(np.unique(valid)) != expected_count:
            problems.append(f"row {b}: duplicate ids in the selection")
            continue
        lookup = {int(i): k for k, i in enumerate(ids_of(row, ids))}  # slots of a page listed twice: last wins
        missing = [int(i) for i in valid if int(i) not in lookup]
        if missing:
            problems.append(f"row {b}: ids not in the row (or on an invalid page): {missing[:5]}")
            continue
        chosen = np.array([lookup[int(i)] for i in valid])
        scores = row.scores
        finite = scores[np.isfinite(scores)]
        tol = tolerance * (np.abs(finite).max() if finite.size else 0.0) + magnitude_tolerance * row.magnitude
        order = rank_order(row)
        kth = scores[order[expected_count - 1]]
        chosen_scores = scores[chosen]
        n_numbers = int(np.sum(~np.isnan(scores)))
        if np.sum(~np.isnan(chosen_scores)) < min(expected_count, n_numbers):
            problems.append(f"row {b}: NaN chosen while numbers were left out")
            continue
        if not np.isnan(kth):
            worst = np.nanmin(chosen_scores)
            if worst < kth - tol:
                problems.append(f"row {b}: chosen score {worst:.6g} is below the K-th score {kth:.6g} "
                                f"by more than the tolerance {tol:.3g}")
                continue
        if sorted:
            s = np.where(np.isnan(chosen_scores), -np.inf, chosen_scores)
            # two equal infinities (NaN scores ranked as -inf, or +inf ties) differ by NaN, which is
            # no rise: numpy's "invalid value" warning would only report what the comparison means
            with np.errstate(invalid="ignore"):
                rises = np.diff(s) > tol
            if np.any(rises):
                problems.append(f"row {b}: sorted=True output is not in descending score order")
        else:
            if np.any(np.diff(row.positions[chosen]) <= 0):
                problems.append(f"row {b}: output is not in ascending token position order")
    return problems
