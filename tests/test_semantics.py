"""docs/contract.md §2, what is computed: scores, the top-K selection, the output order, determinism.

Random data is checked with the contract's tolerance rule (§4) (``ffi_dsa.check_topk``); exact-score data
(small integers, unit scales) is checked byte for byte against ``ffi_dsa.reference``.
"""

from __future__ import annotations

import numpy as np
import pytest

from ffi_dsa.workloads import make_batch

from conftest import (
    DEFAULT_K,
    assert_exact,
    assert_valid_topk,
    fp8_bytes,
    make_exact_batch,
    run_dps,
    scores_of_row,
    set_token,
    token_id,
)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_batch_is_a_valid_topk_under_the_spec_tolerance(device, seed):
    """topk_indices[b] holds the ids of the min(K, seq_lens[b]) best tokens then -1 (tolerance rule)."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, 6000, size=4)
    batch = make_batch(lens, seed=seed)
    out = run_dps(batch.to_torch(device))
    assert_valid_topk(out, batch)
    assert ((out != -1).sum(axis=1) == np.minimum(lens, DEFAULT_K)).all()


@pytest.mark.parametrize("seed", [4, 5])
def test_random_batch_small_k(device, seed):
    """K is topk_indices.shape[1]; any K <= 2048 works (here K = 16 and K = 100)."""
    batch = make_batch([3000, 17, 15, 640], seed=seed)
    for k in (16, 100):
        out = run_dps(batch.to_torch(device), topk=k)
        assert_valid_topk(out, batch)


@pytest.mark.parametrize("seed", [6, 7])
def test_default_order_is_ascending_token_position(device, seed):
    """By default the valid prefix is ordered by ascending token position t (not by id, not by score)."""
    batch = make_batch([5000, 2500], seed=seed)
    out = run_dps(batch.to_torch(device))
    assert_valid_topk(out, batch, sorted=False)  # check_topk verifies ascending positions
    # Pages are shuffled, so ascending position is not ascending id: the check above is not vacuous.
    assert not all(np.all(np.diff(row[row >= 0]) > 0) for row in out)


@pytest.mark.parametrize("seed", [8, 9])
def test_sorted_true_orders_by_descending_score_random(device, seed):
    """sorted=True orders the valid prefix by descending score (tolerance rule on random data)."""
    batch = make_batch([4000, 2100, 300], seed=seed)
    out = run_dps(batch.to_torch(device), sorted=True)
    assert_valid_topk(out, batch, sorted=True)
    unsorted = run_dps(batch.to_torch(device), sorted=False)
    # same selection, different order
    for b in range(3):
        assert set(out[b].tolist()) == set(unsorted[b].tolist())
    assert not np.array_equal(out, unsorted)


@pytest.mark.parametrize("seed", [10, 11, 12])
@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
def test_exact_scores_match_reference_exactly(device, seed, sorted_):
    """On exact-score data the answer is unique (ties by position) and equals the reference byte for byte."""
    batch = make_exact_batch([3000, 2048, 700, 2049], seed=seed)
    out = run_dps(batch.to_torch(device), sorted=sorted_)
    assert_exact(out, batch, sorted=sorted_)


def test_exact_scores_sorted_is_descending_score_then_ascending_position(device):
    """sorted=True: descending score, ties by ascending position t (as torch.topk would present them)."""
    batch = make_exact_batch([1500], seed=13, q_values=(0, 1), k_values=(0, 1), w_values=(1,), active_dims=3)
    out = run_dps(batch.to_torch(device), topk=300, sorted=True)[0]
    scores = scores_of_row(batch, 0)
    id_to_pos = {token_id(batch, 0, t): t for t in range(1500)}
    pos = np.array([id_to_pos[int(i)] for i in out])
    s = scores[pos]
    assert np.all(np.diff(s) <= 0), "scores must not increase"
    ties = np.diff(s) == 0
    assert ties.sum() > 100, "the data must have many ties for this test to mean anything"
    assert np.all(np.diff(pos)[ties] > 0), "within equal scores, positions must ascend"
    assert_exact(out[None], batch, topk=300, sorted=True)


def test_score_formula_scale_before_relu_with_negative_scales(device):
    """score = sum_h w[h] * relu(sum_d q[h, d] * fp8[t, d] * scale[t]): a negative scale flips the
    logits before the relu (it cannot be factored out of the relu)."""
    batch = make_exact_batch([256], seed=14)
    # Negative scales on every other token: the reference applies them before the relu.
    for t in range(0, 256, 2):
        set_token(batch, 0, t, scale=-1.0)
    out = run_dps(batch.to_torch(device), topk=40, sorted=True)
    assert_exact(out, batch, topk=40, sorted=True)
    # A kernel that multiplied the scale after the relu would rank these tokens very differently:
    neg = scores_of_row(batch, 0)[0::2]
    assert (neg > 0).any() and (neg != 0).any()


@pytest.mark.parametrize("seed", [15, 16])
def test_repeated_calls_give_identical_bytes(device, seed):
    """Determinism: the same inputs give the same bytes on every run (data with many ties)."""
    batch = make_exact_batch([9000, 3000], seed=seed, q_values=(0, 1), k_values=(0, 1), w_values=(1,),
                             active_dims=4)
    random_batch = make_batch([9000, 3000], seed=seed)
    for b in (batch, random_batch):
        args = b.to_torch(device)
        first = run_dps(args)
        for _ in range(4):
            assert np.array_equal(run_dps(args), first)
        first_sorted = run_dps(args, sorted=True)
        assert np.array_equal(run_dps(args, sorted=True), first_sorted)


def test_cpu_result_does_not_depend_on_thread_count(monkeypatch):
    """Determinism "whatever the launch order": the CPU path gives the same bytes on 1 or many threads."""
    batch = make_exact_batch([20000, 12000], seed=17, q_values=(0, 1), k_values=(0, 1), w_values=(1,),
                             active_dims=4)
    rnd = make_batch([20000, 12000], seed=17)
    results = {}
    for threads in ("1", "2", "7"):
        monkeypatch.setenv("FFI_DSA_NUM_THREADS", threads)
        results[threads] = [run_dps(b.to_torch("cpu"), sorted=s) for b in (batch, rnd) for s in (False, True)]
    for threads in ("2", "7"):
        for a, b in zip(results["1"], results[threads]):
            assert np.array_equal(a, b)
    assert_exact(results["1"][0], batch)


def test_rows_sharing_pages_are_scored_independently(device):
    """block_table is per row: two rows may list the same pages (shared prefix); each row uses its own
    q, weights and length."""
    batch = make_exact_batch([640, 640, 300], seed=18)
    batch.block_table[1] = batch.block_table[0]
    batch.block_table[2, :5] = batch.block_table[0, :5]
    batch.q[1] = batch.q[0]
    batch.weights[1] = batch.weights[0]
    out = run_dps(batch.to_torch(device), topk=100)
    assert np.array_equal(out[0], out[1])
    assert_exact(out, batch, topk=100)


def test_global_id_is_page_times_64_plus_slot(device):
    """A token's global id is p * 64 + s, p = block_table[b, t // 64], s = t % 64 (not t, not a row offset)."""
    batch = make_exact_batch([200], seed=19, spare_pages=7)
    best_t = 131  # page index 2 of the row, slot 3
    gid = set_token(batch, 0, best_t, key=2.0)  # the only token whose logits reach 256 in every head
    batch.q[0] = fp8_bytes(np.full((64, 128), 1.0))
    batch.weights[0] = 1.0
    out = run_dps(batch.to_torch(device), topk=1)
    page = int(batch.block_table[0, 2])
    assert gid == page * 64 + 3
    assert out.tolist() == [[gid]]
