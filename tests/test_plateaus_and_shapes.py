"""relu's 0.0 plateaus, the K and B values where kernels change shape, and wide block tables with
garbage past every row's length (docs/contract.md §2-§4), on every device."""

from __future__ import annotations

import numpy as np
import pytest

import ffi_dsa
from ffi_dsa.workloads import MODEL_TABLE_PAGES, make_batch

from conftest import assert_exact, assert_valid_topk, fill_past_rows, make_exact_batch, run_dps


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
def test_relu_plateau_most_tokens_score_exactly_zero(device, sorted_):
    """Most logits are negative, so relu leaves most tokens of a row at exactly 0.0 and the K-th best
    is a zero: the zeros at the smallest positions take the places left (byte for byte), in both
    orders. One row has fewer positive tokens than K, one more, one none."""
    lens = [6000, 3000, 2500, 40000]
    batch = make_exact_batch(lens, seed=301, q_values=(1,), k_values=(-1, -1, -1, 0, 1), w_values=(1,),
                             active_dims=2)
    rows = ffi_dsa.reference_scores(*batch.args())
    batch.weights[2, :] = 0.0  # every score of row 2 is 0.0
    for b in (0, 1, 3):
        zero = np.mean(rows[b].scores == 0.0)
        assert 0.5 < zero < 0.99, f"row {b}: {zero:.2f} of the scores are 0.0"
    out = run_dps(batch.to_torch(device), sorted=sorted_)
    assert_exact(out, batch, sorted=sorted_)


@pytest.mark.parametrize("topk", [1, 17, 512, 1000, 2047, 2048])
def test_k_values(device, topk):
    """K from the output's width: rows just under, at and over K, a long row, both orders, under the
    tolerance rule and byte for byte on exact data with ties."""
    lens = [topk - 1, topk, topk + 1, 9000, 70]
    batch = make_batch(lens, seed=302 + topk)
    for sorted_ in (False, True):
        assert_valid_topk(run_dps(batch.to_torch(device), topk=topk, sorted=sorted_), batch, sorted=sorted_)
    exact = make_exact_batch(lens, seed=303 + topk, q_values=(0, 1), k_values=(0, 1), w_values=(1,), active_dims=3)
    assert_exact(run_dps(exact.to_torch(device), topk=topk, sorted=True), exact, topk=topk, sorted=True)


@pytest.mark.parametrize("batch_size", [0, 1, 131, 132, 133, 1024])
def test_batch_sizes_around_the_sm_count(device, batch_size):
    """B around an H100's 132 SMs, none and many: rows of 0..2600 tokens (some shorter than K, some
    longer), K = 2048 and K = 17, byte for byte on exact data."""
    lens = np.random.default_rng(304 + batch_size).integers(0, 2600, size=batch_size)
    batch = make_exact_batch(lens, seed=305 + batch_size, q_values=(0, 1), k_values=(0, 1), w_values=(1,),
                             active_dims=3)
    for topk in (2048, 17):
        out = run_dps(batch.to_torch(device), topk=topk)
        assert out.shape == (batch_size, topk)
        assert_exact(out, batch, topk=topk)


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
def test_wide_table_with_garbage_past_each_length(device, sorted_):
    """A block table as wide as a serving engine allocates it (163840 tokens) whose entries past each
    row's length are random page ids, valid or not: only the row's own pages count."""
    lens = [8192, 100, 0, 4097, 30000]
    batch = make_batch(lens, seed=306, max_pages=MODEL_TABLE_PAGES)
    fill_past_rows(batch, seed=307)
    out = run_dps(batch.to_torch(device), sorted=sorted_)
    assert_valid_topk(out, batch, sorted=sorted_)
    narrow = make_batch(lens, seed=306)  # the same pages in a table just wide enough
    narrow_out = run_dps(narrow.to_torch(device), sorted=sorted_)
    assert np.array_equal(out, narrow_out)
