"""docs/contract.md §2, ties and special values, on exact-score data (checked exactly against ``ffi_dsa.reference``).

* "Ties: among equal scores, the token with the smaller position t wins."
* "NaN in a key, scale, query or weight makes the score NaN. NaN scores rank below every number
  (never chosen over a real score; among themselves the smaller position wins); +inf ranks highest."
* -0.0 and +0.0 are equal scores, so they tie (position decides).
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import (
    FP8,
    FP8_NAN_BYTES,
    HEAD_DIM,
    assert_exact,
    fp8_bytes,
    make_exact_batch,
    page_bytes,
    page_slot,
    row_ids,
    run_dps,
    scores_of_row,
    set_token,
    tie_rule_winners,
    token_id,
)

# ----------------------------------------------------------------------------------------------
# Ties
# ----------------------------------------------------------------------------------------------

def _tie_heavy_batch(lens, seed):
    """Scores are small integers (q, k in {0, 1} on 2 dims, unit weights): thousands of ties."""
    return make_exact_batch(lens, seed=seed, q_values=(0, 1), k_values=(0, 1), w_values=(1,), active_dims=2)


@pytest.mark.parametrize("seed", [21, 22, 23])
@pytest.mark.parametrize("k,lens", [(2048, [4000, 2500]), (16, [200, 17])], ids=["K2048", "K16"])
def test_ties_at_the_cut_smaller_position_wins(device, seed, k, lens):
    """Many exactly equal scores straddle the K-th place: the smaller positions win."""
    batch = _tie_heavy_batch(lens, seed)
    out = run_dps(batch.to_torch(device), topk=k)

    for b, n in enumerate(lens):
        assert out[b].tolist() == row_ids(batch, b, tie_rule_winners(scores_of_row(batch, b), k))
    assert_exact(out, batch, topk=k)


def _few_values_batch(rows, seed):
    """Rows whose scores take a few exact values: score = 64 * v for the token's v (q = 1 and k = v
    on dim 0 only, unit weights and scales). `rows` lists, per row, (v, count) runs; the tokens of a
    row are shuffled so that positions interleave the values."""
    lens = [sum(count for _, count in runs) for runs in rows]
    batch = make_exact_batch(lens, seed=seed, q_values=(1,), k_values=(0,), w_values=(1,), active_dims=1)
    rng = np.random.default_rng(seed)
    pages = page_bytes(batch)
    for b, runs in enumerate(rows):
        values = rng.permutation(np.concatenate([np.full(count, v, np.float32) for v, count in runs]))
        for t, v in enumerate(values):
            page, slot = page_slot(batch, b, t)
            pages[page, slot * HEAD_DIM] = fp8_bytes([v])[0]
    return batch


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
def test_cut_on_a_value_boundary_takes_exactly_k(device, sorted_):
    """The K-th best is the last token of a large group of equal scores and the next score down is
    close (here 5 then 3, or 7, 5 then 3): exactly the K better tokens win, never the ones below the
    cut (a radix shortcut on the K-th value's bucket once let every score sharing its high key bits
    win, writing past the row's K outputs). The short last row guards the rows before it."""
    rows = [[(5, 2048), (3, 2048)], [(5, 2048), (3, 1)], [(7, 1000), (5, 1048), (3, 952)], [(5, 3), (3, 7)]]
    batch = _few_values_batch(rows, seed=26)
    out = run_dps(batch.to_torch(device), sorted=sorted_)
    for b in range(3):
        assert (out[b] >= 0).all(), f"row {b}: {int((out[b] < 0).sum())} slots left -1, expected exactly K winners"
    assert_exact(out, batch, sorted=sorted_)


@pytest.mark.parametrize("seed", [24, 25])
def test_ties_in_sorted_mode_keep_ascending_position(device, seed):
    """sorted=True: descending score; equal scores by ascending position, also across the cut."""
    batch = _tie_heavy_batch([3000, 100], seed)
    out = run_dps(batch.to_torch(device), topk=64, sorted=True)
    assert_exact(out, batch, topk=64, sorted=True)


def _set_units(batch, t, units):
    """Token t of row 0 gets a key of `units` ones: its score grows with `units` (0: score 0)."""
    key = np.zeros(128, np.float32)
    key[:units] = 1.0
    set_token(batch, 0, t, key=key)


def _assert_row_top_k(device, batch, k, best_first):
    """Row 0's top K is `best_first` (positions, best score first, equal scores by position): as
    ids in position order, in sorted order, and exactly against the reference."""
    out = run_dps(batch.to_torch(device), topk=k)
    assert out[0].tolist() == row_ids(batch, 0, sorted(best_first))
    out_sorted = run_dps(batch.to_torch(device), topk=k, sorted=True)
    assert out_sorted[0].tolist() == row_ids(batch, 0, best_first)
    assert_exact(out, batch, topk=k)
    assert_exact(out_sorted, batch, topk=k, sorted=True)


def test_constructed_tie_block_straddling_kth_place(device):
    """10 distinct winners, then 190 tokens with one equal score: K = 16 takes the 6 tied tokens with
    the smallest positions (not the smallest ids: pages are shuffled)."""
    n, k = 200, 16
    batch = make_exact_batch([n], seed=26, q_values=(1,), w_values=(1,))
    for t in range(n):
        set_token(batch, 0, t, key=0.0)           # logits 0: score 0 for every token ...
    winners = [190, 5, 77, 64, 131, 9, 150, 33, 100, 199]
    for rank, t in enumerate(winners):            # ... except 10 winners with distinct positive scores
        _set_units(batch, t, rank + 1)
    tied = [t for t in range(n) if t not in winners][: k - len(winners)]
    assert tied == [0, 1, 2, 3, 4, 6]
    _assert_row_top_k(device, batch, k, winners[::-1] + tied)


@pytest.mark.parametrize("copies", [2, 3], ids=["k_takes_every_copy", "k_splits_the_copies"])
def test_kth_score_held_by_several_tokens(device, copies):
    """14 distinct winners, then one score held by `copies` tokens, then lower scores; K = 16 takes
    2 of the copies: with 2 copies every one of them (the CUDA select then takes every key >= the
    K-th as a winner, without ranking ties), with 3 the two with the smallest positions."""
    n, k = 300, 16
    batch = make_exact_batch([n], seed=27, q_values=(1,), w_values=(1,))
    positions = [int(t) for t in np.random.default_rng(27).permutation(n)]
    winners, tied, lower = positions[:14], positions[14:14 + copies], positions[14 + copies:100]
    units = {t: 0 for t in range(n)}
    units.update({t: 3 + rank for rank, t in enumerate(winners)})
    units.update({t: 2 for t in tied})
    units.update({t: 1 for t in lower})
    for t, m in units.items():
        _set_units(batch, t, m)
    _assert_row_top_k(device, batch, k, winners[::-1] + sorted(tied)[: k - len(winners)])


def test_ties_are_broken_by_position_not_by_global_id(device):
    """Two tokens tie for K = 1: the one at the smaller position wins although its id is larger."""
    batch = make_exact_batch([128], seed=27, q_values=(1,), w_values=(1,), spare_pages=6)
    batch.block_table[0, :2] = [7, 2]             # position 10 -> id 7*64+10, position 70 -> id 2*64+6
    for t in range(128):
        set_token(batch, 0, t, key=0.0)
    set_token(batch, 0, 10, key=1.0)
    set_token(batch, 0, 70, key=1.0)
    assert token_id(batch, 0, 10) > token_id(batch, 0, 70)
    for sorted_ in (False, True):
        out = run_dps(batch.to_torch(device), topk=1, sorted=sorted_)
        assert out.tolist() == [[7 * 64 + 10]]


@pytest.mark.parametrize("weight_sign", [1.0, -1.0])
def test_negative_zero_and_positive_zero_tie(device, weight_sign):
    """-0.0 and +0.0 are one score: zero-score tokens are taken by ascending position whatever the sign.

    Zero keys with scale +1 give logits +0.0, with scale -1 give -0.0 (relu keeps -0.0); times a weight
    of either sign the per-head terms are -0.0 or +0.0.
    """
    n, k = 64, 10
    batch = make_exact_batch([n], seed=28, q_values=(1, 2), w_values=(weight_sign,))
    for t in range(n):
        set_token(batch, 0, t, key=0.0, scale=-1.0 if t % 2 else 1.0)
    # a few non-zero tokens: positive scores for +1 weights (they win), negative for -1 weights (they lose)
    for i, t in enumerate([40, 3, 57]):
        key = np.zeros(128, np.float32)
        key[: i + 1] = 1.0
        set_token(batch, 0, t, key=key, scale=1.0)
    zeros = [t for t in range(n) if t not in (40, 3, 57)]
    if weight_sign > 0:
        expected_sorted = [57, 3, 40] + zeros[: k - 3]
    else:
        expected_sorted = zeros[:k]
    out = run_dps(batch.to_torch(device), topk=k, sorted=True)
    assert out[0].tolist() == row_ids(batch, 0, expected_sorted)
    out = run_dps(batch.to_torch(device), topk=k)
    assert out[0].tolist() == row_ids(batch, 0, sorted(expected_sorted))
    assert_exact(out, batch, topk=k)


# ----------------------------------------------------------------------------------------------
# NaN
# ----------------------------------------------------------------------------------------------

NAN_TOKEN_SOURCES = [pytest.param(("key", b), id=f"key_byte_{b:#04x}") for b in FP8_NAN_BYTES] + [
    pytest.param(("scale", None), id="scale")
]


def _make_token_nan(batch, t, source):
    kind, byte = source
    page, slot = int(batch.block_table[0, t // 64]), t % 64
    if kind == "key":
        pages = batch.k_cache.view(np.uint8).reshape(-1, 8448)
        pages[page, slot * 128 + 17] = byte      # one NaN byte in the key
    else:
        set_token(batch, 0, t, scale=float("nan"))


@pytest.mark.parametrize("source", NAN_TOKEN_SOURCES)
def test_nan_token_is_never_chosen_over_a_number(device, source):
    """A NaN key byte (0x7F / 0xFF) or NaN scale makes that token's score NaN; it ranks below every
    number, so the former best tokens drop out of the top K."""
    n, k = 300, 16
    batch = make_exact_batch([n], seed=31)
    best = np.argsort(-scores_of_row(batch, 0), kind="stable")[:5]
    for t in best:
        _make_token_nan(batch, int(t), source)
    assert np.isnan(scores_of_row(batch, 0)[best]).all()
    nan_ids = set(row_ids(batch, 0, best))
    for sorted_ in (False, True):
        out = run_dps(batch.to_torch(device), topk=k, sorted=sorted_)
        assert not nan_ids & set(out[0].tolist())
        assert_exact(out, batch, topk=k, sorted=sorted_)


@pytest.mark.parametrize("source", NAN_TOKEN_SOURCES)
def test_nan_tokens_fill_up_when_fewer_numbers_than_k_smaller_position_first(device, source):
    """With fewer than K numbers, NaN tokens take the remaining places, smaller positions first."""
    n, k = 100, 40
    batch = make_exact_batch([n], seed=32)
    numbers = list(range(0, n, 10))                           # 10 tokens keep a number
    nan_tokens = [t for t in range(n) if t not in numbers]    # 90 NaN tokens
    for t in nan_tokens:
        _make_token_nan(batch, t, source)
    nan_chosen = nan_tokens[: k - len(numbers)]

    out = run_dps(batch.to_torch(device), topk=k)
    assert out[0].tolist() == row_ids(batch, 0, sorted(numbers + nan_chosen))
    out_sorted = run_dps(batch.to_torch(device), topk=k, sorted=True)
    assert out_sorted[0, len(numbers):].tolist() == row_ids(batch, 0, nan_chosen), "NaNs last, by position"
    assert set(out_sorted[0, :len(numbers)].tolist()) == set(row_ids(batch, 0, numbers))
    assert_exact(out_sorted, batch, topk=k, sorted=True)
    assert_exact(out, batch, topk=k)


@pytest.mark.parametrize("where", ["q_byte_0x7f", "q_byte_0xff", "weight"])
def test_nan_in_query_or_weight_makes_the_whole_row_nan(device, where):
    """A NaN query byte or weight makes every score of that row NaN (relu(NaN) is NaN, NaN * 0 is NaN):
    the row then holds its first K positions; the other rows are unaffected."""
    lens, k = [300, 300, 300], 32
    batch = make_exact_batch(lens, seed=33)
    if where == "weight":
        batch.weights[1, 5] = np.nan
    else:
        batch.q[1, 7, 100] = 0x7F if where.endswith("7f") else 0xFF
    assert np.isnan(scores_of_row(batch, 1)).all()
    for sorted_ in (False, True):
        out = run_dps(batch.to_torch(device), topk=k, sorted=sorted_)
        assert out[1].tolist() == row_ids(batch, 1, range(k))
        assert_exact(out, batch, topk=k, sorted=sorted_)


def test_nan_ranks_below_minus_inf(device):
    """NaN ranks below every number, -inf included: with one place too few, the NaN token is dropped."""
    n = 50
    batch = make_exact_batch([n], seed=34, q_values=(1, 2), w_values=(-1, -2))   # all scores <= 0
    minus_inf = [3, 20, 41]
    for t in minus_inf:                         # logits +inf in every head, negative weights: -inf
        set_token(batch, 0, t, key=1.0, scale=float("inf"))
    nan_t = 12
    set_token(batch, 0, nan_t, scale=float("nan"))
    scores = scores_of_row(batch, 0)
    assert np.isneginf(scores[minus_inf]).all() and np.isnan(scores[nan_t])

    out = run_dps(batch.to_torch(device), topk=n - 1)
    assert token_id(batch, 0, nan_t) not in out[0].tolist()
    assert out[0].tolist() == row_ids(batch, 0, [t for t in range(n) if t != nan_t])
    out_sorted = run_dps(batch.to_torch(device), topk=n, sorted=True)
    assert out_sorted[0, -4:].tolist() == row_ids(batch, 0, minus_inf + [nan_t])
    assert_exact(out_sorted, batch, topk=n, sorted=True)


# ----------------------------------------------------------------------------------------------
# +inf
# ----------------------------------------------------------------------------------------------

def test_plus_inf_ranks_highest_and_ties_by_position(device):
    """An inf scale on a positive key (positive q and weights) gives a +inf score: it ranks above every
    finite score; two +inf scores tie, so the smaller position comes first."""
    n = 400
    batch = make_exact_batch([n], seed=35, q_values=(1, 2), w_values=(1, 2))
    for t in (150, 20):
        set_token(batch, 0, t, key=1.0, scale=float("inf"))
    assert np.isposinf(scores_of_row(batch, 0)[[20, 150]]).all()
    out = run_dps(batch.to_torch(device), topk=2, sorted=True)
    assert out[0].tolist() == row_ids(batch, 0, [20, 150])
    for sorted_ in (False, True):
        out = run_dps(batch.to_torch(device), topk=7, sorted=sorted_)
        assert_exact(out, batch, topk=7, sorted=sorted_)


def test_float32_overflow_to_plus_inf_ranks_highest(device):
    """A huge scale (3e38) times fp8 448 overflows float32 to +inf: that token ranks first."""
    n = 400
    batch = make_exact_batch([n], seed=36, q_values=(1, 2), w_values=(1, 2))
    t_big = 333
    gid = set_token(batch, 0, t_big, key=448.0, scale=3e38)
    with np.errstate(over="ignore"):
        assert np.float32(448.0) * np.float32(3e38) == np.float32(np.inf)
    out = run_dps(batch.to_torch(device), topk=1)
    assert out.tolist() == [[gid]]
    out = run_dps(batch.to_torch(device), topk=5, sorted=True)
    assert out[0, 0] == gid
    assert_exact(out, batch, topk=5, sorted=True)


def test_test_data_fp8_special_bytes():
    """Sanity of the test data itself: 0x7F and 0xFF are the float8_e4m3fn NaNs, 448 is byte 0x7E."""
    f = np.array([0x7F, 0xFF, 0x7E], np.uint8).view(FP8).astype(np.float32)
    assert np.isnan(f[0]) and np.isnan(f[1]) and f[2] == 448.0
    assert fp8_bytes([448.0]).tolist() == [0x7E]
