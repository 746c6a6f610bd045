"""Both CUDA paths, every select cluster size and both launch orders on the same shapes
(ffi_dsa.cuda_options, set in-process): each choice must give the same bytes, and a test first
checks that the option really changes which kernels run, so the comparison cannot pass vacuously.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from ffi_dsa.cuda_options import cuda_options, score_stamps, select_stamps, set_cuda_options, using_cuda_options
from ffi_dsa.decode_reference import visible_lengths
from ffi_dsa.workloads import make_batch

from conftest import assert_valid_topk, make_exact_batch, run_dps, run_under_every_cluster_cap
from mtp_batches import Form, mtp_batch

pytestmark = pytest.mark.cuda

DEFAULTS = {"fused": True, "pdl": True, "max_select_cluster": 16, "select_floor": False, "stamp_select": False,
            "select_threads": 0}


@pytest.fixture(autouse=True)
def default_options():
    """Every test starts and ends with the production settings."""
    set_cuda_options(**DEFAULTS)
    yield
    set_cuda_options(**DEFAULTS)


def fused_batch_size() -> int:
    """Rows enough (>= 0.7 x the SMs) for the fused path when the table is <= 16K tokens wide."""
    return max(128, torch.cuda.get_device_properties(0).multi_processor_count)


def kernels_run(args, **options) -> set[str]:
    """Names of the ffi_dsa kernels one call launches under `options`."""
    with using_cuda_options(**options), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        run_dps(args)
        torch.cuda.synchronize()
    names = {e.name for e in p.events() if "ffi_dsa" in e.name}
    return {kernel for kernel in ("FusedRowsKernel", "ScorePagesKernel", "SelectRowsKernel")
            if any(f"::{kernel}" in name for name in names)}


def select_kernels(args, **options) -> set[tuple[int, bool]]:
    """The select kernels one call launches: (CTA size, longest first), SelectRowsKernel's template
    arguments."""
    with using_cuda_options(**options), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        run_dps(args)
        torch.cuda.synchronize()
    found = (re.search(r"::SelectRowsKernel<(\d+), (true|false)>", e.name) for e in p.events())
    return {(int(m.group(1)), m.group(2) == "true") for m in found if m}


def select_cta_sizes(args, **options) -> set[int]:
    """The CTA sizes (SelectRowsKernel's first template argument) of the select kernels one call launches."""
    return {threads for threads, _ in select_kernels(args, **options)}


def test_the_fused_option_picks_the_kernels():
    lens = np.full(fused_batch_size(), 5000)
    args = make_batch(lens, seed=300).to_torch("cuda")
    assert kernels_run(args) == {"FusedRowsKernel"}
    assert kernels_run(args, fused=False) == {"ScorePagesKernel", "SelectRowsKernel"}


def _edge_batch(seed: int):
    """A fused-path batch of the contract's edge lengths up to 16K, invalid page ids and NaN tokens."""
    lens = np.random.default_rng(seed).integers(0, 16385, size=fused_batch_size())
    lens[:8] = [0, 1, 2, 2047, 2048, 2049, 16384, 4097]
    batch = make_batch(lens, seed=seed)
    batch.block_table[3, 5] = -1
    batch.block_table[6, 0] = batch.k_cache.shape[0]
    batch.weights[7, 3] = np.nan
    return batch


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
@pytest.mark.parametrize("make", [
    pytest.param(lambda: _edge_batch(301), id="random_edges"),
    pytest.param(lambda: make_exact_batch(np.random.default_rng(302).integers(2000, 9000, size=fused_batch_size()),
                                          seed=302, q_values=(0, 1), k_values=(0, 1), w_values=(1,), active_dims=3),
                 id="exact_ties"),
    pytest.param(lambda: mtp_batch(Form(2, 64), np.full(fused_batch_size(), 3000), seed=303), id="N2_H64"),
    pytest.param(lambda: mtp_batch(Form(4, 32, per_query_lens=True), np.full(fused_batch_size(), 2500), seed=304),
                 id="N4_H32"),
])
def test_split_path_gives_the_fused_bytes(make, sorted_):
    batch = make()
    args = batch.to_torch("cuda")
    assert kernels_run(args) == {"FusedRowsKernel"}  # the shapes take the fused path by default
    fused = run_dps(args, sorted=sorted_)
    with using_cuda_options(fused=False):
        split = run_dps(args, sorted=sorted_)
    np.testing.assert_array_equal(split, fused)
    if batch.q.ndim == 3:
        assert_valid_topk(fused, batch, sorted=sorted_)


def _stamped(args, slots: int, sorted_: bool = False) -> tuple[np.ndarray, list]:
    """One call with stamp_select on, its output and the stamps of `slots` slots; the stamps are
    cleared before (nothing left from earlier calls) and by the read."""
    select_stamps(0, slots, clear=True)  # allocates the buffer, forgets earlier calls
    assert select_stamps(0, slots) == [None] * slots
    with using_cuda_options(stamp_select=True):
        out = run_dps(args, sorted=sorted_)
    stamps = select_stamps(0, slots)
    assert select_stamps(0, slots) == [None] * slots  # cleared by the read
    return out, stamps


def test_select_stamps_past_the_buffer_are_none_and_negative_slots_an_error():
    select_stamps(0, 1)  # the buffer exists
    assert select_stamps(0, 100_000) == [None] * 100_000  # nothing stamped, the tail past the buffer too
    with pytest.raises(ValueError, match="slots must be >= 0, got -1"):
        select_stamps(0, -1)


def _assert_ordered(stamp, fused: bool) -> None:
    assert stamp.done_ns >= stamp.start_ns > 0
    # the fused kernel's CTA starts on its row's pages before its select may start; the split path
    # has no such stamp
    assert (0 < stamp.score_ns <= stamp.start_ns) if fused else stamp.score_ns == 0, stamp
    marks = [stamp.start, stamp.binned, stamp.threshold, stamp.members, stamp.resolved, stamp.done]
    assert all(m > 0 for m in marks) and marks == sorted(marks), stamp
    assert all(v >= 0 for v in stamp.phases().values())


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "split"])
@pytest.mark.parametrize("queries", [1, 2])
def test_select_stamps_time_every_select_and_change_no_byte(queries, fused):
    """stamp_select: every query row that needs scores gets one select's stamps (rank 0's slot), in
    phase order; a query row that needs none (<= K tokens) gets none; the outputs stay the same
    bytes; unstamped calls stamp nothing."""
    rows = fused_batch_size()
    lens = np.random.default_rng(306).integers(2500, 7000, size=rows)
    lens[:3] = [100, 2048, 2049]
    batch = mtp_batch(Form(queries, 64, per_query_lens=True), lens, seed=306)
    args = batch.to_torch("cuda")
    with using_cuda_options(fused=fused):
        assert ("FusedRowsKernel" in kernels_run(args)) == fused
        want = run_dps(args)
        got, stamps = _stamped(args, rows * queries)
        np.testing.assert_array_equal(got, want)
        needs_scores = batch.seq_lens.reshape(-1) > 2048  # per query row, b * N + j
        assert needs_scores.any() and not needs_scores.all()
        assert [s is not None for s in stamps] == needs_scores.tolist()
        for stamp in stamps:
            if stamp is not None:
                _assert_ordered(stamp, fused)
        run_dps(args)
        assert select_stamps(0, rows * queries) == [None] * rows * queries  # off again: nothing stamped


