"""The CUDA select's branches, each reached by a crafted score distribution (docs/contract.md §2).

Scores here are exact in any accumulation order: q and k are 1 in one dimension and 0 elsewhere,
every weight is 1, so a token's score is 64 x its scale (its key's only product), and the scales
carry at most 11 significant bits. So each selection is checked byte for byte against the float64
reference, on one CTA and on clusters (rows longer than one CTA's slice), against every
select-cluster cap, and in both orders, by the split path's select (SelectRowsKernel, on the bin
select of sm90_bin_select.cuh; a row of at most 8K keys on one 1024-thread CTA, unsorted, on its
register form of sm90_select_small.cuh, which hands a bin of more members than a short list back to
the former: the 8192-key rows below reach both; 512-thread CTAs take the former alone). The
distributions reach:
- a K-th bin of a few members (at most an eighth of the threads: ranked by all pairs at once), 64
  of them with copies of a key across the cut (ties by position);
- a K-th bin of more members (300 spread, or 201 bunched in one digit): split by a digit of the keys
  first, and ranked by all pairs where its members bunch in one digit;
- a band of 1800 near-equal keys around the K-th key: a bin of more members than the select lists
  (its search inside the bin);
- a quarter of the row in that band: that search over a bin of tens of thousands of keys;
- scores beyond FP16's range and below its smallest step (no format-bound bins may be assumed; the
  end bins take them all);
- thousands of copies of the K-th key, more than K takes: ties by position across CTAs (a bin of
  one value);
- NaN scores among the winners' last places (the NaN bin);
and on the fused path, where a row's N queries select side by side on groups of threads, the same
(the band of 300 members is more than a group of 128 or 256 threads) and a relu plateau. Random FP8 rows of every
length regime, whose sums on the device the reference need not reproduce, are held to the
tolerance rule.
"""

from __future__ import annotations

import numpy as np
import pytest

from ffi_dsa.contract import HEAD_DIM, PAGE_FP8_BYTES, PAGE_TOKENS
from ffi_dsa.workloads import make_batch

from ffi_dsa.cuda_options import using_cuda_options

from conftest import (DEFAULT_K, assert_exact, assert_valid_topk, fp8_bytes, page_bytes, run_dps,
                      run_under_every_cluster_cap)
from test_cuda_paths import _stamped, fused_batch_size, kernels_run, select_cta_sizes
from test_positions import to_slots

pytestmark = pytest.mark.cuda


