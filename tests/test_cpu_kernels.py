"""The CPU path's scoring variants (scalar, avx2, avx512, avx512bf16), each forced in turn.

Every variant this CPU runs must give the reference's exact choice on exact-score data and a valid
top-K (SPEC tolerance) on realistic data. The whole suite runs with one variant forced through
``python -m pytest -p tests.cpu_kernel_plugin --cpu-kernel NAME tests`` (tests/cpu_kernel_plugin.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ffi_dsa
from ffi_dsa.contract import MAX_QUERIES, NUM_HEADS, NUM_HEADS_NARROW, SUPPORTED_HEADS
from conftest import (
    FP8,
    assert_exact,
    assert_valid_topk,
    fp8_bytes,
    make_exact_batch,
    run_dps,
    set_token,
)
from ffi_dsa.workloads import make_batch

KERNELS = ffi_dsa.cpu_kernels()


@pytest.fixture(params=KERNELS)
def cpu_kernel(request):
    """Forces one variant for the test, then restores the previous setting (the variant the whole
    run forces, see cpu_kernel_plugin.py, or auto)."""
    previous = ffi_dsa.set_cpu_kernel(request.param)
    assert ffi_dsa.cpu_kernel() == request.param
    yield request.param
    ffi_dsa.set_cpu_kernel(previous)


def test_every_fp8_byte_decodes_exactly(cpu_kernel):
    """Each of the 256 FP8 bytes, as a key value, must score exactly what a twin token scores whose
    key is 1.0 and whose float32 scale is that byte's value: twins on both sides of it, so a decode
    too high or too low moves it out from between them (ties go to the smaller position)."""
    values = np.arange(256, dtype=np.uint8).view(FP8).astype(np.float32)
    n = 3 * len(values)
    batch = make_exact_batch([n, n], seed=5, q_values=(0,), k_values=(0,), w_values=(1,))
    batch.block_table[1] = batch.block_table[0]  # row 1 reads row 0's pages with the negated query
    q = np.zeros((2, 64, 128), np.float32)
    q[0, 0, 0], q[1, 0, 0] = 1.0, -1.0
    batch.q[...] = fp8_bytes(q)
    one_at_d0 = fp8_bytes(np.eye(1, 128)[0])
    for byte, value in enumerate(values):
        raw = np.zeros(128, np.uint8)
        raw[0] = byte
        set_token(batch, 0, 3 * byte, raw=one_at_d0, scale=value)
        set_token(batch, 0, 3 * byte + 1, raw=raw, scale=1.0)
        set_token(batch, 0, 3 * byte + 2, raw=one_at_d0, scale=value)
    out = run_dps(batch.args(), topk=n, sorted=True)
    assert_exact(out, batch, topk=n, sorted=True)


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "score_order"])
@pytest.mark.parametrize("topk", [16, 2048])
def test_exact_data_partial_pages_and_masked_pages(cpu_kernel, topk, sorted_):
    """Lengths that end inside a page and on every residue of the variants' token blocks, plus
    invalid page ids inside a row: the reference's exact choice."""
    lens = [1, 5, 6, 63, 64, 65, 127, 379, 1000, 4100, 0]
    batch = make_exact_batch(lens, seed=31 + topk)
    batch.block_table[8, 3] = -1
    batch.block_table[9, 10] = batch.k_cache.shape[0] + 5
    out = run_dps(batch.args(), topk=topk, sorted=sorted_)
    assert_exact(out, batch, topk=topk, sorted=sorted_)


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "score_order"])
@pytest.mark.parametrize("heads", SUPPORTED_HEADS, ids=[f"H{h}" for h in SUPPORTED_HEADS])
def test_exact_data_query_rows_of_every_length(cpu_kernel, heads, sorted_):
    """N queries per row, H = 64 and 32 (whose register blocks differ in tokens): per-query lengths
    that end on every residue of 6- and 12-token blocks, inside and at the end of pages, queries of
    one row that stop on different pages, 0, and an invalid page only the longest query reaches."""
    lens = np.array([[1, 5, 6, 7], [11, 12, 13, 0], [63, 64, 65, 60], [379, 130, 1000, 2],
                     [4100, 4095, 4096, 4000], [0, 0, 0, 0]], np.int32)
    batch = make_exact_batch(lens, seed=51 + heads, queries=MAX_QUERIES, heads=heads)
    batch.block_table[4, 64] = -1
    for topk in (16, 2048):
        out = run_dps(batch.args(), topk=topk, sorted=sorted_)
        assert_exact(out, batch, topk=topk, sorted=sorted_)


