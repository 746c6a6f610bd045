"""docs/contract.md, prefill: a chunk of query rows over one contiguous key buffer (ragged, causal).

Results are checked against the float64 reference (``ffi_dsa.check_prefill_topk``, the tolerance
rule) and, on data whose scores are exact in any order of addition, byte for byte
(``ffi_dsa.reference_prefill``): ties, 0.0 plateaus, NaN, +-inf, +-0, both orders, both ids. Every
output is poisoned first and must be fully written; every caller mistake must be named before
anything is written. Every test that runs the op through ``run_prefill`` runs it on the CPU and, where
a GPU is present, on CUDA (the ``device`` fixture); tests/test_prefill_cuda.py adds what only the
CUDA kernel has (long rows that cut the candidate buffers, alignment, graphs).
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
import torch

import ffi_dsa
from ffi_dsa.contract import HEAD_DIM, NUM_HEADS_NARROW, PAGE_BYTES, PAGE_FP8_BYTES, PAGE_TOKENS, PREFILL_IDS
from ffi_dsa.prefill_workloads import causal_ranges, make_exact_prefill_batch, make_prefill_batch
from ffi_dsa.prefill_reference import key_ranges

from conftest import (CUDA, DEVICES, FP8_NAN_BYTES, SENTINEL, assert_all_written, assert_rows_equal, fp8_bytes, poisoned,
                      poisoned_np)

K = 64
IDS = list(PREFILL_IDS)
ORDERS = [pytest.param(False, id="position_order"), pytest.param(True, id="sorted")]


# The device run_prefill sends numpy arguments to (the autouse fixture below sets it per test).
_DEVICE = {"name": "cpu"}


@pytest.fixture(autouse=True, params=DEVICES)
def device(request):
    _DEVICE["name"] = request.param
    yield request.param
    _DEVICE["name"] = "cpu"


def on_device(args):
    """numpy arguments as torch tensors on the test's device (unchanged on the CPU)."""
    if _DEVICE["name"] == "cpu" or not isinstance(args[0], np.ndarray):
        return args
    def one(a):
        a = np.ascontiguousarray(a)
        return torch.from_numpy(a.view(np.uint8) if a.dtype == ml_dtypes.float8_e4m3fn else a).to(_DEVICE["name"])

    return tuple(one(a) for a in args)


def run_prefill(args, topk=K, *, sorted=False, ids="relative", validate=False) -> np.ndarray:
    """``ffi_dsa.prefill_call`` on the test's device into a poisoned buffer of q's framework;
    returns host int32 ``[M, topk]``, checked to be fully written."""
    args = on_device(args)
    q = args[0]
    torch_args = isinstance(q, torch.Tensor)
    out = poisoned((q.shape[0], topk), q.device) if torch_args else poisoned_np((q.shape[0], topk))
    ffi_dsa.prefill_call(*args, out, sorted=sorted, validate=validate, ids=ids)
    assert_all_written(out)
    return out.cpu().numpy() if torch_args else out


def assert_exact(out, batch, topk=K, *, sorted=False, ids="relative") -> None:
    """Byte-exact agreement with the float64 reference (exact-score data only)."""
    expected = ffi_dsa.reference_prefill(*batch.args(), topk=topk, sorted=sorted, ids=ids)
    assert out.dtype == np.int32 and out.shape == expected.shape
    assert_rows_equal(out, expected, "vs the reference")


def row_scores(batch, i) -> np.ndarray:
    """float64 reference scores of row i's keys, by position j - begin."""
    one = (batch.q[i:i + 1], batch.k, batch.k_scale, batch.weights[i:i + 1], batch.ks[i:i + 1], batch.ke[i:i + 1])
    return ffi_dsa.reference_prefill_scores(*one)[0].scores


def begins(batch) -> np.ndarray:
    return key_ranges(batch.ks, batch.ke, batch.k.shape[0])[0]


def assert_absolute_is_relative_plus_begin(absolute, relative, batch) -> None:
    shifted = np.where(relative >= 0, relative + begins(batch)[:, None], -1)
    np.testing.assert_array_equal(absolute, shifted)


# ----------------------------------------------------------------------------------------------
# Ragged chunks against the reference
# ----------------------------------------------------------------------------------------------