@pytest.mark.parametrize("queries", [1, 4])
def test_score_stamps_time_every_scoring_cta_and_change_no_byte(queries):
    """stamp_select on the split path: every ScorePagesKernel CTA (one an SM here) stamps its start,
    and those with pages (all of them: more pages than SMs) every milestone, in order, from the
    kernel's stamped instance; the outputs stay the same bytes; the fused path and unstamped calls
    stamp no scoring CTA."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    lens = np.random.default_rng(307).integers(3000, 9000, size=24)
    lens[:2] = [100, 2049]
    batch = mtp_batch(Form(queries, 64, per_query_lens=True), lens, seed=307)
    args = batch.to_torch("cuda")
    slots = 1024
    with using_cuda_options(fused=False):
        want = run_dps(args)
        score_stamps(0, slots)  # allocates the buffer, forgets earlier calls
        with using_cuda_options(stamp_select=True):
            got = run_dps(args)
        stamps = score_stamps(0, slots)
        np.testing.assert_array_equal(got, want)
        started = [st for st in stamps if st is not None]
        assert len(started) == sms and all(st is not None for st in stamps[:sms])
        for st in started:
            assert st.has_pages, st
            marks = [st.start, st.waited, st.ranged, st.first_page, st.end]
            assert all(m > 0 for m in marks) and marks == sorted(marks), st
            assert st.start < st.q_ready <= st.end and st.end_ns >= st.start_ns > 0, st
            # thread 0's seq_lens and scan, then the first loads' thread (Q, page id, page issued:
            # the producer's after the range, or the first row's thread's inside it)
            assert st.waited <= st.lens <= st.scanned <= st.ranged, st
            assert st.waited < st.q_issued <= st.ids <= st.issued <= st.first_page, st
            assert 0 < st.l2_hit < 100_000, st
        assert score_stamps(0, slots) == [None] * slots  # cleared by the read
        run_dps(args)
        assert score_stamps(0, slots) == [None] * slots  # off again: nothing stamped
    with using_cuda_options(stamp_select=True):  # the fused path has no scoring kernel
        fused_batch = make_batch([5000] * fused_batch_size(), seed=308).to_torch("cuda")
        assert "FusedRowsKernel" in kernels_run(fused_batch)
        run_dps(fused_batch)
    assert score_stamps(0, slots) == [None] * slots


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
def test_select_stamps_of_a_cluster_every_rank(sorted_):
    """The split path's clusters: a row longer than one CTA's slice stamps the slot of each CTA of its
    cluster (rank r: slot r x query rows + row); a row one CTA selects stamps rank 0's alone."""
    batch = make_batch([70000, 20000, 5000, 1000], seed=307)
    args = batch.to_torch("cuda")
    rows = 4
    want = run_dps(args, sorted=sorted_)
    got, stamps = _stamped(args, 16 * rows, sorted_)
    np.testing.assert_array_equal(got, want)
    assert [stamps[r] is not None for r in range(rows)] == [True, True, True, sorted_]  # 1000 <= K: unscored unless sorted
    assert stamps[rows + 0] is not None and stamps[rows + 1] is not None  # rank 1 of the two long rows
    assert all(stamps[r * rows + 2] is None and stamps[r * rows + 3] is None for r in range(1, 16))
    for stamp in stamps:
        if stamp is not None:
            _assert_ordered(stamp, fused=False)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "split"])
