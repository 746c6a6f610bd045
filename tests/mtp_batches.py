"""Batches of several query tokens per row (MTP) and of 32 index heads (docs/contract.md §7), for the
caller tests: every framework caller must give these shapes back, agree byte for byte, and equal
``ffi_dsa.reference`` on exact data.

* ``FORMS``: the argument forms a caller must take (N, H, seq_lens ``[B]`` or ``[B, N]``), as
  pytest params; ``mtp_batch(form, ...)`` builds one, exact (small integers, unit scales) by default.
(The DPS call into a poisoned buffer and byte equality with the reference are conftest's
``call_result`` and ``assert_exact``, which take every output shape.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from ffi_dsa.contract import MAX_QUERIES, NUM_HEADS, NUM_HEADS_NARROW
from ffi_dsa.workloads import Batch, make_batch

from conftest import make_exact_batch


@dataclass(frozen=True)
class Form:
    """How a batch's arguments are shaped: N (None: the rank-3 q of one query per row), H, and
    whether seq_lens holds one length per query ([B, N]) or per row ([B], causal offsets)."""

    queries: int | None
    heads: int
    per_query_lens: bool = False

    @property
    def id(self) -> str:
        n = "rank3" if self.queries is None else f"n{self.queries}"
        return f"{n}_h{self.heads}_lens{'BN' if self.per_query_lens else 'B'}"


FORMS = [pytest.param(f, id=f.id) for f in (
    Form(2, NUM_HEADS),
    Form(2, NUM_HEADS, per_query_lens=True),
    Form(MAX_QUERIES, NUM_HEADS),
    Form(MAX_QUERIES, NUM_HEADS_NARROW, per_query_lens=True),
    Form(2, NUM_HEADS_NARROW),
    Form(1, NUM_HEADS),                 # rank-4 q with N = 1: the rank-3 bytes, [B, 1, K] out
    Form(None, NUM_HEADS_NARROW),       # rank-3 q, 32 heads
)]

# Row lengths with short rows (fewer tokens than K, and fewer than N: some queries see nothing),
# an empty row, and rows over several pages; B differs from every N and from the page counts.
LENS = [150, 3, 0, 300, 64]


def query_lens(row_lens, queries: int, seed: int) -> np.ndarray:
    """seq_lens [B, N]: per-query lengths that are not the causal ones (they rise and fall, and
    reach 0 and the row's length), so a caller that dropped the form would be caught."""
    row_lens = np.asarray(row_lens, np.int64)
    lens = np.random.default_rng(seed).integers(0, row_lens[:, None] + 1, size=(len(row_lens), queries))
    lens[:, -1] = row_lens  # the last query uses every page of the row
    return lens.astype(np.int32)


def mtp_batch(form: Form, lens=LENS, *, seed: int, exact: bool = True, spare_pages: int = 3) -> Batch:
    """A batch of `form` over rows of length `lens`; exact scores (conftest's ``make_exact_batch``)
    unless ``exact=False`` (random FP8 data and scales, for tolerance checks)."""
    seq_lens = query_lens(lens, form.queries, seed) if form.per_query_lens else np.asarray(lens, np.int32)
    if exact:
        return make_exact_batch(seq_lens, seed=seed, queries=form.queries, heads=form.heads, spare_pages=spare_pages)
    return make_batch(seq_lens, seed=seed, spare_pages=spare_pages, queries=form.queries, heads=form.heads)


def query_rows_shape(batch: Batch, topk: int) -> tuple[int, int]:
    """The output's other accepted form, [B * N, K] (one row per query row)."""
    shape = batch.output_shape(topk)
    return (int(np.prod(shape[:-1])), topk)


def query_alone(batch: Batch, j: int) -> Batch:
    """Query j of every row as a single-query batch (rank-3 q) with the length the contract gives it,
    unclamped: the single-query operator clamps it by its own rules."""
    n = batch.q.shape[1]
    lens = batch.seq_lens[:, j] if batch.seq_lens.ndim == 2 else batch.seq_lens.astype(np.int64) - (n - 1 - j)
    weights = batch.weights.reshape(batch.q.shape[0], n, -1)[:, j]
    return Batch(np.ascontiguousarray(batch.q[:, j]), batch.k_cache, np.ascontiguousarray(weights),
                 np.ascontiguousarray(lens, dtype=np.int32), batch.block_table)