# Three requests of different lengths in one call: the first with its last 300 tokens as queries
# (a later chunk), the second whole, the third with rows longer than K = 2048.
REQUESTS, QUERIES = [500, 130, 2100], [300, 130, 24]


@pytest.fixture(scope="module")
def ragged():
    batch = make_prefill_batch(REQUESTS, queries=QUERIES, seed=1, spare_keys=37)
    return batch, ffi_dsa.reference_prefill_scores(*batch.args())


@pytest.mark.parametrize("topk", [64, 2048])
@pytest.mark.parametrize("sorted_", ORDERS)
def test_ragged_requests_are_valid_top_k_in_both_id_forms(ragged, topk, sorted_):
    batch, rows = ragged
    assert (batch.ke - batch.ks).max() > 2048 and (batch.ke - batch.ks).min() < 64, "rows longer and shorter than K"
    relative = run_prefill(batch.args(), topk, sorted=sorted_)
    problems = ffi_dsa.check_prefill_topk(relative, *batch.args(), sorted=sorted_, rows=rows)
    assert problems == [], "\n".join(problems[:10])
    absolute = run_prefill(batch.args(), topk, sorted=sorted_, ids="absolute")
    assert_absolute_is_relative_plus_begin(absolute, relative, batch)


def test_reference_check_catches_a_wrong_answer(ragged):
    """The tolerance check is not vacuous: a swapped-in loser, a duplicate and a wrong -1 count fail."""
    batch, rows = ragged
    good = run_prefill(batch.args(), K)
    assert ffi_dsa.check_prefill_topk(good, *batch.args(), rows=rows) == []
    i = 450  # a row of the third request: 2077+ keys for 64 places
    worst = int(np.argsort(rows[i].scores)[0])
    for bad_row in (np.concatenate([[worst], good[i, 1:]]), np.concatenate([good[i, :1], good[i, :-1]]),
                    np.concatenate([good[i, :-1], [-1]])):
        bad = good.copy()
        bad[i] = np.sort(bad_row) if -1 not in bad_row else bad_row
        assert ffi_dsa.check_prefill_topk(bad, *batch.args(), rows=rows) != []


def test_matches_decode_on_the_same_keys_byte_for_byte():
    """Prefill reuses decode's scoring and selection: each row equals a decode row (on the same device)
    whose block table walks pages holding the row's keys, on random data (not only within the
    tolerance)."""
    batch = make_prefill_batch([300, 77, 200], queries=[100, 77, 9], seed=2)
    begin, count = key_ranges(batch.ks, batch.ke, batch.k.shape[0])
    pages, table, first_id = _paged_copy(batch, begin)
    decode_args = on_device((batch.q, pages, batch.weights, count.astype(np.int32), table))
    for sorted_ in (False, True):
        decode = poisoned((batch.rows, K), _DEVICE["name"])
        ffi_dsa.call(*decode_args, decode, sorted=sorted_)
        decode = decode.cpu().numpy()
        expected = np.where(decode >= 0, decode - first_id[:, None], -1)
        np.testing.assert_array_equal(run_prefill(batch.args(), sorted=sorted_), expected)