def test_without_programmatic_launch_the_same_bytes(fused):
    batch = make_batch(np.random.default_rng(305).integers(0, 9000, size=fused_batch_size()), seed=305)
    args = batch.to_torch("cuda")
    with using_cuda_options(fused=fused):
        want = run_dps(args)
        with using_cuda_options(pdl=False):
            got = run_dps(args)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
def test_every_select_cluster_cap_gives_the_same_bytes(sorted_):
    """Rows long enough for 16-CTA clusters, selected with clusters capped at 1, 2, 4, 8 and 16."""
    batch = make_batch([131072, 70000, 20000, 2049], seed=306)
    out = run_under_every_cluster_cap(batch.to_torch("cuda"), sorted=sorted_)
    assert_valid_topk(out, batch, sorted=sorted_)


def test_both_select_cta_sizes_give_the_same_bytes_past_their_staged_keys():
    """Rows selected by one CTA each (clusters capped at 1), from short to longer than what a CTA of
    512 threads stages with two an SM (20K keys unsorted, 12K sorted on an H100: those read their
    keys from L2 on every pass), by CTAs of 1024 and of 512 threads: the same bytes, both orders."""
    lens = [32768, 24000, 20481, 20480, 12289, 12288, 9000, 8192, 2049, 2048, 300, 0]
    batch = make_batch(lens, seed=308)
    batch.block_table[2, 3] = -1
    batch.weights[4, 5] = np.nan
    args = batch.to_torch("cuda")
    with using_cuda_options(fused=False, max_select_cluster=1):
        for threads in (1024, 512):
            assert select_cta_sizes(args, select_threads=threads) == {threads}
        for sorted_ in (False, True):
            outs = {}
            for threads in (1024, 512):
                with using_cuda_options(select_threads=threads):
                    outs[threads] = run_dps(args, sorted=sorted_)
            np.testing.assert_array_equal(outs[512], outs[1024], err_msg=f"sorted={sorted_}")
            assert_valid_topk(outs[512], batch, sorted=sorted_)


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
def test_more_query_rows_than_sms_take_two_select_ctas_an_sm(sorted_):
    """N = 4 on the split path with more query rows than SMs: the schedule's select CTAs are of 512
    threads (two an SM); at most as many query rows as SMs (B = SMs // 4) keep 1024. Both give the
    bytes of 1024-thread CTAs."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for rows, want in ((sms // 4 + 1, 512), (sms // 4, 1024)):
        lens = np.random.default_rng(309 + rows).integers(2000, 8193, size=rows)
        batch = mtp_batch(Form(4, 64), lens, seed=309 + rows)
        args = batch.to_torch("cuda")
        with using_cuda_options(fused=False):
            assert select_cta_sizes(args) == {want}, f"{rows} rows of N = 4"
            planned = run_dps(args, sorted=sorted_)
            with using_cuda_options(select_threads=1024):
                wide = run_dps(args, sorted=sorted_)
        np.testing.assert_array_equal(planned, wide, err_msg=f"{rows} rows of N = 4")


def longest_first_batch(rows: int, *, seed: int, per_query_lens: bool) -> tuple:
    """N = 4 over `rows` query rows (more than the SMs, at most twice as many) with a table wider
    than a 512-thread CTA stages: lengths 0, 1, K - 1, K, K + 1, 32K, runs of equal lengths, and the
    rest of 2.5K-9K tokens, random (not exact) data, an invalid page and a NaN weight."""
    rng = np.random.default_rng(seed)
    batch_rows = rows // 4
    lens = rng.integers(2500, 9000, size=batch_rows)
    lens[:6] = [0, 1, 2047, 2048, 2049, 32768]
    lens[6:12] = 6000  # rows of one length: their order is the row's
    rng.shuffle(lens)
    batch = mtp_batch(Form(4, 64, per_query_lens=per_query_lens), lens, seed=seed, exact=False)
    longest = int(np.argmax(lens))
    batch.block_table[longest, 5] = -1
    batch.weights[3, 2, 7] = np.nan
    return batch, batch.to_torch("cuda")


@pytest.mark.parametrize("per_query_lens", [False, True], ids=["lensB", "lensBN"])
def test_long_rows_past_one_wave_run_longest_first(per_query_lens):
    """N = 4 with more query rows than SMs (at most twice as many) and rows longer than a 512-thread
    CTA stages: the schedule keeps 1024-thread CTAs and runs the rows longest first. Each order gives
    the bytes of 512-thread CTAs in grid order, and the tolerance rule holds."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = min(2 * sms, 288) // 4 * 4
    batch, args = longest_first_batch(rows, seed=320 + per_query_lens, per_query_lens=per_query_lens)
    with using_cuda_options(fused=False):
        assert select_kernels(args) == {(1024, True)}
        assert select_kernels(args, select_threads=512) == {(512, False)}
        for sorted_ in (False, True):
            planned = run_dps(args, sorted=sorted_)
            with using_cuda_options(select_threads=512):
                paired = run_dps(args, sorted=sorted_)
            np.testing.assert_array_equal(planned, paired, err_msg=f"sorted={sorted_}")
            assert_valid_topk(planned, batch, sorted=sorted_)


