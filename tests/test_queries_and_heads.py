"""docs/contract.md §7: several query tokens per row (MTP, N = 1..4) and 32 index heads.

* Query j of row b is query row b * N + j: its own q, weights and output row, the row's block table.
* seq_lens [B]: query j sees the first seq_lens[b] - (N - 1 - j) tokens (the N queries are the row's
  last N, causal among themselves); seq_lens [B, N]: query j sees the first seq_lens[b, j] tokens.
  Either count then follows the single-query rules (a negative count is 0, one past the table is cut).
* Everything else is the single-query operator applied to each query row on its own, so most tests
  compare a rank-4 call with N rank-3 calls, one per query with the length the contract gives it, on
  exact data (byte for byte, ties and 0.0 plateaus included) and against the float64 reference.
* 32 heads are scored as 32 heads; N = 1 with a rank-4 q gives the bytes of the rank-3 form; the
  [B * N, ...] and [B, N, ...] forms of weights and output are the same bytes.
* Shape mistakes raise before anything is written, naming the argument; validate=True checks the
  lengths of both seq_lens forms.
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

import ffi_dsa
from ffi_dsa.contract import MAX_QUERIES, NUM_HEADS, NUM_HEADS_NARROW, PAGE_TOKENS, SUPPORTED_HEADS
from ffi_dsa.workloads import MODEL_TABLE_PAGES, Batch, make_batch

from conftest import (
    DEFAULT_K,
    SENTINEL,
    assert_all_written,
    assert_exact,
    assert_valid_topk,
    assert_validate_raises,
    fill_past_rows,
    make_exact_batch,
    poisoned,
    run_dps,
    set_token,
    token_id,
)
from mtp_batches import query_alone

ORDERS = pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
HEADS = pytest.mark.parametrize("heads", SUPPORTED_HEADS, ids=[f"H{h}" for h in SUPPORTED_HEADS])


def _visible(seq_lens, queries: int, max_pages: int) -> np.ndarray:
    """[B, N] tokens each query sees, written out from the contract's words (not the reference's code)."""
    lens = np.asarray(seq_lens, np.int64)
    if lens.ndim == 1:
        lens = np.stack([lens - (queries - 1 - j) for j in range(queries)], axis=1)
    return np.minimum(np.maximum(lens, 0), max_pages * PAGE_TOKENS)


def _assert_each_query_is_the_single_query_operator(out, batch: Batch, device, topk, sorted_=False):
    """out [B, N, K] equals, query by query, the rank-3 call on that query alone."""
    assert out.shape == batch.output_shape(topk)
    for j in range(batch.q.shape[1]):
        alone = run_dps(query_alone(batch, j).to_torch(device), topk=topk, sorted=sorted_)
        np.testing.assert_array_equal(out[:, j], alone, err_msg=f"query {j}")


def _assert_counts(out, batch: Batch, topk: int) -> None:
    """Every query row holds min(K, visible) ids of its own prefix, then -1 (all pages valid)."""
    visible = _visible(batch.seq_lens, batch.q.shape[1], batch.block_table.shape[1])
    for b, j in np.ndindex(visible.shape):
        n = int(visible[b, j])
        got = out[b, j]
        count = min(topk, n)
        assert (got[count:] == -1).all() and (got[:count] >= 0).all(), f"query ({b}, {j}) sees {n} tokens"
        prefix = {token_id(batch, b, t) for t in range(n)}
        assert set(got[:count].tolist()) <= prefix, f"query ({b}, {j}) chose a token past its prefix"


# ----------------------------------------------------------------------------------------------
# What each query sees
# ----------------------------------------------------------------------------------------------

@HEADS
@ORDERS
def test_causal_offsets_at_the_rows_end(device, heads, sorted_):
    """seq_lens [B], N = 4: the last query sees the row, each earlier one a token less. Rows whose
    queries' prefixes cross K (2047..2050), cross a page boundary (62..65), are 0 and 1 long, and rows
    shorter than N (early queries see 0 tokens)."""
    lens = [2050, 65, 1, 2, 3, 0, 4, 5000]
    batch = make_exact_batch(lens, seed=701 + heads, queries=4, heads=heads)
    assert _visible(lens, 4, batch.block_table.shape[1])[:5].tolist() == [
        [2047, 2048, 2049, 2050], [62, 63, 64, 65], [0, 0, 0, 1], [0, 0, 1, 2], [0, 1, 2, 3]]
    out = run_dps(batch.to_torch(device), topk=DEFAULT_K, sorted=sorted_)
    _assert_counts(out, batch, DEFAULT_K)
    assert_exact(out, batch, topk=DEFAULT_K, sorted=sorted_)
    _assert_each_query_is_the_single_query_operator(out, batch, device, DEFAULT_K, sorted_)


@HEADS
@ORDERS
def test_per_query_lengths(device, heads, sorted_):
    """seq_lens [B, N]: arbitrary lengths, 0, negative (counts as 0), past the table (cut to it), and
    earlier queries that see more than later ones."""
    lens = np.array([[5000, 0, 700], [100, 2049, 64], [0, 0, 0], [3000, 10, 1], [64, 65, 63]], np.int32)
    batch = make_exact_batch(lens, seed=711 + heads, queries=3, heads=heads)
    capacity = batch.block_table.shape[1] * PAGE_TOKENS
    batch.seq_lens[0, 1] = capacity + 1000     # row 0 has pages for all of it: the cut is the table
    batch.seq_lens[3, 2] = -5
    visible = _visible(batch.seq_lens, 3, batch.block_table.shape[1])
    assert visible[0, 1] == capacity and visible[3, 2] == 0
    out = run_dps(batch.to_torch(device), topk=DEFAULT_K, sorted=sorted_)
    _assert_counts(out, batch, DEFAULT_K)
    assert_exact(out, batch, topk=DEFAULT_K, sorted=sorted_)
    _assert_each_query_is_the_single_query_operator(out, batch, device, DEFAULT_K, sorted_)


@HEADS
def test_per_query_lengths_on_realistic_data(device, heads):
    """Random FP8 data, seq_lens [B, N] with N = 2: a valid top-K per query row (tolerance rule)."""
    lens = np.array([[9000, 8999], [3000, 5000], [2048, 0], [1, 4097]], np.int32)
    batch = make_batch(lens, seed=721 + heads, queries=2, heads=heads)
    for sorted_ in (False, True):
        out = run_dps(batch.to_torch(device), sorted=sorted_)
        assert_valid_topk(out, batch, sorted=sorted_)
        _assert_counts(out, batch, DEFAULT_K)


# ----------------------------------------------------------------------------------------------
# Forms that must give the same bytes
# ----------------------------------------------------------------------------------------------

@HEADS
@ORDERS
@pytest.mark.parametrize("lens_form", ["B", "B1"])
def test_one_query_rank4_equals_rank3(device, heads, sorted_, lens_form):
    """N = 1: q [B, 1, H, 128] (seq_lens [B] or [B, 1], weights [B, 1, H], out [B, 1, K]) gives the
    bytes of q [B, H, 128]."""
    lens = [9000, 2048, 0, 64, 3001]
    batch = make_batch(lens, seed=731 + heads, heads=heads)
    expected = run_dps(batch.to_torch(device), sorted=sorted_)
    seq_lens = batch.seq_lens[:, None] if lens_form == "B1" else batch.seq_lens
    rows = len(lens)
    one = Batch(batch.q.reshape(rows, 1, heads, -1).copy(), batch.k_cache, batch.weights.reshape(rows, 1, heads).copy(),
                np.ascontiguousarray(seq_lens), batch.block_table)
    got = run_dps(one.to_torch(device), sorted=sorted_)
    assert got.shape == (len(lens), 1, DEFAULT_K)
    np.testing.assert_array_equal(got[:, 0], expected)
    assert_valid_topk(expected, batch, sorted=sorted_)


def test_seq_lens_b1_with_a_rank3_q_is_valid(device):
    """seq_lens [B, 1] is the per-query form with N = 1: with a rank-3 q it gives the bytes of [B]."""
    batch = make_batch([3000, 70, 0], seed=735)
    expected = run_dps(batch.to_torch(device), topk=512)
    args = list(batch.to_torch(device))
    args[3] = args[3][:, None].contiguous()
    np.testing.assert_array_equal(run_dps(args, topk=512), expected)


@HEADS
def test_row_and_query_row_forms_give_the_same_bytes(device, heads):
    """Output [B, N, K] and [B * N, K], weights [B, N, H] and [B * N, H]: the same bytes."""
    batch = make_batch([5000, 300, 2100], seed=741 + heads, queries=3, heads=heads)
    q, k, w, lens, table = batch.to_torch(device)
    rows = len(batch.seq_lens) * 3
    results = []
    for weights in (w, w.reshape(rows, heads)):
        for shape in ((len(batch.seq_lens), 3, DEFAULT_K), (rows, DEFAULT_K)):
            out = poisoned(shape, device)
            ffi_dsa.call(q, k, weights, lens, table, out)
            assert_all_written(out)
            results.append(out.cpu().numpy().reshape(rows, DEFAULT_K))
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])
    assert_valid_topk(results[0], batch)


def test_topk_indexer_allocates_one_row_per_query(device):
    """The allocating form returns [B, N, K] for a rank-4 q and [B, K] for a rank-3 one."""
    batch = make_batch([700, 100], seed=745, queries=2, heads=NUM_HEADS_NARROW)
    args = batch.to_torch(device)
    out = ffi_dsa.topk_indexer(*args, topk=64)
    assert tuple(out.shape) == (2, 2, 64) and out.dtype == torch.int32
    np.testing.assert_array_equal(out.cpu().numpy(), run_dps(args, topk=64))
    single = make_batch([700, 100], seed=746)
    assert tuple(ffi_dsa.topk_indexer(*single.to_torch(device), topk=64).shape) == (2, 64)
    assert ffi_dsa.topk_indexer(*batch.args(), topk=64).shape == (2, 2, 64)  # numpy


# ----------------------------------------------------------------------------------------------
# 32 heads
# ----------------------------------------------------------------------------------------------

@ORDERS
def test_32_heads_against_the_reference(device, sorted_):
    """H = 32 on random data: a valid top-K (tolerance rule); on exact data, the reference's bytes."""
    lens = [8192, 3001, 2048, 64, 0]
    batch = make_batch(lens, seed=751, heads=NUM_HEADS_NARROW)
    assert batch.q.shape[1:] == (NUM_HEADS_NARROW, 128)
    assert_valid_topk(run_dps(batch.to_torch(device), sorted=sorted_), batch, sorted=sorted_)
    exact = make_exact_batch(lens, seed=752, heads=NUM_HEADS_NARROW)
    assert_exact(run_dps(exact.to_torch(device), sorted=sorted_), exact, sorted=sorted_)
    exact4 = make_exact_batch(lens, seed=753, heads=NUM_HEADS_NARROW, queries=MAX_QUERIES)
    assert_exact(run_dps(exact4.to_torch(device), sorted=sorted_), exact4, sorted=sorted_)


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["inf_logits", "minus_inf_logits"])
def test_32_heads_are_not_64_heads_with_zero_weights(device, sign):
    """A token with an infinite scale: its 32 logits are +inf (score +inf, the best) or -inf (relu
    makes every head 0, score 0, the best of a row of negative scores). Padding to 64 heads with
    q = 0 and weight 0 would add 0 * relu(0 * inf) = NaN and make it the worst."""
    # every q and k value non-zero: no 0 * inf inside a dot product, which the float64 reference
    # (scale folded into the key) would make NaN
    batch = make_exact_batch([300, 300], seed=761, q_values=(1,), k_values=(1,), w_values=(-sign,),
                             heads=NUM_HEADS_NARROW, queries=2)
    batch.weights[:, 1] = sign   # query 1: the token's +inf (sign 1) or 0 (sign -1) is its best score
    token = set_token(batch, 0, 123, key=sign, scale=np.inf)
    out = run_dps(batch.to_torch(device), topk=1, sorted=True)
    assert out[0, 1, 0] == token, "the infinitely scaled token must win for query 1"
    assert_exact(out, batch, topk=1, sorted=True)