def scored_batch(lens, scales_of_row, *, seed: int, queries: int | None = None, heads: int = 64):
    """Rows whose token t scores H x scales_of_row(b, n, rng)[t] exactly (scales rounded to FP16's
    11 significant bits, then kept as float32: FP16's range is not a limit). With N queries, query
    j of a row sees the same scores over its own prefix."""
    batch = make_batch(lens, seed=seed, scale_range=None, queries=queries, heads=heads)
    rng = np.random.default_rng(seed + 7)
    batch.q[...] = 0
    batch.q[..., 0] = fp8_bytes([1.0])[0]
    batch.weights[...] = 1.0
    pages = page_bytes(batch)
    num_pages = pages.shape[0]
    k = np.zeros((PAGE_TOKENS, HEAD_DIM), np.float32)  # every page's FP8 rows alike: 1 in dimension 0
    k[:, 0] = 1.0
    pages[:, :PAGE_FP8_BYTES] = fp8_bytes(k).reshape(1, -1)
    scales = np.ones((num_pages, PAGE_TOKENS), np.float32)
    lens = np.asarray(batch.seq_lens).reshape(len(batch.seq_lens), -1).max(axis=1)
    for b, n in enumerate(lens):
        values = np.asarray(scales_of_row(b, int(n), rng), np.float64)
        mantissa, exponent = np.frexp(values)
        values = np.ldexp(np.round(mantissa * 2048) / 2048, exponent).astype(np.float32)
        t = np.arange(int(n))
        scales[batch.block_table[b, t // PAGE_TOKENS], t % PAGE_TOKENS] = values
    pages[:, PAGE_FP8_BYTES:] = scales.astype("<f4").view(np.uint8)
    return batch


def spread(n, rng):
    return rng.uniform(0.01, 4.0, n)


def band(n, rng, width=1800, above=1000):
    """`above` keys above a band of `width` near-equal keys (one FP16 bin), the rest below."""
    v = rng.uniform(0.01, 0.5, n)
    order = rng.permutation(n)
    high, inside = order[:above], order[above:above + width]
    v[high] = rng.uniform(4.0, 8.0, len(high))
    v[inside] = 1.0 + rng.uniform(0, 2.0 ** -8, len(inside))
    return v


def narrow_band(n, rng):
    return band(n, rng, width=300, above=1900)  # a bin of more members than a 128- or 256-thread group


def wide_band(n, rng):
    return band(n, rng, width=n // 4)  # more keys in one bin than a gathered list holds


def huge(n, rng):
    return rng.uniform(1e5, 1e7, n)  # every score rounds to FP16's infinity


def tiny(n, rng):
    return rng.uniform(1e-12, 1e-10, n)  # every score rounds to FP16's zero


def copies(n, rng):
    """1000 keys above 6000 copies of one key (K takes 1048 of them, the first by position)."""
    v = rng.uniform(0.01, 0.5, n)
    order = rng.permutation(n)
    v[order[:1000]] = rng.uniform(4.0, 8.0, 1000)
    v[order[1000:7000]] = 1.0
    return v


def bunched(n, rng):
    """2000 keys high, then in one bin 200 copies of a key and one key above them (K takes 47 of the
    copies): more members than a short list (1024 threads / 8), bunched in one digit of the bin's
    range (every member ranked)."""
    v = rng.uniform(0.01, 0.5, n)
    order = rng.permutation(n)
    v[order[:2000]] = rng.uniform(4.0, 8.0, 2000)
    v[order[2000:2200]] = 1.0
    v[order[2200]] = 1.0 + 2.0 ** -7
    return v


def small_bunch(n, rng):
    """2030 keys high, then in one bin 64 members (a short list for 512 threads or more, not for a
    group of 256 or 128): 17 keys above 30 copies of a key and 17 below them (K takes the 17 and the
    first copy by position)."""
    v = rng.uniform(0.01, 0.5, n)
    order = rng.permutation(n)
    v[order[:2030]] = rng.uniform(4.0, 8.0, 2030)
    step = 2.0 ** -10  # one step of the 11 significant bits kept; a bin in [1, 2) spans 16
    v[order[2030:2047]] = 1.0 + 3 * step
    v[order[2047:2077]] = 1.0 + 2 * step
    v[order[2077:2094]] = 1.0
    return v


def nans_last(n, rng):
    """Fewer numbers than K: every number, then NaNs by position (a NaN scale makes a NaN score)."""
    v = np.full(n, np.nan)
    v[rng.permutation(n)[:DEFAULT_K // 2]] = rng.uniform(0.5, 2.0, DEFAULT_K // 2)
    return v


def plateau(n, rng):
    """A relu plateau: 90% of the row scores exactly 0 (the zero bin's ties by position)."""
    return np.where(rng.random(n) < 0.9, 0.0, rng.uniform(0.5, 4.0, n))


DISTRIBUTIONS = {"spread": spread, "band": band, "wide_band": wide_band, "huge": huge, "tiny": tiny, "copies": copies,
                 "bunched": bunched, "nans_last": nans_last, "small_bunch": small_bunch, "narrow_band": narrow_band}


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
@pytest.mark.parametrize("name", list(DISTRIBUTIONS))
def test_every_branch_one_cta_and_clusters_exact(name, sorted_):
    """Rows on one CTA (8K, 16K) and on clusters (40K, 130K): exact, and the same bytes under
    every cluster cap."""
    lens = [8192, 16384, 40000, 130000, 9000]
    fn = DISTRIBUTIONS[name]
    batch = scored_batch(lens, lambda b, n, rng: fn(n, rng), seed=700 + list(DISTRIBUTIONS).index(name))
    out = run_under_every_cluster_cap(batch.to_torch("cuda"), sorted=sorted_, name=name)
    assert_exact(out, batch, sorted=sorted_, name=name)


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
def test_cluster_rows_of_at_most_k_candidates_take_every_one(sorted_):
    """Rows on clusters whose pages are mostly invalid: K - 192, K and K + 64 candidates spread over
    every CTA's slice. The first two take every candidate (the threshold is the NaN bin, every NaN
    needed), the third ranks them; exact, and the same bytes under every cluster cap."""
    lens = [40000, 130000, 70000]
    batch = scored_batch(lens, lambda b, n, rng: spread(n, rng), seed=770)
    rng = np.random.default_rng(771)
    for b, (n, keep) in enumerate(zip(lens, (DEFAULT_K // PAGE_TOKENS - 3, DEFAULT_K // PAGE_TOKENS,
                                             DEFAULT_K // PAGE_TOKENS + 1))):
        pages = -(-n // PAGE_TOKENS)
        valid = rng.choice(pages - 1, keep, replace=False)  # whole pages: not the row's partial last one
        invalid = np.setdiff1d(np.arange(pages), valid)
        batch.block_table[b, invalid] = -1
    out = run_under_every_cluster_cap(batch.to_torch("cuda"), sorted=sorted_, name="at most K candidates")
    assert ((out != -1).sum(axis=1) == [DEFAULT_K - 3 * PAGE_TOKENS, DEFAULT_K, DEFAULT_K]).all()
    assert_exact(out, batch, sorted=sorted_, name="at most K candidates")


@pytest.mark.parametrize("name", list(DISTRIBUTIONS))
def test_every_branch_on_512_thread_ctas_exact(name):
    """The same rows on one CTA of 512 threads each (the schedule's CTAs past one wave of query
    rows, forced here), the keys staged or read from L2; exact, unsorted and sorted. Every row is
    long enough for each distribution's crafted keys (bunched places 2201)."""
    lens = [8192, 5000, 2300, 8193, 12000]
    fn = DISTRIBUTIONS[name]
    batch = scored_batch(lens, lambda b, n, rng: fn(n, rng), seed=760 + list(DISTRIBUTIONS).index(name))
    args = batch.to_torch("cuda")
    options = {"fused": False, "max_select_cluster": 1, "select_threads": 512}
    assert select_cta_sizes(args, **options) == {512}
    with using_cuda_options(**options):
        for sorted_ in (False, True):
            assert_exact(run_dps(args, sorted=sorted_), batch, sorted=sorted_, name=f"{name} on 512 threads")


@pytest.mark.parametrize("name", ["band", "copies", "huge"])
def test_two_queries_per_row_exact(name):
    """N = 2: each query row its own select (query 0 sees one token less)."""
    fn = DISTRIBUTIONS[name]
    batch = scored_batch([12000, 50000], lambda b, n, rng: fn(n, rng), seed=720, queries=2)
    assert_exact(run_dps(batch.to_torch("cuda")), batch, name=name)


REGIME_LENS = [0, 1, 2047, 2048, 2049, 5000, 8192, 8193, 30000, 70000, 131072]  # none, around K, one CTA, clusters


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
def test_every_regime_exact_in_both_id_kinds(sorted_):
    """Rows of every regime (one CTA, clusters, lengths around K) and a relu plateau (90% of a row
    scores exactly 0), both id kinds, on the split path: exact scores give the reference's bytes."""
    for batch in (scored_batch(REGIME_LENS, lambda b, n, rng: spread(n, rng), seed=741),
                  scored_batch([9000, 40000, 3000], lambda b, n, rng: plateau(n, rng), seed=742)):
        args = batch.to_torch("cuda")
        for ids in ("slots", "positions"):
            with using_cuda_options(fused=False):
                out = run_dps(args, sorted=sorted_, ids=ids)
            assert_exact(out, batch, sorted=sorted_, ids=ids, name=f"ids={ids}")


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
def test_every_regime_on_random_rows(sorted_):
    """The same regimes on random FP8 rows, whose device sums the reference need not reproduce: the
    tolerance rule holds, and the positions name the slots' tokens in the slots' order."""
    batch = make_batch(REGIME_LENS, seed=741)
    args = batch.to_torch("cuda")
    with using_cuda_options(fused=False):
        slots = run_dps(args, sorted=sorted_)
        positions = run_dps(args, sorted=sorted_, ids="positions")
    assert_valid_topk(slots, batch, sorted=sorted_)
    np.testing.assert_array_equal(to_slots(positions, batch.block_table, 1), slots)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "split"])
def test_stamps_count_the_threshold_bins_keys(fused):
    """stamp_select's bin_keys: the row's keys in its threshold bin, in the slot of every select
    (the fused path's rows; the split path's CTA of a short row and every CTA of a long row's
    cluster). small_bunch puts exactly 64 keys there; the stamps change no byte."""
    lens = [6000] * fused_batch_size() if fused else [8192, 40000]
    batch = scored_batch(lens, lambda b, n, rng: small_bunch(n, rng), seed=790)
    args = batch.to_torch("cuda")
    rows = len(lens)
    with using_cuda_options(fused=fused):
        assert ("FusedRowsKernel" in kernels_run(args)) == fused
        out, stamps = _stamped(args, 16 * rows)
    assert_exact(out, batch, name="small_bunch stamped")
    stamped = {slot: s.bin_keys for slot, s in enumerate(stamps) if s is not None}
    expected_slots = set(range(rows)) | ({rows + 1} if not fused else set())  # the 40K row's rank 1 too
    assert expected_slots <= stamped.keys(), sorted(stamped)
    assert set(stamped.values()) == {64}, stamped


# The fused path's forms: (N, H, longest row). N x the table's width stays within the fused cap
# (16K keys a CTA); N > 1 runs the queries' selects side by side on groups of 256 or 128 threads.
FUSED_FORMS = {"N1": (1, 64, 6000), "N2": (2, 64, 5000), "N3_H32": (3, 32, 4500), "N4_H32": (4, 32, 3500),
               "N4_H64": (4, 64, 3500)}
FUSED_DISTRIBUTIONS = {**DISTRIBUTIONS, "plateau": plateau}


@pytest.mark.parametrize("form", list(FUSED_FORMS))
@pytest.mark.parametrize("name", list(FUSED_DISTRIBUTIONS))
def test_fused_path_exact(name, form):
    """The fused path (each row's CTA selects its queries from shared memory) on the same
    distributions, every N: exact in both orders. The bands reach the all-pairs rank with more
    members than a group has threads, and the search inside the bin on 128-thread groups (two digits
    a thread)."""
    queries, heads, longest = FUSED_FORMS[form]
    fn = FUSED_DISTRIBUTIONS[name]
    seed = 730 + list(FUSED_DISTRIBUTIONS).index(name)
    lens = np.random.default_rng(seed).integers(longest * 3 // 4, longest + 1, size=fused_batch_size())
    batch = scored_batch(lens, lambda b, n, rng: fn(n, rng), seed=seed, queries=None if queries == 1 else queries,
                         heads=heads)
    args = batch.to_torch("cuda")
    assert kernels_run(args) == {"FusedRowsKernel"}
    for sorted_ in (False, True):
        assert_exact(run_dps(args, sorted=sorted_), batch, sorted=sorted_, name=f"{name} {form} sorted={sorted_}")


@pytest.mark.parametrize("form", [f for f in FUSED_FORMS if FUSED_FORMS[f][0] > 1])
def test_fused_unscored_queries_beside_selects(form):
    """Per-query lengths on the fused path: in one row, queries of at most K tokens (0, 1, a page's
    edges, K - 1, K: written without scores, side by side by their own group of threads) beside
    queries that select (K + 1 and longer), in every mix, a row of each kind alone too; exact in
    both orders."""
    queries, heads, longest = FUSED_FORMS[form]
    rng = np.random.default_rng(760 + 10 * queries + heads)
    lens = rng.choice([0, 1, 63, 64, 65, 2047, 2048, 2049, 3000, longest], size=(fused_batch_size(), queries))
    lens[0], lens[1], lens[2] = 2048, longest, [0] + [longest] * (queries - 1)
    batch = scored_batch(lens, lambda b, n, rng: spread(n, rng), seed=761 + queries, queries=queries, heads=heads)
    args = batch.to_torch("cuda")
    assert kernels_run(args) == {"FusedRowsKernel"}
    for sorted_ in (False, True):
        assert_exact(run_dps(args, sorted=sorted_), batch, sorted=sorted_, name=f"{form} sorted={sorted_}")