def _paged_copy(batch, begin):
    """The keys from each distinct row start on, copied into packed pages (fp8 bytes and scales as
    they are); a row's block table walks its start's pages. Returns (k_cache, block_table, the id of
    each row's first key)."""
    num_keys = batch.k.shape[0]
    starts = np.unique(begin)
    runs, first_page = [], {}
    for s in starts:
        tokens = num_keys - s
        n_pages = (tokens + PAGE_TOKENS - 1) // PAGE_TOKENS
        raw = np.zeros((n_pages, PAGE_BYTES), np.uint8)
        fp8 = np.zeros((n_pages * PAGE_TOKENS, HEAD_DIM), np.uint8)
        fp8[:tokens] = batch.k[s:]
        scale = np.ones(n_pages * PAGE_TOKENS, "<f4")
        scale[:tokens] = batch.k_scale[s:]
        raw[:, :PAGE_FP8_BYTES] = fp8.reshape(n_pages, -1)
        raw[:, PAGE_FP8_BYTES:] = scale.view(np.uint8).reshape(n_pages, -1)
        first_page[int(s)] = sum(len(r) for r in runs)
        runs.append(raw)
    k_cache = np.concatenate(runs).view(np.int8).reshape(-1, PAGE_TOKENS, 1, PAGE_BYTES // PAGE_TOKENS)
    width = max(len(r) for r in runs)
    table = np.full((len(begin), width), -1, np.int32)
    for i, s in enumerate(begin):
        n_pages = len(runs[list(starts).index(s)])
        table[i, :n_pages] = first_page[int(s)] + np.arange(n_pages)
    first_id = np.array([first_page[int(s)] * PAGE_TOKENS for s in begin], np.int64)
    return k_cache, table, first_id


# ----------------------------------------------------------------------------------------------
# Exact data: ties, 0.0 plateaus, each CPU variant, 32 heads
# ----------------------------------------------------------------------------------------------

def _tie_heavy(requests, queries=None, seed=3, heads=64):
    """Scores are small integers (q, k in {0, 1} on 2 dims, unit weights): thousands of ties and a
    0.0 plateau (every key orthogonal to a head scores 0)."""
    return make_exact_prefill_batch(requests, queries=queries, seed=seed, heads=heads, q_values=(0, 1),
                                    k_values=(0, 1), w_values=(1,), active_dims=2)


@pytest.mark.parametrize("ids", IDS)
@pytest.mark.parametrize("sorted_", ORDERS)
@pytest.mark.parametrize("topk", [16, 256])
def test_ties_and_zero_plateaus_exactly(topk, sorted_, ids):
    batch = _tie_heavy([700, 300, 40], queries=[60, 300, 40])
    out = run_prefill(batch.args(), topk, sorted=sorted_, ids=ids)
    assert_exact(out, batch, topk, sorted=sorted_, ids=ids)


@pytest.mark.parametrize("topk", [16, 256])
def test_ties_at_the_cut_go_to_the_smaller_position(topk):
    """The rule itself, independently of the reference: every key above the K-th score, then the
    tied keys of smallest position, by ascending position."""
    batch = _tie_heavy([700, 300], queries=[20, 20])
    out = run_prefill(batch.args(), topk)
    checked = 0
    for i in range(batch.rows):
        scores = row_scores(batch, i)
        ranked = np.sort(scores)[::-1]
        if len(scores) <= topk or ranked[topk] != ranked[topk - 1]:
            continue
        cut = ranked[topk - 1]
        above = np.nonzero(scores > cut)[0]
        tied = np.nonzero(scores == cut)[0][: topk - len(above)]
        assert out[i].tolist() == np.sort(np.concatenate([above, tied])).tolist()
        checked += 1
    assert checked >= 30, "the data must put ties across the K-th place"


def test_zero_plateau_is_taken_by_position():
    """Most keys score exactly 0.0 (relu of negative logits, and zero keys): after the few positive
    keys, the zeros are taken by ascending position, in both orders."""
    batch = make_exact_prefill_batch([200], queries=[1], seed=4, q_values=(1,), w_values=(1,))
    batch.k[:] = fp8_bytes(np.full((200, HEAD_DIM), -1.0))      # every logit negative: score 0
    winners = [150, 7, 99]
    for units, j in enumerate(winners, start=1):
        key = np.zeros(HEAD_DIM, np.float32)
        key[:units] = 1.0
        batch.k[j] = fp8_bytes(key)
    assert (row_scores(batch, 0) == 0).sum() == 197
    zeros = [j for j in range(200) if j not in winners][:7]
    assert run_prefill(batch.args(), 10, sorted=True)[0].tolist() == winners[::-1] + zeros
    assert run_prefill(batch.args(), 10)[0].tolist() == sorted(winners + zeros)


@pytest.mark.parametrize("weight_sign", [1.0, -1.0])
def test_negative_and_positive_zero_tie(weight_sign):
    """Zero keys with scale -1 give logits -0.0 (relu keeps -0.0), with scale +1 give +0.0; they are
    one score, so position decides."""
    batch = make_exact_prefill_batch([64], queries=[1], seed=5, q_values=(1, 2), w_values=(weight_sign,))
    batch.k[:] = 0
    batch.k_scale[:] = np.where(np.arange(64) % 2, -1.0, 1.0).astype(np.float32)
    for units, j in enumerate([40, 3, 57], start=1):
        key = np.zeros(HEAD_DIM, np.float32)
        key[:units] = 1.0
        batch.k[j], batch.k_scale[j] = fp8_bytes(key), 1.0
    zeros = [j for j in range(64) if j not in (40, 3, 57)]
    expected = [57, 3, 40] + zeros[:7] if weight_sign > 0 else zeros[:10]
    assert run_prefill(batch.args(), 10, sorted=True)[0].tolist() == expected
    out = run_prefill(batch.args(), 10)
    assert out[0].tolist() == sorted(expected)
    assert_exact(out, batch, 10)


@pytest.mark.parametrize("heads", [64, NUM_HEADS_NARROW])
def test_every_cpu_kernel_gives_the_reference_bytes(heads):
    """Each scoring variant (decode's, run on staged key blocks) on rows whose ends fall anywhere in
    a 64-key block and in a variant's register block, including the last keys of k."""
    batch = make_exact_prefill_batch([131, 70], queries=[40, 70], seed=6, heads=heads)
    previous = ffi_dsa.set_cpu_kernel("auto")
    try:
        for kernel in ffi_dsa.cpu_kernels():
            ffi_dsa.set_cpu_kernel(kernel)
            for sorted_ in (False, True):
                assert_exact(run_prefill(batch.args(), 16, sorted=sorted_), batch, 16, sorted=sorted_)
    finally:
        ffi_dsa.set_cpu_kernel(previous)


# ----------------------------------------------------------------------------------------------
# Short, empty and clamped rows; keys a row must not see
# ----------------------------------------------------------------------------------------------

def test_rows_shorter_than_k_and_empty_rows():
    batch = make_prefill_batch([5, 1, 40], seed=7)   # every row is shorter than K
    batch.ke[3] = batch.ks[3]                        # ks == ke: an empty row
    out = run_prefill(batch.args(), K)
    count = batch.ke - batch.ks
    for i in range(batch.rows):
        assert out[i].tolist() == list(range(count[i])) + [-1] * (K - count[i])
    assert_absolute_is_relative_plus_begin(run_prefill(batch.args(), K, ids="absolute"), out, batch)
    assert (run_prefill(batch.args(), K, ids="absolute", sorted=True)[3] == -1).all()


@pytest.mark.parametrize("sorted_", ORDERS)
def test_a_row_longer_than_one_ordering_pass(sorted_):
    """One row of 200,000 keys with exact scores: the CUDA kernel puts a row's ids in position order
    193,536 positions a pass (kBitmapPositions), so this row's ids come from two passes; they must be
    the reference's, byte for byte, in either order."""
    batch = make_exact_prefill_batch([200_000], queries=[1], seed=41)
    out = run_prefill(batch.args(), 2048, sorted=sorted_)
    assert_exact(out, batch, 2048, sorted=sorted_)
    if not sorted_:
        assert out[0, -1] >= 193_536, "the chosen ids should reach the second pass"


def test_empty_chunk_no_keys_and_k_zero():
    batch = make_prefill_batch([3, 4], seed=8)
    q, k, scale, w, ks, ke = batch.args()
    out = poisoned_np((0, K))
    ffi_dsa.prefill_call(q[:0], k, scale, w[:0], ks[:0], ke[:0], out)   # M = 0: nothing to write
    assert ffi_dsa.prefill_topk_indexer(q, k, scale, w, ks, ke, topk=0).shape == (batch.rows, 0)
    no_keys = run_prefill((q, k[:0], scale[:0], w, ks, ke))                       # N = 0: every row empty
    assert (no_keys == -1).all()


def _out_of_range(batch):
    """ks / ke entries the kernels clamp, in rows of a 3-request chunk; and the same rows clamped by
    hand (empty rows as ks == ke == 0)."""
    n = batch.k.shape[0]
    ks, ke = batch.ks.copy(), batch.ke.copy()
    ks[2] = -5              # request 0 starts at 0: the same row
    ke[100] = n + 100       # cut to N: the row runs over the later requests' keys
    ks[150], ke[150] = 60, 50       # ks > ke: empty
    ks[151], ke[151] = n + 3, n + 9  # starts past N: empty
    ke[152] = -4            # empty
    fixed_ks, fixed_ke = np.maximum(ks, 0), np.minimum(ke, n)
    empty = fixed_ks >= fixed_ke
    fixed_ks[empty], fixed_ke[empty] = 0, 0
    return (ks, ke), (fixed_ks.astype(np.int32), fixed_ke.astype(np.int32))


@pytest.mark.parametrize("ids", IDS)
def test_device_only_values_are_clamped(ids):
    """ke > N is cut to N, ks < 0 counts as 0 (ids count from 0), ks >= ke is an empty row."""
    batch = make_exact_prefill_batch([100, 60, 40], seed=9)
    (ks, ke), (fixed_ks, fixed_ke) = _out_of_range(batch)
    q, k, scale, w = batch.args()[:4]
    out = run_prefill((q, k, scale, w, ks, ke), ids=ids)
    np.testing.assert_array_equal(out, run_prefill((q, k, scale, w, fixed_ks, fixed_ke), ids=ids))
    assert (out[150:153] == -1).all() and (out[100] >= 0).all()
    batch.ks, batch.ke = ks, ke
    assert_exact(out, batch, ids=ids)


@pytest.mark.parametrize("which,value,message", [
    ("ks", -3, "ks[7] = -3 is negative"),
    ("ke", 9000, "ke[7] = 9000 exceeds N = 200"),
    ("ks", 150, "ks[7] = 150 is greater than ke[7] = 8"),
])
def test_validate_raises_naming_the_entry_and_writes_nothing(which, value, message):
    batch = make_prefill_batch([100, 100], seed=10)
    getattr(batch, which)[7] = value
    out = poisoned_np((batch.rows, K))
    with pytest.raises(ValueError, match=re.escape(message)):
        ffi_dsa.prefill_call(*batch.args(), out, validate=True)
    assert (out == SENTINEL).all()
    with pytest.raises(ValueError, match=re.escape(message)):
        ffi_dsa.prefill_topk_indexer(*batch.args(), topk=K, validate=True)
    run_prefill(batch.args())  # without validate the kernel clamps


def test_validate_accepts_valid_chunks_and_empty_rows():
    batch = make_prefill_batch([100, 3], seed=11)
    batch.ks[5] = batch.ke[5]
    np.testing.assert_array_equal(run_prefill(batch.args(), validate=True), run_prefill(batch.args()))
    ffi_dsa.validate_prefill(batch.k, batch.ks, batch.ke)


def test_keys_outside_a_row_never_reach_it():
    """Keys a row does not see (its request's later tokens, other requests' keys, spare keys past
    every request) are made to score far above everything: no row may pick one, and rows that see
    them must rank them first."""
    batch = make_exact_prefill_batch([90, 70], seed=12, spare_keys=20, q_values=(1, 2), w_values=(1, 2))
    clean = run_prefill(batch.args(), 8, sorted=True)
    huge = [44, 89, 90, 159, 165, 179]   # mid-request, each request's last key, its first, spare keys
    batch.k[huge] = fp8_bytes(np.full((len(huge), HEAD_DIM), 448.0))
    batch.k_scale[huge] = 1e30
    out = run_prefill(batch.args(), 8, sorted=True, ids="absolute")
    begin = begins(batch)
    for i in range(batch.rows):
        seen = [j for j in huge if batch.ks[i] <= j < batch.ke[i]]
        assert out[i, :len(seen)].tolist() == seen, f"row {i} must rank the huge keys it sees first"
        if not seen:
            assert out[i].tolist() == [j + begin[i] if j >= 0 else -1 for j in clean[i]]
    assert_exact(out, batch, 8, sorted=True, ids="absolute")


# ----------------------------------------------------------------------------------------------
# NaN and infinities
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("source", ["k_byte_0x7f", "k_byte_0xff", "k_scale"])
def test_nan_keys_are_never_chosen_over_numbers(source):
    batch = make_exact_prefill_batch([300], queries=[3], seed=13)
    best = np.argsort(-row_scores(batch, 2), kind="stable")[:5]
    if source == "k_scale":
        batch.k_scale[best] = np.nan
    else:
        batch.k[best, 17] = int(source[-4:], 16)
    assert np.isnan(row_scores(batch, 2)[best]).all()
    for sorted_ in (False, True):
        out = run_prefill(batch.args(), 16, sorted=sorted_)
        assert not set(best.tolist()) & set(out[2].tolist())
        assert_exact(out, batch, 16, sorted=sorted_)


@pytest.mark.parametrize("source", ["k_byte", "k_scale"])
def test_nan_keys_fill_up_by_position_when_numbers_run_out(source):
    batch = make_exact_prefill_batch([100], queries=[1], seed=14)
    numbers = list(range(0, 100, 10))
    nan_keys = [j for j in range(100) if j not in numbers]
    if source == "k_scale":
        batch.k_scale[nan_keys] = np.nan
    else:
        batch.k[nan_keys, 5] = FP8_NAN_BYTES[0]
    out = run_prefill(batch.args(), 40)
    assert out[0].tolist() == sorted(numbers + nan_keys[:30])
    out_sorted = run_prefill(batch.args(), 40, sorted=True)
    assert out_sorted[0, 10:].tolist() == nan_keys[:30], "NaNs last, by position"
    assert_exact(out_sorted, batch, 40, sorted=True)


@pytest.mark.parametrize("where", ["weights", "q_byte"])
def test_nan_in_a_rows_query_or_weight_makes_that_row_nan(where):
    """Every score of the row is NaN: it holds its first K positions; its neighbours are untouched."""
    batch = make_exact_prefill_batch([300, 200], queries=[3, 3], seed=15)
    clean = run_prefill(batch.args(), 32)
    if where == "weights":
        batch.weights[1, 5] = np.nan
    else:
        batch.q[1, 7, 100] = 0x7F
    for sorted_ in (False, True):
        out = run_prefill(batch.args(), 32, sorted=sorted_, ids="absolute")
        assert out[1].tolist() == list(range(32))
        assert_exact(out, batch, 32, sorted=sorted_, ids="absolute")
    np.testing.assert_array_equal(np.delete(run_prefill(batch.args(), 32), 1, axis=0), np.delete(clean, 1, axis=0))


def test_plus_inf_ranks_first_and_ties_by_position():
    batch = make_exact_prefill_batch([400], queries=[1], seed=16, q_values=(1, 2), w_values=(1, 2))
    batch.k[[150, 20]] = fp8_bytes(np.ones((2, HEAD_DIM)))
    batch.k_scale[[150, 20]] = np.inf
    assert np.isposinf(row_scores(batch, 0)[[20, 150]]).all()
    assert run_prefill(batch.args(), 2, sorted=True)[0].tolist() == [20, 150]
    for sorted_ in (False, True):
        assert_exact(run_prefill(batch.args(), 7, sorted=sorted_), batch, 7, sorted=sorted_)


def test_nan_ranks_below_minus_inf():
    batch = make_exact_prefill_batch([50], queries=[1], seed=17, q_values=(1, 2), w_values=(-1, -2))
    minus_inf = [3, 20, 41]
    batch.k[minus_inf] = fp8_bytes(np.ones((3, HEAD_DIM)))
    batch.k_scale[minus_inf] = np.inf
    batch.k_scale[12] = np.nan
    scores = row_scores(batch, 0)
    assert np.isneginf(scores[minus_inf]).all() and np.isnan(scores[12])
    assert 12 not in run_prefill(batch.args(), 49)[0].tolist()
    out = run_prefill(batch.args(), 50, sorted=True)
    assert out[0, -4:].tolist() == minus_inf + [12]
    assert_exact(out, batch, 50, sorted=True)


# ----------------------------------------------------------------------------------------------
# Argument forms, threads and the key buffer's waves
# ----------------------------------------------------------------------------------------------

def test_fp8_views_and_frameworks_give_the_same_bytes():
    batch = make_prefill_batch([120, 50], seed=18)
    expected = run_prefill(batch.args())
    q, k, scale, w, ks, ke = batch.args()
    fp8 = ml_dtypes.float8_e4m3fn
    for qv, kv in ((q.view(fp8), k.view(fp8)), (q.view(np.int8), k.view(np.int8))):
        np.testing.assert_array_equal(run_prefill((qv, kv, scale, w, ks, ke)), expected)
    t = batch.to_torch()
    np.testing.assert_array_equal(run_prefill(t), expected)
    np.testing.assert_array_equal(run_prefill((t[0].view(torch.uint8), t[1].view(torch.int8), *t[2:])), expected)
    got = ffi_dsa.prefill_topk_indexer(*t, topk=K)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int32
    np.testing.assert_array_equal(got.numpy(), expected)
    got = ffi_dsa.prefill_topk_indexer(*batch.args(), topk=K)
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, expected)


