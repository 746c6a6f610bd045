"""The MXFP4 op's semantics on the CPU (docs/contract.md §9): its scores against the float64
reference, and decode's selection rules on MXFP4 pages (ties, relu's 0.0 plateaus, NaN scale bytes,
lengths, invalid pages, N, H, K, ids, max_seq_len, both orders), for every CPU scoring variant.
Exact-score data is checked byte for byte against ``ffi_dsa.reference_mxfp4``; random data with
``ffi_dsa.check_mxfp4_topk``'s tolerance. Outputs are poisoned and must be fully written."""

from __future__ import annotations

import numpy as np
import pytest

import ffi_dsa
from ffi_dsa.contract import (MAX_QUERIES, MXFP4_BLOCK, MXFP4_PAGE_VALUE_BYTES, NUM_HEADS, NUM_HEADS_NARROW,
                              PAGE_TOKENS, UE8M0_NAN)
from ffi_dsa.mxfp4_cache import pack_nibbles
from ffi_dsa.mxfp4_workloads import make_mxfp4_batch

from conftest import tie_rule_winners
from mxfp4_helpers import (assert_exact_mxfp4, assert_valid_mxfp4, codes_of, make_exact_mxfp4_batch, mxfp4_scores,
                           page_bytes, run_mxfp4, set_q_scale, set_token, token_id)

KERNELS = ffi_dsa.cpu_kernels()
EDGE_LENS = [0, 1, 2047, 2048, 2049]


@pytest.fixture(params=KERNELS)
def kernel(request):
    previous = ffi_dsa.set_cpu_kernel(request.param)
    yield request.param
    ffi_dsa.set_cpu_kernel(previous)


@pytest.mark.parametrize("heads", [NUM_HEADS, NUM_HEADS_NARROW])
@pytest.mark.parametrize("topk", [512, 1024, 2048])
def test_random_data_meets_the_tolerance(kernel, heads, topk):
    batch = make_mxfp4_batch([*EDGE_LENS, 3100], seed=topk + heads, heads=heads)
    for sorted_ in (False, True):
        assert_valid_mxfp4(run_mxfp4(batch, topk, sorted=sorted_), batch, sorted=sorted_)


@pytest.mark.parametrize("queries", range(1, MAX_QUERIES + 1))
@pytest.mark.parametrize("per_query_lens", [False, True], ids=["lens_B", "lens_BN"])
def test_n_queries_per_row(kernel, queries, per_query_lens):
    """Each query of a row is the single-query op over its own prefix (docs/contract.md §7)."""
    rows = np.array([0, 1, 700, 2049], np.int32)
    lens = np.stack([np.maximum(rows - 3 * j, 0) for j in range(queries)], axis=1) if per_query_lens else rows
    batch = make_exact_mxfp4_batch(lens, seed=queries, queries=queries, active_dims=8)
    out = run_mxfp4(batch, 512)
    assert out.shape == (4, queries, 512)
    assert_exact_mxfp4(out, batch, 512)
    flat = run_mxfp4(batch, 512, shape=(4 * queries, 512), sorted=True)  # the [B * N, K] form
    assert_exact_mxfp4(flat.reshape(out.shape), batch, 512, sorted=True)


@pytest.mark.parametrize("heads", [NUM_HEADS, NUM_HEADS_NARROW])
@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
def test_exact_data_equals_the_reference(kernel, heads, sorted_):
    """Small values and scales: every score is exact, so the tie rule is checked byte for byte."""
    batch = make_exact_mxfp4_batch([*EDGE_LENS, 4000], seed=7 + heads, heads=heads, active_dims=4)
    for topk in (512, 2048):
        for ids in ("slots", "positions"):
            assert_exact_mxfp4(run_mxfp4(batch, topk, sorted=sorted_, ids=ids), batch, topk, sorted=sorted_, ids=ids)


def test_ties_at_the_cut_smaller_position_wins(kernel):
    """q, k in {0, 1} on 2 values, unit weights and scales: thousands of equal scores at the cut."""
    batch = make_exact_mxfp4_batch([4000, 2500], seed=3, q_values=(0.0, 1.0), k_values=(0.0, 1.0),
                                   w_values=(1.0,), scale_offsets=(0,), active_dims=2)
    k = 1024
    out = run_mxfp4(batch, k)
    for b in range(2):
        expected = tie_rule_winners(mxfp4_scores(batch, b), k)
        assert out[b].tolist() == [token_id(batch, b, int(t)) for t in expected]