# ----------------------------------------------------------------------------------------------
# Ties, plateaus and NaN, per query
# ----------------------------------------------------------------------------------------------

@HEADS
@ORDERS
@pytest.mark.parametrize("lens_form", ["B", "BN"])
def test_ties_and_zero_plateaus_per_query(device, heads, sorted_, lens_form):
    """Small-integer data with thousands of equal scores and relu's 0.0 plateaus, each query with
    its own q and weights: the smaller position wins every tie, for every query row."""
    lens = [6000, 2600, 2049, 500]
    if lens_form == "BN":
        lens = np.array([[6000, 5990, 100], [2600, 2700, 2048], [2049, 0, 2049], [500, 1, 501]], np.int32)
    batch = make_exact_batch(lens, seed=771 + heads, q_values=(0, 1), k_values=(-1, 0, 1), w_values=(1,),
                             active_dims=2, queries=3, heads=heads)
    rows = ffi_dsa.reference_scores(*batch.args())
    assert np.mean(rows[0].scores == 0.0) > 0.2, "the data must have a 0.0 plateau"
    assert len(np.unique(rows[0].scores)) < 50, "the data must have many ties"
    for topk in (2048, 17):
        out = run_dps(batch.to_torch(device), topk=topk, sorted=sorted_)
        assert_exact(out, batch, topk=topk, sorted=sorted_)
        _assert_each_query_is_the_single_query_operator(out, batch, device, topk, sorted_)