def test_default_topk_is_2048():
    batch = make_prefill_batch([2100], queries=[2], seed=19)
    out = ffi_dsa.prefill_topk_indexer(*batch.args())
    assert out.shape == (2, 2048) and (out >= 0).all()


def test_threads_and_waves_give_the_same_bytes():
    """One request of 3000 keys prefilled whole scores more keys than one wave of the key buffer
    holds (prefill_cpu.h, kPrefillWaveKeys = 2^22): the call equals two calls on halves of the rows
    (one wave each) and a call on one thread."""
    batch = make_prefill_batch([3000], seed=20, heads=NUM_HEADS_NARROW)
    assert int((batch.ke - batch.ks).sum()) > 2**22
    whole = run_prefill(batch.args(), 32, sorted=True)
    q, k, scale, w, ks, ke = batch.args()
    halves = [run_prefill((q[r], k, scale, w[r], ks[r], ke[r]), 32, sorted=True)
              for r in (slice(0, 1500), slice(1500, 3000))]
    np.testing.assert_array_equal(whole, np.concatenate(halves))
    ffi_dsa.set_cpu_threads(1)
    try:
        np.testing.assert_array_equal(run_prefill((q[-300:], k, scale, w[-300:], ks[-300:], ke[-300:]), 32,
                                                  sorted=True), whole[-300:])
    finally:
        ffi_dsa.set_cpu_threads(0)


