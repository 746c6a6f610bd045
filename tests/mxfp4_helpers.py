"""Builders for the MXFP4 op's tests (docs/contract.md §9), as conftest.py's are for FP8 pages:
exact-score batches, editing one token's codes or scale bytes through the page layout, and the DPS
call into a poisoned output."""

from __future__ import annotations

import numpy as np

import ffi_dsa
from ffi_dsa.contract import (HEAD_DIM, MXFP4_BLOCKS, MXFP4_HEAD_BYTES, MXFP4_PAGE_BYTES, MXFP4_PAGE_VALUE_BYTES,
                              NUM_HEADS, PAGE_TOKENS, UE8M0_BIAS)
from ffi_dsa.mxfp4_cache import pack_nibbles, pages_of
from ffi_dsa.mxfp4_workloads import Mxfp4Batch, make_mxfp4_batch

from conftest import SENTINEL, assert_all_written, assert_rows_equal

# E2M1 codes by value (sign bit 3): the small values exact data draws from
CODE = {0.0: 0, 0.5: 1, 1.0: 2, 1.5: 3, 2.0: 4, 3.0: 5, 4.0: 6, 6.0: 7, -0.5: 9, -1.0: 10, -2.0: 12, -6.0: 15}
NEG_ZERO = 8


def codes_of(values) -> np.ndarray:
    return np.vectorize(CODE.__getitem__, otypes=[np.uint8])(np.asarray(values, dtype=np.float64))


def make_exact_mxfp4_batch(seq_lens, *, seed: int, q_values=(-1.0, 0.0, 0.5, 1.0, 2.0),
                           k_values=(-1.0, 0.0, 0.0, 1.0, 2.0), w_values=(-2.0, -1.0, 1.0, 2.0),
                           scale_offsets=(-1, 0, 1), active_dims: int = HEAD_DIM, spare_pages: int = 0,
                           max_pages: int | None = None, queries: int | None = None,
                           heads: int = NUM_HEADS) -> Mxfp4Batch:
    """A batch whose scores are exact in float32 in any order of addition: |values| <= 2 with
    scale bytes 127 + `scale_offsets` (a block's two scales multiply by 2^-2 .. 2^2), so a logit is
    a multiple of 2^-4 below 2^11 and a score (64 heads, |w| <= 2) one below 2^18: under 2^24 units.
    Only the first `active_dims` values of q and k are non-zero (ties and relu's 0.0 plateaus)."""
    batch = make_mxfp4_batch(seq_lens, seed=seed, spare_pages=spare_pages, max_pages=max_pages, queries=queries,
                             heads=heads)
    rng = np.random.default_rng(seed + 1_000_003)
    q = rng.choice(np.asarray(q_values), size=(*batch.q.shape[:-1], HEAD_DIM))
    q[..., active_dims:] = 0.0
    batch.q[...] = pack_nibbles(codes_of(q))
    offsets = np.asarray(scale_offsets, np.int64) + UE8M0_BIAS
    q_bytes = rng.choice(offsets, size=(*batch.q_scale.shape, MXFP4_BLOCKS)).astype(np.uint8)
    batch.q_scale[...] = np.ascontiguousarray(q_bytes).view("<i4")[..., 0]
    batch.weights[...] = rng.choice(np.asarray(w_values, np.float32), size=batch.weights.shape)
    num_pages = batch.k_cache.shape[0]
    k = rng.choice(np.asarray(k_values), size=(num_pages, PAGE_TOKENS, HEAD_DIM))
    k[..., active_dims:] = 0.0
    k_bytes = rng.choice(offsets, size=(num_pages, PAGE_TOKENS, MXFP4_BLOCKS)).astype(np.uint8)
    batch.k_cache[...] = pages_of(codes_of(k), k_bytes)
    return batch


def page_bytes(batch: Mxfp4Batch) -> np.ndarray:
    """A writable ``[num_pages, 4352]`` uint8 view of the batch's cache."""
    view = batch.k_cache.view(np.uint8).reshape(-1, MXFP4_PAGE_BYTES)
    assert np.shares_memory(view, batch.k_cache)
    return view


def page_slot(batch: Mxfp4Batch, b: int, t: int) -> tuple[int, int]:
    return int(batch.block_table[b, t // PAGE_TOKENS]), t % PAGE_TOKENS


def token_id(batch: Mxfp4Batch, b: int, t: int) -> int:
    page, slot = page_slot(batch, b, t)
    return page * PAGE_TOKENS + slot


def set_token(batch: Mxfp4Batch, b: int, t: int, values=None, scale_bytes=None) -> int:
    """Overwrite token `t` of row `b`: its 128 values (E2M1-exact numbers) and/or its 4 scale bytes;
    returns its global id."""
    page, slot = page_slot(batch, b, t)
    pages = page_bytes(batch)
    if values is not None:
        row = pack_nibbles(codes_of(np.broadcast_to(np.asarray(values, np.float64), (HEAD_DIM,))))
        pages[page, slot * MXFP4_HEAD_BYTES:(slot + 1) * MXFP4_HEAD_BYTES] = row
    if scale_bytes is not None:
        off = MXFP4_PAGE_VALUE_BYTES + MXFP4_BLOCKS * slot
        pages[page, off:off + MXFP4_BLOCKS] = np.broadcast_to(np.asarray(scale_bytes, np.uint8), (MXFP4_BLOCKS,))
    return page * PAGE_TOKENS + slot


def set_q_scale(batch: Mxfp4Batch, query_row: int, head: int, scale_bytes) -> None:
    """The 4 scale bytes of one head of one query row (query j of row b is query row b * N + j)."""
    flat = batch.q_scale.reshape(-1, batch.q_scale.shape[-1])
    flat[query_row, head] = np.asarray(scale_bytes, np.uint8).view("<i4")[0]


def run_mxfp4(batch: Mxfp4Batch, topk: int, *, shape=None, **options) -> np.ndarray:
    """ffi_dsa.mxfp4_call on the batch's numpy inputs into a poisoned output (default shape: q's),
    checked to be fully written."""
    out = np.full(batch.output_shape(topk) if shape is None else shape, SENTINEL, np.int32)
    ffi_dsa.mxfp4_call(*batch.args(), out, **options)
    assert_all_written(out)
    return out


def assert_exact_mxfp4(out, batch: Mxfp4Batch, topk: int, *, sorted=False, ids="slots", name="") -> None:
    """Byte-exact agreement with the float64 reference's choice (exact-score data only)."""
    expected = ffi_dsa.reference_mxfp4(*batch.args(), topk=topk, sorted=sorted, ids=ids)
    out = out.cpu().numpy() if hasattr(out, "cpu") else np.asarray(out)
    assert out.dtype == np.int32 and out.shape == expected.shape, f"{name}: {out.dtype} {out.shape}"
    assert_rows_equal(out, expected, f"{name}: vs the MXFP4 reference")


def assert_valid_mxfp4(out, batch: Mxfp4Batch, *, sorted=False, ids="slots") -> None:
    problems = ffi_dsa.check_mxfp4_topk(out, *batch.args(), sorted=sorted, ids=ids)
    assert problems == [], "\n".join(problems[:10])


def mxfp4_scores(batch: Mxfp4Batch, query_row: int) -> np.ndarray:
    """float64 reference scores of one query row's candidates, by position."""
    return ffi_dsa.reference_mxfp4_scores(*batch.args())[query_row].scores
