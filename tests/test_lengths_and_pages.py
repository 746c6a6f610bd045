"""docs/contract.md §1-§3: lengths, pages and device-only facts.

* "seq_lens[b] == 0: the whole row is -1. B == 0: nothing is written, no error."
* "seq_lens[b] < K: the first seq_lens[b] entries are valid, the rest -1."
* "A token on an invalid page is not a candidate; a negative length counts as 0; a too-long length is
  cut to max_num_pages * 64. An opt-in validation mode checks these on the host and raises instead."
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ffi_dsa
from ffi_dsa.workloads import make_batch

from conftest import (
    DEFAULT_K,
    SENTINEL,
    assert_all_written,
    assert_exact,
    assert_valid_topk,
    assert_validate_raises,
    make_exact_batch,
    poisoned,
    run_dps,
    scores_of_row,
    set_token,
    token_id,
)


def _edge_lengths(k):
    return [0, 1, k - 1, k, k + 1]


@pytest.mark.parametrize("k", [DEFAULT_K, 16])
def test_lengths_around_k_random(device, k):
    """Lengths 0, 1, K-1, K, K+1: min(K, seq_lens[b]) valid ids, then -1 (tolerance rule)."""
    lens = _edge_lengths(k)
    batch = make_batch(lens, seed=40 + k)
    out = run_dps(batch.to_torch(device), topk=k)
    assert_valid_topk(out, batch)
    for b, n in enumerate(lens):
        valid = min(k, n)
        assert (out[b, :valid] >= 0).all() and (out[b, valid:] == -1).all()
    assert (out[0] == -1).all(), "seq_lens == 0: the whole row is -1"


@pytest.mark.parametrize("k", [DEFAULT_K, 16])
@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
def test_lengths_around_k_exact(device, k, sorted_):
    """Lengths 0, 1, K-1, K, K+1 on exact data: equal to the reference byte for byte."""
    batch = make_exact_batch(_edge_lengths(k), seed=41 + k)
    out = run_dps(batch.to_torch(device), topk=k, sorted=sorted_)
    assert_exact(out, batch, topk=k, sorted=sorted_)


def test_length_not_a_multiple_of_64_ignores_the_rest_of_the_last_page(device):
    """Only tokens t < seq_lens[b] are candidates: the unused slots of the last page (which hold the
    best keys of the whole cache here) are never chosen."""
    n = 64 * 3 + 10
    batch = make_exact_batch([n], seed=42, q_values=(1, 2), w_values=(1, 2))
    last_page = int(batch.block_table[0, 3])
    tail_ids = []
    for slot in range(10, 64):                      # past the row's end, same page
        batch.k_cache.view(np.uint8).reshape(-1, 8448)[last_page, slot * 128:(slot + 1) * 128] = 0x7E  # 448
        tail_ids.append(last_page * 64 + slot)
    for k in (16, DEFAULT_K):
        out = run_dps(batch.to_torch(device), topk=k)
        assert not set(tail_ids) & set(out[0].tolist())
        assert_exact(out, batch, topk=k)


def test_block_table_entries_past_the_length_are_not_read(device):
    """Entries of block_table past a row's last page are ignored, even when they are valid page ids
    holding the best keys of the cache."""
    batch = make_exact_batch([100, 64 * 5], seed=43, q_values=(1, 2), w_values=(1, 2), max_pages=5)
    hot_page = int(batch.block_table[1, 4])          # a page of row 1 ...
    batch.k_cache.view(np.uint8).reshape(-1, 8448)[hot_page, :8192] = 0x7E
    batch.block_table[0, 2:] = hot_page              # ... listed in row 0's unused entries
    out = run_dps(batch.to_torch(device), topk=DEFAULT_K)
    assert ((out[0] // 64) != hot_page).all()
    assert (out[0, :100] >= 0).all() and (out[0, 100:] == -1).all()
    assert_exact(out, batch)


def test_long_row_40000_tokens(device):
    """A long row (40000 tokens, 625 pages) against the tolerance rule, both orders."""
    batch = make_batch([40000], seed=44)
    for sorted_ in (False, True):
        out = run_dps(batch.to_torch(device), sorted=sorted_)
        assert_valid_topk(out, batch, sorted=sorted_)


def test_long_row_exact_with_ties(device):
    """A long row of exact, heavily tied data: exactly the reference answer."""
    batch = make_exact_batch([40000, 5000], seed=45, q_values=(0, 1), k_values=(0, 1), w_values=(1,),
                             active_dims=3)
    assert_exact(run_dps(batch.to_torch(device)), batch)


@pytest.mark.slow
def test_long_row_131072_tokens_cpu():
    """A 128K-token row on the CPU path (tolerance rule)."""
    batch = make_batch([131072, 3], seed=46)
    out = run_dps(batch.to_torch("cpu"))
    assert_valid_topk(out, batch)


def test_batch_of_zero_rows_writes_nothing(device):
    """B == 0: no error, nothing written (the output is a 0-row view of a poisoned buffer)."""
    batch = make_batch([5, 7], seed=47)
    q, k_cache, w, lens, table = batch.to_torch(device)
    buffer = poisoned((2, DEFAULT_K), device)
    ffi_dsa.call(q[:0], k_cache, w[:0], lens[:0], table[:0], buffer[:0])
    assert (buffer == SENTINEL).all()
    out = ffi_dsa.topk_indexer(q[:0], k_cache, w[:0], lens[:0], table[:0])
    assert tuple(out.shape) == (0, DEFAULT_K) and out.dtype == torch.int32


def test_k_zero_gives_an_empty_output(device):
    """K = 0 (topk_indices of shape [B, 0]) is allowed: no error, an empty result."""
    batch = make_batch([5, 300], seed=48)
    args = batch.to_torch(device)
    buffer = poisoned((2, 4), device)
    ffi_dsa.call(*args, buffer[:, :0])              # a [2, 0] view into a poisoned buffer
    assert (buffer == SENTINEL).all()
    out = ffi_dsa.topk_indexer(*args, topk=0)
    assert tuple(out.shape) == (2, 0)


def test_negative_length_counts_as_zero(device):
    """seq_lens[b] < 0 counts as 0: the row is all -1; the other rows are unaffected."""
    batch = make_exact_batch([300, -5, 200, -2**31], seed=49)
    out = run_dps(batch.to_torch(device), topk=64)
    assert (out[1] == -1).all() and (out[3] == -1).all()
    assert (out[0] >= 0).all() and (out[2] >= 0).all()
    assert_exact(out, batch, topk=64)


def test_too_long_length_is_cut_to_max_pages_times_64(device):
    """seq_lens[b] > max_num_pages * 64 is cut to max_num_pages * 64 (no read past the table)."""
    batch = make_exact_batch([64 * 3, 64 * 3, 64 * 3], seed=50)
    capacity = batch.block_table.shape[1] * 64
    clamped = run_dps(batch.to_torch(device), topk=DEFAULT_K)
    batch.seq_lens[:] = [capacity + 1, 10**6, 2**31 - 1]
    out = run_dps(batch.to_torch(device), topk=DEFAULT_K)
    assert np.array_equal(out, clamped)
    assert ((out != -1).sum(axis=1) == capacity).all()
    assert_exact(out, batch)


@pytest.mark.parametrize("bad_page", ["negative", "minus_one", "num_pages", "huge"])
def test_invalid_page_ids_are_not_candidates(device, bad_page):
    """Tokens on a page id outside [0, num_pages) are never chosen, never crash, and the count of -1
    grows by the number of tokens on such pages."""
    n = 64 * 4 + 20                                  # 5 pages, the last one partial
    batch = make_exact_batch([n, n], seed=51, spare_pages=2)
    num_pages = batch.k_cache.shape[0]
    bad = {"negative": -7, "minus_one": -1, "num_pages": num_pages, "huge": 2**31 - 1}[bad_page]
    batch.block_table[0, 1] = bad                    # 64 tokens lost
    batch.block_table[0, 4] = bad                    # the 20 tokens of the partial page lost
    valid = n - 64 - 20
    out = run_dps(batch.to_torch(device), topk=DEFAULT_K)
    assert (out[0] != -1).sum() == valid
    pages = out[0, :valid] // 64
    assert ((pages >= 0) & (pages < num_pages)).all()
    assert (out[1] != -1).sum() == n
    assert_exact(out, batch)


def test_invalid_page_tokens_lose_even_to_the_worst_scores(device):
    """Not a candidate is not a low score: with every real score negative, tokens of an invalid page
    still never appear (a kernel that scored them 0, or read a clamped page, would choose them)."""
    n, k = 64 * 3, 16
    batch = make_exact_batch([n], seed=52, q_values=(1, 2), k_values=(1, 2), w_values=(-1, -2))
    assert (scores_of_row(batch, 0) < 0).all()
    num_pages = batch.k_cache.shape[0]
    batch.block_table[0, 0] = num_pages              # the row's first page is invalid
    out = run_dps(batch.to_torch(device), topk=k)
    assert (out[0] >= 0).all()
    assert ((out[0] // 64) != num_pages).all()
    assert_exact(out, batch, topk=k)
    # With K >= the remaining candidates: exactly the 128 valid tokens, then -1.
    out = run_dps(batch.to_torch(device), topk=DEFAULT_K, sorted=True)
    assert (out[0] != -1).sum() == 128
    assert_exact(out, batch, sorted=True)


@pytest.mark.parametrize("shape", ["table_fits_k", "wide_table", "with_long_rows"])
def test_rows_of_at_most_k_tokens_are_every_valid_token_in_position_order(device, shape):
    """seq_lens[b] <= K: every token on a valid page is chosen whatever its score (NaN scores, invalid
    pages in the middle of the row, exact ties), by ascending position, then -1. (The CUDA path writes
    such rows without scoring them; "table_fits_k" takes its one-kernel path, "wide_table" a block
    table wider than K tokens, "with_long_rows" the same rows next to rows that need a selection.)"""
    k = DEFAULT_K
    lens = [0, 1, 63, 64, 65, 1000, k - 1, k, 700]
    if shape == "with_long_rows":
        lens += [k + 1, 5000]
    batch = make_batch(lens, seed=56, spare_pages=3, max_pages=200 if shape == "wide_table" else None)
    num_pages = batch.k_cache.shape[0]
    batch.block_table[5, 3] = -5                     # an invalid page inside a row
    batch.block_table[6, 0] = num_pages              # the first page out of range
    batch.block_table[7, 31] = -1                    # the last page of a row of exactly K tokens
    batch.weights[4, 7] = np.nan                     # every score of row 4 is NaN
    batch.weights[8] = 0.0                           # every score of row 8 is 0: all tie
    out = run_dps(batch.to_torch(device), topk=k)
    for b, n in enumerate(lens[:9]):
        expected = [token_id(batch, b, t) for t in range(n) if 0 <= batch.block_table[b, t // 64] < num_pages]
        assert out[b].tolist() == expected + [-1] * (k - len(expected)), f"row {b}"
    assert_valid_topk(out, batch)
    sorted_out = run_dps(batch.to_torch(device), topk=k, sorted=True)
    assert_valid_topk(sorted_out, batch, sorted=True)
    for b in range(9):
        assert sorted(sorted_out[b].tolist()) == sorted(out[b].tolist()), f"row {b}: same tokens when sorted"


def test_row_with_only_invalid_pages_is_all_minus_one(device):
    batch = make_exact_batch([200, 200], seed=53)
    batch.block_table[1, :] = -3
    out = run_dps(batch.to_torch(device), topk=64)
    assert (out[1] == -1).all() and (out[0] >= 0).all()


@pytest.mark.parametrize("lens, topk", [([100, 64], 32), ([3000] * 256, 2048)], ids=["two_rows", "256_rows"])
def test_empty_page_pool_every_page_id_is_invalid(device, lens, topk):
    """num_pages == 0: every page id is invalid, so every row is all -1 (no read of the empty cache).
    256 rows of 3000 tokens take the one-kernel path on CUDA (>= 0.7 x SMs, table <= 16K tokens)."""
    batch = make_batch(lens, seed=54)
    q, _, w, seq_lens, table = batch.to_torch(device)
    empty_cache = torch.empty((0, 64, 1, 132), dtype=torch.int8, device=device)
    for sorted_ in (False, True):
        out = run_dps((q, empty_cache, w, seq_lens, table), topk=topk, sorted=sorted_)
        assert (out == -1).all()


def test_page_shared_by_two_positions_of_different_rows(device):
    """The same page may serve several rows (prefix sharing); ids stay page * 64 + slot in each row."""
    batch = make_exact_batch([128, 128], seed=55, q_values=(1,), w_values=(1,))
    shared = int(batch.block_table[0, 0])
    batch.block_table[1, 1] = shared                 # row 1's second page is row 0's first page
    t_best = 5
    gid = set_token(batch, 0, t_best, key=2.0)
    out = run_dps(batch.to_torch(device), topk=1)
    assert out[0, 0] == gid and out[1, 0] == gid     # position 5 of row 0, position 69 of row 1
    assert token_id(batch, 1, 64 + t_best) == gid


# ----------------------------------------------------------------------------------------------
# validate=True: the same device-only facts, checked on the host, raise instead.
# ----------------------------------------------------------------------------------------------

def _validate_cases():
    def negative(b):
        b.seq_lens[1] = -1
        return "seq_lens[1]"

    def too_long(b):
        b.seq_lens[0] = b.block_table.shape[1] * 64 + 1
        return "seq_lens[0]"

    def negative_page(b):
        b.block_table[1, 0] = -1
        return "block_table[1, 0]"

    def page_past_pool(b):
        b.block_table[0, 1] = b.k_cache.shape[0]
        return "block_table[0, 1]"

    def repeated_page(b):
        b.block_table[0, 2] = b.block_table[0, 0]
        return "block_table[0, 0] and block_table[0, 2] are both page"

    return [negative, too_long, negative_page, page_past_pool, repeated_page]


@pytest.mark.parametrize("corrupt", _validate_cases(), ids=lambda f: f.__name__)
def test_validate_true_raises_for_masked_facts(device, corrupt):
    """validate=True raises ValueError (naming the entry) where the kernel would mask; nothing written."""
    batch = make_batch([150, 100], seed=56)
    assert_validate_raises(batch, corrupt(batch), device)


@pytest.mark.parametrize("lens_form", ["[B]", "[B, N]"])
def test_validate_true_names_a_page_repeated_inside_a_row(device, lens_form):
    """Both columns of the first repeat among the pages the row uses (of its longest query with a
    length per query); a page shared by two rows, or repeated past a row's pages, is no repeat."""
    queries = 2 if lens_form == "[B, N]" else None
    # with a length per query, row 0 uses the pages of its longest query, its second
    lens = [[64 * 4, 64 * 7], [64 * 3, 64 * 2]] if queries else [64 * 7, 64 * 3]
    batch = make_batch(lens, seed=58, queries=queries, max_pages=8)
    batch.block_table[1, 0] = batch.block_table[0, 1]       # shared across rows: fine
    batch.block_table[1, 5] = batch.block_table[1, 1]       # past row 1's 3 pages: fine
    ffi_dsa.validate_pages(batch.k_cache, batch.seq_lens, batch.block_table)
    batch.block_table[0, 6] = batch.block_table[0, 4]
    batch.block_table[0, 5] = batch.block_table[0, 3]       # the earliest repeat: column 5
    entry = "seq_lens[0, 1] = 448" if queries else "seq_lens[0] = 448"
    assert_validate_raises(batch, f"block_table[0, 3] and block_table[0, 5] are both page "
                                  f"{int(batch.block_table[0, 3])} and row 0 uses both ({entry})", device)