def test_causal_ranges():
    ks, ke = causal_ranges([3, 2], queries=[2, 5])
    assert ks.tolist() == [0, 0, 3, 3] and ke.tolist() == [2, 3, 4, 5]


# ----------------------------------------------------------------------------------------------
# Caller mistakes: named, nothing written
# ----------------------------------------------------------------------------------------------

M, N = 6, 200


def _good():
    batch = make_prefill_batch([N], queries=[M], seed=21)
    q, k, scale, w, ks, ke = batch.to_torch()
    return dict(q=q, k=k, k_scale=scale, weights=w, ks=ks, ke=ke, topk_indices=poisoned((M, K)))


def _noncontiguous(t):
    return t.transpose(0, 1).contiguous().transpose(0, 1)


BAD = {
    "q float32": ("q", lambda a: a["q"].float(), TypeError, "q must be float8_e4m3fn"),
    "k float32": ("k", lambda a: a["k"].float(), TypeError, "k must be float8_e4m3fn"),
    "k_scale float64": ("k_scale", lambda a: a["k_scale"].double(), TypeError, "k_scale must be float32"),
    "weights bfloat16": ("weights", lambda a: a["weights"].bfloat16(), TypeError, "weights must be float32"),
    "ks int64": ("ks", lambda a: a["ks"].long(), TypeError, "ks must be int32"),
    "ke uint8": ("ke", lambda a: a["ke"].to(torch.uint8), TypeError, "ke must be int32"),
    "out int64": ("topk_indices", lambda a: torch.full((M, K), SENTINEL, dtype=torch.int64), TypeError,
                  "topk_indices must be int32"),
    "q rank 4": ("q", lambda a: a["q"][:, None], ValueError, "q must have rank 3 [M, H, 128]"),
    "q 48 heads": ("q", lambda a: a["q"][:, :48].contiguous(), ValueError, "q dimension 1 (H, index heads)"),
    "q head dim 64": ("q", lambda a: a["q"][..., :64].contiguous(), ValueError, "q dimension 2 must be 128"),
    "k rank 3": ("k", lambda a: a["k"][None], ValueError, "k must have rank 2 [N, 128]"),
    "k head dim 64": ("k", lambda a: a["k"][:, :64].contiguous(), ValueError, "k dimension 1 must be 128"),
    "k_scale short": ("k_scale", lambda a: a["k_scale"][:-1], ValueError, "k_scale dimension 0 must be 200"),
    "k_scale rank 2": ("k_scale", lambda a: a["k_scale"][:, None], ValueError, "k_scale must have rank 1"),
    "weights rows": ("weights", lambda a: a["weights"][:-1], ValueError, "weights dimension 0 must be 6"),
    "weights heads": ("weights", lambda a: a["weights"][:, :32].contiguous(), ValueError,
                      "weights dimension 1 must be 64"),
    "ks long": ("ks", lambda a: torch.zeros(M + 1, dtype=torch.int32), ValueError, "ks dimension 0 must be 6"),
    "ke rank 2": ("ke", lambda a: a["ke"][:, None], ValueError, "ke must have rank 1 [M]"),
    "out rows": ("topk_indices", lambda a: poisoned((M + 1, K)), ValueError, "topk_indices dimension 0 must be 6"),
    "out rank 1": ("topk_indices", lambda a: poisoned((M * K,)), ValueError, "topk_indices must have rank 2"),
    "K 2049": ("topk_indices", lambda a: poisoned((M, 2049)), ValueError, "topk_indices has K=2049"),
    "k non-contiguous": ("k", lambda a: _noncontiguous(a["k"]), ValueError, "k must be contiguous"),
    "weights non-contiguous": ("weights", lambda a: _noncontiguous(a["weights"]), ValueError,
                               "weights must be contiguous"),
    "q None": ("q", lambda a: None, TypeError, "q must be a tensor"),
    "ks list": ("ks", lambda a: a["ks"].tolist(), TypeError, "ks must be a tensor"),
    "k_scale meta": ("k_scale", lambda a: a["k_scale"].to("meta"), ValueError, "k_scale is a torch meta tensor"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_argument_raises_naming_it_and_writes_nothing(case):
    which, make_bad, error, message = BAD[case]
    args = _good()
    args[which] = make_bad(args)
    with pytest.raises(error, match="^" + re.escape(message)):
        ffi_dsa.prefill_call(*args.values())
    out = args["topk_indices"]
    if isinstance(out, torch.Tensor) and out.device.type == "cpu":
        assert (out == SENTINEL).all(), "written before the error"


def test_the_good_arguments_run():
    run_prefill(tuple(_good().values())[:6])


def test_allocating_form_names_topk_and_ids():
    args = tuple(_good().values())[:6]
    with pytest.raises(ValueError, match=r"^topk must be <= 2048"):
        ffi_dsa.prefill_topk_indexer(*args, topk=4096)
    with pytest.raises(ValueError, match=r"^topk must be >= 0"):
        ffi_dsa.prefill_topk_indexer(*args, topk=-1)
    with pytest.raises(TypeError, match=r"^topk must be an int"):
        ffi_dsa.prefill_topk_indexer(*args, topk=2.5)
    for call in (lambda: ffi_dsa.prefill_topk_indexer(*args, ids="global"),
                 lambda: ffi_dsa.prefill_call(*args, poisoned((M, K)), ids="global")):
        with pytest.raises(ValueError, match=r"^ids must be 'relative'"):
            call()


def test_outputs_that_cannot_be_written_are_refused():
    batch = make_prefill_batch([N], queries=[M], seed=22)
    read_only = poisoned_np((M, K))
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match=r"^topk_indices is a read-only numpy array"):
        ffi_dsa.prefill_call(*batch.args(), read_only)
    jnp = pytest.importorskip("jax.numpy")
    with pytest.raises(TypeError, match=r"^topk_indices is a JAX array"):
        ffi_dsa.prefill_call(*batch.args(), jnp.zeros((M, K), jnp.int32))


def test_numpy_fp8_of_another_format_is_a_dtype_error():
    batch = make_prefill_batch([N], queries=[M], seed=23)
    q, k, *rest = batch.args()
    with pytest.raises(TypeError, match=r"^k must be float8_e4m3fn"):
        ffi_dsa.prefill_call(q, k.view(ml_dtypes.float8_e5m2), *rest, poisoned_np((M, K)))
    with pytest.raises(TypeError, match=r"^k_scale must be not a float8 type"):
        ffi_dsa.prefill_call(q, k, rest[0].astype(ml_dtypes.float8_e4m3fn), *rest[1:], poisoned_np((M, K)))


# ----------------------------------------------------------------------------------------------
# Devices
# ----------------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_arguments_on_two_devices_are_refused_naming_one():
    batch = make_prefill_batch([N], queries=[M], seed=25)
    args = batch.to_torch("cuda")
    on_cpu = batch.to_torch()
    out = poisoned((M, K))
    with pytest.raises(ValueError, match=r"^k is on device"):   # q on the CPU: the placement check
        ffi_dsa.prefill_call(on_cpu[0], args[1], *on_cpu[2:], out)
    assert (out == SENTINEL).all()