def test_queries_of_a_row_differ(device):
    """Each query uses its own q and weights: with the same length, different queries of a row
    choose differently (guards against every query reading query 0's data)."""
    batch = make_exact_batch(np.full((2, 4), 3000, np.int32), seed=775, queries=4, heads=NUM_HEADS_NARROW)
    out = run_dps(batch.to_torch(device), topk=100, sorted=True)
    assert_exact(out, batch, topk=100, sorted=True)
    for b in range(2):
        assert len({tuple(out[b, j]) for j in range(4)}) == 4


@pytest.mark.parametrize("heads", SUPPORTED_HEADS, ids=[f"H{h}" for h in SUPPORTED_HEADS])
def test_nan_weight_affects_only_its_query_row(device, heads):
    """A NaN weight makes every score of its query row NaN (so that row takes its first K tokens by
    position) and changes no other query row."""
    batch = make_batch([3000, 2500], seed=781 + heads, queries=3, heads=heads)
    clean = run_dps(batch.to_torch(device))
    batch.weights[1, 1, 5] = np.nan
    out = run_dps(batch.to_torch(device))
    changed = [(b, j) for b in range(2) for j in range(3) if not np.array_equal(out[b, j], clean[b, j])]
    assert changed == [(1, 1)]
    assert out[1, 1].tolist() == [token_id(batch, 1, t) for t in range(DEFAULT_K)]
    assert_valid_topk(out, batch)