@pytest.mark.parametrize("heads", SUPPORTED_HEADS, ids=[f"H{h}" for h in SUPPORTED_HEADS])
def test_realistic_query_rows_within_tolerance(cpu_kernel, heads):
    """Random FP8 data, N = 3 causal queries per row: a valid top-K under the SPEC tolerance."""
    batch = make_batch([8192, 3001, 700, 2], seed=53 + heads, queries=3, heads=heads)
    out = run_dps(batch.args(), topk=2048, sorted=True)
    assert_valid_topk(out, batch, sorted=True)


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "score_order"])
def test_cut_among_nan_scores_next_to_masked_tokens(cpu_kernel, sorted_):
    """The K-th best is a NaN score while masked tokens (an invalid page) sit among the NaN ones:
    all real scores win, then the NaN tokens by position, never a masked token."""
    batch = make_exact_batch([700], seed=37)
    nan_key = np.zeros(128, np.uint8)
    nan_key[0] = 0x7F
    for t in range(400):
        set_token(batch, 0, t, raw=nan_key)
    batch.block_table[0, 2] = -1  # tokens 128..191: no candidates
    out = run_dps(batch.args(), topk=600, sorted=sorted_)
    assert_exact(out, batch, topk=600, sorted=sorted_)


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "score_order"])
def test_realistic_data_within_tolerance(cpu_kernel, sorted_):
    """Random FP8 data and scales: a valid top-K under the SPEC tolerance."""
    batch = make_batch([8192, 3001, 700, 64, 2049], seed=41)
    out = run_dps(batch.args(), topk=2048, sorted=sorted_)
    assert_valid_topk(out, batch, sorted=sorted_)


@pytest.mark.parametrize("queries,heads", [(None, NUM_HEADS), (3, NUM_HEADS_NARROW)], ids=["N1_H64", "N3_H32"])
def test_variants_agree_on_exact_data(queries, heads):
    """The same exact-score batch gives the same bytes under every variant."""
    batch = make_exact_batch([5000, 777], seed=43, q_values=(0, 1, -1), k_values=(0, 1), w_values=(1, -1),
                             queries=queries, heads=heads)
    previous = ffi_dsa.set_cpu_kernel("auto")
    try:
        results = {}
        for name in KERNELS:
            ffi_dsa.set_cpu_kernel(name)
            results[name] = run_dps(batch.args(), topk=1024)
    finally:
        ffi_dsa.set_cpu_kernel(previous)
    for name in KERNELS:
        np.testing.assert_array_equal(results[name], results["scalar"], err_msg=name)


def test_set_cpu_kernel_and_its_errors():
    previous = ffi_dsa.set_cpu_kernel("auto")
    try:
        assert KERNELS[0] == "scalar"
        assert ffi_dsa.cpu_kernel() == KERNELS[-1]
        assert ffi_dsa.set_cpu_kernel("scalar") == "auto"
        assert ffi_dsa.cpu_kernel() == "scalar"
        assert ffi_dsa.set_cpu_kernel(KERNELS[-1]) == "scalar"
        assert ffi_dsa.set_cpu_kernel("scalar") == KERNELS[-1]
        with pytest.raises(ValueError, match="unknown CPU kernel 'avx9'"):
            ffi_dsa.set_cpu_kernel("avx9")
        assert ffi_dsa.cpu_kernel() == "scalar"  # a failed call changes nothing
    finally:
        ffi_dsa.set_cpu_kernel(previous)


def _cpu_flags() -> set[str]:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        pytest.skip("no /proc/cpuinfo to read the CPU's flags from")
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    pytest.skip("/proc/cpuinfo lists no flags")


def test_variants_offered_match_the_cpu_flags():
    """Run-time detection: a variant is offered exactly when the kernel reports its instructions."""
    flags = _cpu_flags()
    avx2 = {"avx2", "fma"} <= flags
    avx512 = avx2 and {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags
    expected = ["scalar"] + ["avx2"] * avx2 + ["avx512"] * avx512 + ["avx512bf16"] * (avx512 and "avx512_bf16" in flags)
    assert KERNELS == expected


def test_set_cpu_threads_gives_the_same_bytes(monkeypatch):
    """Rows and long rows' pages spread over any thread count with the same result; the explicit
    option wins over FFI_DSA_NUM_THREADS and 0 returns to it."""
    batch = make_batch([20000, 9000, 300], seed=47)
    monkeypatch.setenv("FFI_DSA_NUM_THREADS", "3")
    try:
        results = []
        for threads in (1, 2, 5, 0):
            ffi_dsa.set_cpu_threads(threads)
            results.append(run_dps(batch.args(), sorted=True))
        with pytest.raises(ValueError, match="threads must be >= 0"):
            ffi_dsa.set_cpu_threads(-1)
    finally:
        ffi_dsa.set_cpu_threads(0)
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])
    assert_valid_topk(results[0], batch, sorted=True)


@pytest.mark.parametrize("value", ["0", "-2", "four", "3x", " 3", "2.5"])
def test_bad_thread_count_from_the_environment_is_refused(monkeypatch, value):
    """FFI_DSA_NUM_THREADS that is not a whole number >= 1 is a ValueError naming it, not a silent
    single thread; nothing is written."""
    batch = make_batch([9000, 300], seed=48)
    monkeypatch.setenv("FFI_DSA_NUM_THREADS", value)
    out = np.full((2, 2048), -7, dtype=np.int32)
    with pytest.raises(ValueError, match="FFI_DSA_NUM_THREADS must be a whole number >= 1"):
        ffi_dsa.call(*batch.args(), out)
    assert (out == -7).all()