def test_a_repeated_page_without_validate_is_scored_once_per_column(device):
    """docs/contract.md §3: the kernels take the table as it stands; each column's 64 positions are
    candidates, so with ids="slots" the same id can appear twice, with "positions" never."""
    batch = make_exact_batch([64 * 3], seed=59)
    batch.block_table[0, 2] = batch.block_table[0, 0]
    args = batch.to_torch(device)
    for ids in ("slots", "positions"):
        out = run_dps(args, topk=DEFAULT_K, ids=ids)
        assert_exact(out, batch, ids=ids)
        chosen = out[0][out[0] >= 0]
        assert chosen.size == 64 * 3
        assert np.unique(chosen).size == (64 * 2 if ids == "slots" else 64 * 3)


def test_validate_true_passes_for_good_input(device):
    """validate=True accepts good input, including -1 padding in block_table past each row's pages, and
    gives the same answer as without validation."""
    batch = make_batch([150, 1, 0, 700], seed=57)
    assert (batch.block_table == -1).any()
    args = batch.to_torch(device)
    validated = run_dps(args, topk=128, validate=True)
    assert np.array_equal(validated, run_dps(args, topk=128))
    assert_valid_topk(validated, batch)
    out = ffi_dsa.topk_indexer(*args, topk=128, validate=True)
    assert np.array_equal(out.cpu().numpy(), validated)