# ----------------------------------------------------------------------------------------------
# Pages: invalid ids, wide tables
# ----------------------------------------------------------------------------------------------

@ORDERS
def test_invalid_page_ids(device, sorted_):
    """Invalid page ids inside a row are masked for every query that sees them; a page that only the
    longest query reaches is masked for it alone."""
    lens = np.array([[4100, 4000, 3000], [700, 900, 800]], np.int32)
    batch = make_exact_batch(lens, seed=791, queries=3, heads=NUM_HEADS)
    batch.block_table[0, 10] = -1                         # seen by all three queries of row 0
    batch.block_table[0, 64] = batch.k_cache.shape[0]     # tokens 4096..4099: query 0 only
    batch.block_table[1, 13] = -7                         # tokens 832..895: queries 1 (900) only
    for topk in (16, DEFAULT_K):
        out = run_dps(batch.to_torch(device), topk=topk, sorted=sorted_)
        assert_exact(out, batch, topk=topk, sorted=sorted_)
        _assert_each_query_is_the_single_query_operator(out, batch, device, topk, sorted_)
    out = run_dps(batch.to_torch(device), topk=DEFAULT_K)
    assert (out[1, 1] != -1).sum() == 900 - 64 and (out[1, 2] != -1).sum() == 800


@pytest.mark.parametrize("lens_form", ["B", "BN"])
def test_wide_table_with_garbage_past_the_longest_prefix(device, lens_form):
    """A model-sized table (MODEL_TABLE_PAGES) whose entries past each row's longest prefix are random ids, valid or not:
    the same bytes as a table just wide enough."""
    lens = [8192, 100, 0, 4097]
    if lens_form == "BN":
        lens = np.array([[8192, 20], [100, 64], [0, 0], [1, 4097]], np.int32)
    narrow = make_batch(lens, seed=801, queries=2, heads=NUM_HEADS_NARROW)
    wide = make_batch(lens, seed=801, queries=2, heads=NUM_HEADS_NARROW, max_pages=MODEL_TABLE_PAGES)
    fill_past_rows(wide, seed=802)
    for sorted_ in (False, True):
        out = run_dps(wide.to_torch(device), sorted=sorted_)
        np.testing.assert_array_equal(out, run_dps(narrow.to_torch(device), sorted=sorted_))
        assert_valid_topk(out, wide, sorted=sorted_)


