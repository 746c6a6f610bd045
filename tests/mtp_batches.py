"""Batches of several query tokens per row (MTP) and of 32 index heads (docs/contract.md §7), for the
caller tests: every framework caller must give these shapes back, agree byte for byte, and equal
``ffi_dsa.reference`` on exact data.

* ``FORMS``: the argument forms a caller must take (N, H, seq_lens ``[B]`` or ``[B, N]``), as
  pytest params; ``mtp_batch(form, ...)`` builds one, exact (small integers, unit scales) by default.
* ``call_result_mtp`` / ``assert_exact_mtp``: the DPS call into a poisoned buffer of the output's
  shape, and byte equality with the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

import ffi_dsa
from ffi_dsa.contract import HEAD_DIM, MAX_QUERIES, NUM_HEADS, NUM_HEADS_NARROW, PAGE_FP8_BYTES, PAGE_TOKENS
from ffi_dsa.workloads import Batch, make_batch

from conftest import assert_all_written, fp8_bytes, page_bytes, poisoned, poisoned_np


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
    """A batch of `form` over rows of length `lens`; exact scores (see ``make_exact_mtp_batch``)
    unless ``exact=False`` (random FP8 data and scales, for tolerance checks)."""
    seq_lens = query_lens(lens, form.queries, seed) if form.per_query_lens else np.asarray(lens, np.int32)
    if exact:
        return make_exact_mtp_batch(seq_lens, seed=seed, queries=form.queries, heads=form.heads,
                                    spare_pages=spare_pages)
    return make_batch(seq_lens, seed=seed, spare_pages=spare_pages, queries=form.queries, heads=form.heads)


def make_exact_mtp_batch(seq_lens, *, seed: int, queries: int | None, heads: int, spare_pages: int = 0,
                         values=(-2, -1, 0, 1, 2), w_values=(-2, -1, 1, 2)) -> Batch:
    """conftest.make_exact_batch for any N and H: small integers in q, k and the weights, unit
    scales, so every score is an integer float32 holds exactly (|score| <= 64 * 2 * 128 * 4 < 2**24)
    whatever the order of addition, and ties are decided by the tie rule alone."""
    batch = make_batch(seq_lens, seed=seed, spare_pages=spare_pages, scale_range=None, queries=queries,
                       heads=heads)
    rng = np.random.default_rng(seed + 1_000_003)
    batch.q[...] = fp8_bytes(rng.choice(np.asarray(values, np.float32), size=batch.q.shape))
    batch.weights[...] = rng.choice(np.asarray(w_values, np.float32), size=batch.weights.shape)
    num_pages = batch.k_cache.shape[0]
    k = rng.choice(np.asarray(values, np.float32), size=(num_pages, PAGE_TOKENS, HEAD_DIM))
    pages = page_bytes(batch)
    pages[:, :PAGE_FP8_BYTES] = fp8_bytes(k).reshape(num_pages, -1)
    pages[:, PAGE_FP8_BYTES:] = np.ones((num_pages, PAGE_TOKENS), dtype="<f4").view(np.uint8)
    return batch


def query_rows_shape(batch: Batch, topk: int) -> tuple[int, int]:
    """The output's other accepted form, [B * N, K] (one row per query row)."""
    shape = batch.output_shape(topk)
    return (int(np.prod(shape[:-1])), topk)


def call_result_mtp(batch: Batch, topk: int, *, sorted: bool = False, device: str = "cpu",
                    shape=None) -> np.ndarray:
    """``ffi_dsa.call`` into a poisoned buffer of `shape` (default: ``batch.output_shape``), numpy
    on the CPU and torch on CUDA; checks every element was written; returns host int32."""
    shape = batch.output_shape(topk) if shape is None else shape
    if device == "cpu":
        out = poisoned_np(shape)
        ffi_dsa.call(*batch.args(), out, sorted=sorted)
    else:
        out = poisoned(shape, device)
        ffi_dsa.call(*batch.to_torch(device), out, sorted=sorted)
        out = out.cpu().numpy()
    assert_all_written(out)
    return out


def assert_exact_mtp(got, batch: Batch, topk: int, *, sorted: bool = False, name: str = "") -> None:
    """`got` has the output shape of `batch`'s q and equals ``ffi_dsa.reference`` byte for byte."""
    got = got.cpu().numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    want = ffi_dsa.reference(*batch.args(), topk=topk, sorted=sorted)
    assert got.dtype == np.int32, f"{name}: dtype {got.dtype}"
    assert got.shape == batch.output_shape(topk), f"{name}: shape {got.shape}, expected {batch.output_shape(topk)}"
    flat_got, flat_want = got.reshape(-1, topk), want.reshape(-1, topk)
    rows = np.nonzero((flat_got != flat_want).any(axis=1))[0]
    if rows.size:
        r = int(rows[0])
        raise AssertionError(f"{name}: query rows {rows.tolist()[:8]} differ from the reference; query row {r}: "
                             f"got {flat_got[r, :8].tolist()}, expected {flat_want[r, :8].tolist()}")