# ----------------------------------------------------------------------------------------------
# Memory placement that is still contiguous.
# ----------------------------------------------------------------------------------------------

def test_contiguous_views_at_an_offset(device):
    """Contiguous views that do not start at their buffer's beginning (a slice of the page pool, rows
    of a larger batch, a byte offset of 8448) are read at the right address."""
    big = make_exact_batch([300, 500, 200], seed=58, spare_pages=3)
    q, k_cache, w, lens, table = big.to_torch(device)
    # rows 1..2 of the batch; pages renumbered after dropping page 0 of the pool
    sub_table = table[1:].clone()
    sub_table = torch.where(sub_table > 0, sub_table - 1, torch.full_like(sub_table, -1))
    args = (q[1:], k_cache[1:], w[1:], lens[1:], sub_table)
    assert all(a.is_contiguous() for a in args)
    out = run_dps(args, topk=256)

    import copy
    sub = copy.deepcopy(big)
    sub.q, sub.weights, sub.seq_lens = big.q[1:], big.weights[1:], big.seq_lens[1:]
    sub.k_cache = big.k_cache[1:]
    sub.block_table = sub_table.cpu().numpy()
    assert_exact(out, sub, topk=256)
    out_offset = poisoned((4, 256), device)
    ffi_dsa.call(*args, out_offset[2:])
    assert (out_offset[:2] == SENTINEL).all()
    assert np.array_equal(out_offset[2:].cpu().numpy(), out)


@pytest.mark.parametrize("which", ["k_cache", "q"])
def test_contiguous_input_at_an_odd_byte_offset(device, which):
    """A contiguous tensor may start at any byte of its storage (a view at an odd offset). The op must
    then either give the right answer or reject it with a ValueError naming the argument; it may not
    read the wrong bytes or fault."""
    batch = make_exact_batch([300, 200], seed=59)
    args = list(batch.to_torch(device))
    index, name = {"k_cache": (1, "k_cache (k_index_cache_fp8)"), "q": (0, "q (q_index_fp8)")}[which]
    src = args[index].view(torch.uint8) if which == "q" else args[index]
    storage = torch.zeros(src.numel() + 1, dtype=src.dtype, device=device)
    view = storage[1:].view(src.shape)
    view.copy_(src)
    assert view.is_contiguous() and view.data_ptr() % 2 == 1
    args[index] = view.view(torch.float8_e4m3fn) if which == "q" else view
    out = poisoned((2, 64), device)
    try:
        ffi_dsa.call(*args, out)
    except ValueError as exc:
        assert name in str(exc)
        assert (out == SENTINEL).all()
        return
    assert_all_written(out)
    assert_exact(out.cpu().numpy(), batch, topk=64)