# ----------------------------------------------------------------------------------------------
# Degenerate shapes and K
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("lens_form", ["B", "BN"])
def test_empty_batch_with_three_queries(device, lens_form):
    """B = 0 with N = 3: nothing to write, no error, outputs [0, 3, K] and [0, K]."""
    lens = np.zeros((0, 3) if lens_form == "BN" else (0,), np.int32)
    batch = make_batch(lens, seed=811, queries=3)
    args = batch.to_torch(device)
    assert run_dps(args).shape == (0, 3, DEFAULT_K)
    ffi_dsa.call(*args, poisoned((0, DEFAULT_K), device))
    assert tuple(ffi_dsa.topk_indexer(*args, topk=16).shape) == (0, 3, 16)


@HEADS
@pytest.mark.parametrize("topk", [1, 2048])
def test_k_values(device, heads, topk):
    """K = 1 and K = 2048 with N = 2: the reference's bytes on exact data, both orders."""
    lens = np.array([[topk - 1, topk + 1], [topk, topk], [5000, 3], [0, 1]], np.int32)
    batch = make_exact_batch(np.maximum(lens, 0), seed=821 + topk, queries=2, heads=heads,
                             q_values=(0, 1), k_values=(0, 1, 2), w_values=(1, 2), active_dims=3)
    for sorted_ in (False, True):
        out = run_dps(batch.to_torch(device), topk=topk, sorted=sorted_)
        assert_exact(out, batch, topk=topk, sorted=sorted_)


# ----------------------------------------------------------------------------------------------
# validate=True with N queries
# ----------------------------------------------------------------------------------------------

def _validate_cases():
    def too_long_query(b):
        b.seq_lens[1, 2] = b.block_table.shape[1] * PAGE_TOKENS + 1
        return "seq_lens[1, 2]"

    def negative_query(b):
        b.seq_lens[0, 1] = -1
        return "seq_lens[0, 1]"

    def page_of_the_longest_query_only(b):
        b.block_table[0, 15] = -1      # row 0's queries see 1000, 900 and 800 tokens: only query 0 reaches page 15
        return "block_table[0, 15]"

    def page_past_the_pool(b):
        b.block_table[1, 0] = b.k_cache.shape[0]
        return "block_table[1, 0]"

    return [too_long_query, negative_query, page_of_the_longest_query_only, page_past_the_pool]


@pytest.mark.parametrize("corrupt", _validate_cases(), ids=lambda f: f.__name__)
def test_validate_true_checks_every_query_length(device, corrupt):
    """seq_lens [B, N] with validate=True: each entry and the pages of each row's longest query are
    checked on the host; ValueError naming the entry, nothing written."""
    batch = make_batch(np.array([[1000, 900, 800], [70, 200, 5]], np.int32), seed=831, queries=3)
    assert_validate_raises(batch, corrupt(batch), device)


def test_validate_true_with_row_lengths(device):
    """seq_lens [B] with N queries: the row's length is checked (its last query sees it all), a row
    shorter than N is valid (its early queries see 0 tokens), and a bad page used only by the last
    query raises naming seq_lens[b]."""
    batch = make_batch([961, 2, 0], seed=841, queries=4)
    args = batch.to_torch(device)
    validated = run_dps(args, topk=64, validate=True)
    np.testing.assert_array_equal(validated, run_dps(args, topk=64))
    batch.block_table[0, 15] = -1  # token 960: query 3 sees 961 tokens, query 2 only 960
    with pytest.raises(ValueError, match=r"block_table\[0, 15\].*seq_lens\[0\] = 961"):
        ffi_dsa.call(*batch.to_torch(device), poisoned((3, 4, 64), device), validate=True)
    batch.seq_lens[2] = -1
    with pytest.raises(ValueError, match=r"seq_lens\[2\] = -1"):
        ffi_dsa.validate_pages(batch.k_cache, batch.seq_lens, batch.block_table)