def test_a_zero_plateau_keeps_the_first_positions(kernel):
    """Every logit <= 0 (q >= 0, k <= 0): relu makes every score exactly 0, and the K smallest
    positions win, in order (-0 values included)."""
    batch = make_exact_mxfp4_batch([3000], seed=4, q_values=(0.0, 1.0, 2.0), k_values=(-0.0, -1.0, -2.0))
    out = run_mxfp4(batch, 512, sorted=True)
    assert (mxfp4_scores(batch, 0) == 0).all()
    assert out[0].tolist() == [token_id(batch, 0, t) for t in range(512)]


def test_block_sums_are_exact(kernel):
    """Block 0 sums to 0.25, block 1 to 36 - 36 at a scale of 2^20: added in one chain (block 0
    first) the 0.25 would be lost to rounding next to 36 * 2^20, so the token would score 0; with
    each block summed exactly it scores 0.25 * w and is the only positive token."""
    batch = make_exact_mxfp4_batch([300], seed=5, q_values=(0.0,), k_values=(0.0,), w_values=(1.0,),
                                   scale_offsets=(0,))
    q = np.zeros(128)
    q[0], q[MXFP4_BLOCK], q[MXFP4_BLOCK + 1] = 0.5, 6.0, 6.0
    batch.q[0] = pack_nibbles(codes_of(q))  # every head
    for h in range(NUM_HEADS):
        set_q_scale(batch, 0, h, [127, 127 + 20, 127, 127])
    k = np.zeros(128)
    k[0], k[MXFP4_BLOCK], k[MXFP4_BLOCK + 1] = 0.5, 6.0, -6.0
    winner = set_token(batch, 0, 217, values=k, scale_bytes=127)
    scores = mxfp4_scores(batch, 0)
    assert scores[217] == 0.25 * NUM_HEADS and np.count_nonzero(scores) == 1
    out = run_mxfp4(batch, 1, sorted=True)
    assert out[0, 0] == winner


@pytest.mark.parametrize("block", range(4))
def test_a_nan_scale_byte_makes_the_score_nan(kernel, block):
    """UE8M0 byte 255 is NaN: a token with one in any block scores NaN (whatever its values, zeros
    too), ranks below every number and among NaN scores the smaller position wins."""
    batch = make_exact_mxfp4_batch([600], seed=6, active_dims=4)
    scale = [127, 127, 127, 127]
    scale[block] = UE8M0_NAN
    nan_positions = [0, 5, 63, 64, 400]
    for t in nan_positions:
        set_token(batch, 0, t, values=0.0 if t == 5 else None, scale_bytes=scale)
    scores = mxfp4_scores(batch, 0)
    assert np.isnan(scores[nan_positions]).all() and np.isfinite(np.delete(scores, nan_positions)).all()
    out = run_mxfp4(batch, 598, sorted=True)  # all 595 numbers, then the 3 first NaN tokens
    assert out[0, -3:].tolist() == [token_id(batch, 0, t) for t in nan_positions[:3]]
    for topk, sorted_ in ((598, False), (512, True), (600, True)):
        assert_exact_mxfp4(run_mxfp4(batch, topk, sorted=sorted_), batch, topk, sorted=sorted_)


def test_a_nan_query_scale_byte_makes_every_score_nan(kernel):
    batch = make_exact_mxfp4_batch([700, 700], seed=8)
    set_q_scale(batch, 1, 17, [127, UE8M0_NAN, 127, 127])
    assert np.isnan(mxfp4_scores(batch, 1)).all() and np.isfinite(mxfp4_scores(batch, 0)).all()
    out = run_mxfp4(batch, 512)
    assert out[1].tolist() == [token_id(batch, 1, t) for t in range(512)]  # NaN ties: by position
    assert_exact_mxfp4(out, batch, 512)