def test_longest_first_starts_the_longest_rows_in_the_first_wave():
    """The longest query row placed last, where grid order would start it in the second wave: longest
    first, its select starts (by the global timer) before every select of the second wave, the
    shortest rows'."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    batch_rows = (sms + 8 + 3) // 4
    rows = 4 * batch_rows
    lens = np.random.default_rng(330).integers(2500, 8000, size=batch_rows)
    lens[-1] = 30000
    batch = mtp_batch(Form(4, 64), lens, seed=330, exact=False)
    args = batch.to_torch("cuda")
    with using_cuda_options(fused=False):
        assert select_kernels(args) == {(1024, True)}
        out, stamps = _stamped(args, rows)
    assert_valid_topk(out, batch)
    assert all(s is not None for s in stamps)  # every query row is longer than K: each has a select
    seen = visible_lengths(lens, 4, batch.block_table.shape[1])
    order = np.lexsort((np.arange(rows), -seen))  # longest first, the earlier row first among equals
    second_wave = order[sms:]
    longest = order[:4]
    assert set(longest) == set(range(rows - 4, rows))
    first_second_wave_start = min(stamps[r].start_ns for r in second_wave)
    for r in longest:
        assert stamps[r].start_ns < first_second_wave_start, (r, stamps[r], first_second_wave_start)


def test_options_round_trip_and_restore():
    assert cuda_options() == DEFAULTS
    previous = set_cuda_options(fused=False, max_select_cluster=4, select_threads=512)
    assert previous == DEFAULTS
    assert cuda_options() == {"fused": False, "pdl": True, "max_select_cluster": 4, "select_floor": False,
                             "stamp_select": False, "select_threads": 512}
    set_cuda_options(**previous)
    with pytest.raises(RuntimeError, match="inside"):
        with using_cuda_options(pdl=False):
            assert cuda_options()["pdl"] is False
            raise RuntimeError("inside")
    assert cuda_options() == DEFAULTS


@pytest.mark.parametrize("options, error, match", [
    ({"max_select_cluster": 3}, ValueError, "max_select_cluster must be 1, 2, 4, 8 or 16, got 3"),
    ({"max_select_cluster": 32}, ValueError, "max_select_cluster must be 1, 2, 4, 8 or 16, got 32"),
    ({"fused": "yes"}, TypeError, "fused must be True, False or None"),
    ({"pdl": 1}, TypeError, "pdl must be True, False or None"),
    ({"select_threads": 256}, ValueError, r"select_threads must be 0 \(the schedule's\), 512 or 1024, got 256"),
    ({"select_threads": -1}, ValueError, "select_threads must not be negative, got -1"),
    ({"select_threads": 512.0}, TypeError, "select_threads must be an int or None, got float"),
    ({"select_threads": 2**32 + 512}, ValueError, r"select_threads must be 0 \(the schedule's\), 512 or 1024, got 4294967808"),
    ({"max_select_cluster": 2**32 + 1}, ValueError, "max_select_cluster must be 1, 2, 4, 8 or 16, got 4294967297"),
    ({"max_select_cluster": True}, TypeError, "max_select_cluster must be an int or None, got bool"),
])
def test_bad_option_is_a_clear_error_and_changes_nothing(options, error, match):
    with pytest.raises(error, match=match):
        set_cuda_options(fused=False, **options) if "fused" not in options else set_cuda_options(**options)
    assert cuda_options() == DEFAULTS