# ----------------------------------------------------------------------------------------------
# Shape mistakes: raise naming the argument, write nothing
# ----------------------------------------------------------------------------------------------

B, N, H, K = 2, 3, NUM_HEADS_NARROW, 64
NAMES = ("q", "k", "w", "lens", "table", "out")
ARG_NAME = {"q": "q_index_fp8", "k": "k_index_cache_fp8", "w": "weights", "lens": "seq_lens",
            "table": "block_table", "out": "topk_indices"}


def _fp8_zeros(shape, device):
    return torch.zeros(shape, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)


# (case id, argument that is wrong, replacement, expected exception, a word the message must hold)
BAD_SHAPES = [
    ("q_N5", "q", lambda d: _fp8_zeros((B, MAX_QUERIES + 1, H, 128), d), ValueError, f"1..{MAX_QUERIES}"),
    ("q_N0", "q", lambda d: _fp8_zeros((B, 0, H, 128), d), ValueError, f"1..{MAX_QUERIES}"),
    ("q_H48", "q", lambda d: _fp8_zeros((B, N, 48, 128), d), ValueError, f"{NUM_HEADS} or {NUM_HEADS_NARROW}"),
    ("q_H63", "q", lambda d: _fp8_zeros((B, N, 63, 128), d), ValueError, f"{NUM_HEADS} or {NUM_HEADS_NARROW}"),
    ("q_rank3_H48", "q", lambda d: _fp8_zeros((B, 48, 128), d), ValueError, f"{NUM_HEADS} or {NUM_HEADS_NARROW}"),
    ("q_rank5", "q", lambda d: _fp8_zeros((B, N, 1, H, 128), d), ValueError, "rank"),
    ("weights_rows_not_BN", "w", lambda d: torch.zeros((B * N + 1, H), device=d), ValueError, "B * N"),
    ("weights_rows_B", "w", lambda d: torch.zeros((B, H), device=d), ValueError, "B * N"),
    ("weights_B_N2_H", "w", lambda d: torch.zeros((B, N - 1, H), device=d), ValueError, "N"),
    ("weights_H64", "w", lambda d: torch.zeros((B, N, NUM_HEADS), device=d), ValueError, "H"),
    ("out_B_N1_K", "out", lambda d: poisoned((B, N + 1, K), d), ValueError, "N"),
    ("out_BN1_K", "out", lambda d: poisoned((B * N + 1, K), d), ValueError, "B * N"),
    ("out_B_K", "out", lambda d: poisoned((B, K), d), ValueError, "B * N"),
    ("out_rank4", "out", lambda d: poisoned((B, N, K, 1), d), ValueError, "rank"),
    ("seq_lens_rank3", "lens", lambda d: torch.zeros((B, N, 1), dtype=torch.int32, device=d), ValueError, "rank"),
    ("seq_lens_B_N1", "lens", lambda d: torch.zeros((B, N + 1), dtype=torch.int32, device=d), ValueError, "N"),
    ("seq_lens_BN", "lens", lambda d: torch.zeros((B * N,), dtype=torch.int32, device=d), ValueError, "B"),
]


@pytest.mark.parametrize("case", BAD_SHAPES, ids=[c[0] for c in BAD_SHAPES])
def test_shape_mistakes_raise_naming_the_argument_and_write_nothing(device, case):
    _, which, replacement, exc_type, expected = case
    batch = make_batch([150, 70], seed=851, queries=N, heads=H)
    args = dict(zip(NAMES, (*batch.to_torch(device), poisoned((B, N, K), device))))
    original_out = args["out"]
    args[which] = replacement(device)
    with pytest.raises(exc_type) as exc:
        ffi_dsa.call(*(args[n] for n in NAMES))
    assert ARG_NAME[which] in str(exc.value), f"the message must name {ARG_NAME[which]}: {exc.value}"
    assert expected in str(exc.value), f"the message must say what was expected ({expected}): {exc.value}"
    for buffer in (original_out, args["out"]):
        assert (buffer.cpu() == SENTINEL).all(), "nothing may be written when rejected"


def test_the_good_arguments_of_the_shape_cases_run(device):
    """Control for the table above: unmutated, the same arguments run and fill the output."""
    batch = make_batch([150, 70], seed=851, queries=N, heads=H)
    out = run_dps(batch.to_torch(device), topk=K)
    assert out.shape == (B, N, K)