def test_extreme_scale_bytes_whose_sum_is_moderate(kernel):
    """Query bytes 250, 254, 200, 127 against token bytes 4, 0, 54, 127 (0 is 2^-127, a float32
    subnormal): each block's two scales multiply to exactly 1, so the bytes are those of unit
    scales, although the block sum times either scale alone would overflow or lose bits."""
    unit = make_exact_mxfp4_batch([900, 300], seed=9, scale_offsets=(0,), active_dims=6, queries=2)
    extreme = make_exact_mxfp4_batch([900, 300], seed=9, scale_offsets=(0,), active_dims=6, queries=2)
    extreme.q_scale[...] = np.array([250, 254, 200, 127], np.uint8).view("<i4")[0]
    pages = page_bytes(extreme)
    pages[:, MXFP4_PAGE_VALUE_BYTES:] = np.tile(np.array([4, 0, 54, 127], np.uint8), PAGE_TOKENS)
    expected = run_mxfp4(unit, 512, sorted=True)
    np.testing.assert_array_equal(run_mxfp4(extreme, 512, sorted=True), expected)
    assert_exact_mxfp4(expected, extreme, 512, sorted=True)


@pytest.mark.parametrize("n", EDGE_LENS)
def test_lengths_and_the_minus_one_tail(kernel, n):
    batch = make_exact_mxfp4_batch([n, n], seed=n, active_dims=4)
    out = run_mxfp4(batch, 2048)
    assert (out[:, min(n, 2048):] == -1).all() and (out[:, :min(n, 2048)] >= 0).all()
    assert_exact_mxfp4(out, batch, 2048)


def test_device_only_values_are_masked(kernel):
    """Invalid page ids inside a row are no candidates, a negative length counts as 0, a length past
    the table is cut to it; validate=True raises instead, naming the entry, and writes nothing."""
    batch = make_exact_mxfp4_batch([700, 300, 200], seed=10, active_dims=4, spare_pages=2)
    batch.block_table[0, 3] = -1
    batch.block_table[0, 7] = batch.k_cache.shape[0]
    batch.seq_lens[1] = -4
    batch.seq_lens[2] = batch.block_table.shape[1] * PAGE_TOKENS + 50
    batch.block_table[2, 4:] = np.arange(4, batch.block_table.shape[1]) % batch.k_cache.shape[0]
    out = run_mxfp4(batch, 512)
    assert (out[1] == -1).all()
    assert_exact_mxfp4(out, batch, 512)
    poisoned = np.full(out.shape, 12345, np.int32)
    with pytest.raises(ValueError, match=r"seq_lens\[1\] = -4 is negative"):
        ffi_dsa.mxfp4_call(*batch.args(), poisoned, validate=True)
    batch.seq_lens[1:] = [300, 200]
    with pytest.raises(ValueError, match=r"block_table\[0, 3\] = -1 is not a page id"):
        ffi_dsa.mxfp4_topk_indexer(*batch.args(), topk=512, validate=True)
    with pytest.raises(ValueError, match=r"block_table\[0, 3\] = -1 is not a page id"):
        ffi_dsa.mxfp4_call(*batch.args(), poisoned, validate=True)
    assert (poisoned == 12345).all()


def test_ids_and_max_seq_len(kernel):
    """ids="positions" names the same selection by position; max_seq_len never changes the bytes."""
    batch = make_exact_mxfp4_batch([1500, 90], seed=11, active_dims=4)
    slots = run_mxfp4(batch, 512)
    positions = run_mxfp4(batch, 512, ids="positions")
    for b in range(2):
        chosen = positions[b][positions[b] >= 0]
        assert slots[b][: len(chosen)].tolist() == [token_id(batch, b, int(t)) for t in chosen]
    for bound in (None, 0, 1, 1500, 10**9):
        np.testing.assert_array_equal(run_mxfp4(batch, 512, max_seq_len=bound), slots)


def test_repeated_calls_give_the_same_bytes():
    batch = make_mxfp4_batch([5000, 3000, 10], seed=12, queries=2)
    first = run_mxfp4(batch, 1024)
    for _ in range(3):
        np.testing.assert_array_equal(run_mxfp4(batch, 1024), first)


def test_every_variant_gives_the_reference_bytes_on_exact_data():
    batch = make_exact_mxfp4_batch([3000, 2049, 64], seed=13, queries=3, heads=NUM_HEADS_NARROW, active_dims=6)
    expected = ffi_dsa.reference_mxfp4(*batch.args(), topk=1024)
    previous = ffi_dsa.set_cpu_kernel(KERNELS[0])
    try:
        for name in KERNELS:
            ffi_dsa.set_cpu_kernel(name)
            np.testing.assert_array_equal(run_mxfp4(batch, 1024), expected, err_msg=name)
    finally:
        ffi_dsa.set_cpu_kernel(previous)
