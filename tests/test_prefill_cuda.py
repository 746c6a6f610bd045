"""What only the CUDA prefill kernel has (cuda/include/ffi_dsa/impls/sm90_prefill_rows.cuh): candidate
buffers that are cut while the keys stream (long rows, rising scores, plateaus), blocks of four rows
with M not a multiple of four, TMA alignment, graphs and the torch op on the GPU. tests/test_prefill.py
runs every contract test on CUDA too (its ``device`` fixture).

Every output is poisoned first and must be fully written; random data is checked against the float64
reference under the tolerance rule, exact data byte for byte.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ffi_dsa
from ffi_dsa.contract import HEAD_DIM, NUM_HEADS, NUM_HEADS_NARROW
from ffi_dsa.prefill_workloads import PrefillBatch, make_exact_prefill_batch, make_prefill_batch

from conftest import CUDA, SENTINEL, assert_all_written, fp8_bytes, poisoned

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not CUDA, reason="needs CUDA")]

ORDERS = [pytest.param(False, id="position_order"), pytest.param(True, id="sorted")]


def run_cuda(batch: PrefillBatch, topk, *, sorted=False, ids="relative") -> np.ndarray:
    args = batch.to_torch("cuda")
    out = poisoned((batch.rows, topk), "cuda")
    ffi_dsa.prefill_call(*args, out, sorted=sorted, ids=ids)
    assert_all_written(out)
    return out.cpu().numpy()


def rows_of(batch: PrefillBatch, rows) -> PrefillBatch:
    """The chunk restricted to some query rows (same keys): the reference of a few rows of a long call."""
    rows = np.asarray(rows)
    return PrefillBatch(batch.q[rows], batch.k, batch.k_scale, batch.weights[rows], batch.ks[rows], batch.ke[rows])


def assert_valid(out, batch, *, sorted=False, ids="relative") -> None:
    problems = ffi_dsa.check_prefill_topk(out, *batch.args(), sorted=sorted, ids=ids)
    assert problems == [], "\n".join(problems[:10])


@pytest.mark.parametrize("heads", [NUM_HEADS, NUM_HEADS_NARROW])
@pytest.mark.parametrize("sorted_", ORDERS)
def test_long_rows_cut_their_candidates_and_stay_exact(heads, sorted_):
    """Rows of ~20K random keys fill their candidate buffers several times over (M = 9: two whole
    blocks and one of a single row)."""
    batch = make_prefill_batch([20000, 3000], queries=[7, 2], seed=31, heads=heads, spare_keys=50)
    for topk in (2048, 100):
        out = run_cuda(batch, topk, sorted=sorted_)
        assert_valid(out, batch, sorted=sorted_)
        absolute = run_cuda(batch, topk, sorted=sorted_, ids="absolute")
        begin = np.maximum(batch.ks, 0)[:, None]
        np.testing.assert_array_equal(absolute, np.where(out >= 0, out + begin, -1))


def _rising(length, queries, seed, heads=NUM_HEADS) -> PrefillBatch:
    """Scores that rise with the key's position (64 x (j + 1), exact in float32): every key of a page
    beats the threshold, so each row's buffer is cut every ~2K keys."""
    batch = make_exact_prefill_batch([length], queries=[queries], seed=seed, heads=heads)
    key = np.zeros(HEAD_DIM, np.float32)
    key[0] = 1.0
    batch.k[:] = fp8_bytes(key)
    batch.k_scale[:] = np.arange(1, length + 1, dtype=np.float32)
    query = np.zeros((heads, HEAD_DIM), np.float32)
    query[:, 0] = 1.0
    batch.q[:] = fp8_bytes(query)
    batch.weights[:] = 1.0
    return batch


@pytest.mark.parametrize("sorted_", ORDERS)
@pytest.mark.parametrize("heads", [NUM_HEADS, NUM_HEADS_NARROW])
def test_rising_scores_keep_the_last_keys(sorted_, heads):
    batch = _rising(12000, 6, seed=32, heads=heads)
    out = run_cuda(batch, 2048, sorted=sorted_)
    np.testing.assert_array_equal(out, ffi_dsa.reference_prefill(*batch.args(), topk=2048, sorted=sorted_))
    length = batch.ke[0] - batch.ks[0]
    expected = np.arange(length - 2048, length)
    assert out[0].tolist() == (expected[::-1] if sorted_ else expected).tolist()


@pytest.mark.parametrize("sorted_", ORDERS)
@pytest.mark.parametrize("heads", [NUM_HEADS, NUM_HEADS_NARROW])
def test_rising_scores_on_one_warps_tokens_only(sorted_, heads):
    """Scores rise only on the first 16 keys of every other 64-key page (the keys one warp of one
    warpgroup scores) and are 0.0 elsewhere: once the zeros stop entering, every word that enters
    lands in that one warp's region of a row's buffer, which fills long before the others; the row
    is cut and its words dealt out over all the regions again, every few pages."""
    length = 20000
    batch = _rising(length, 5, seed=37, heads=heads)
    batch.k_scale[np.arange(len(batch.k_scale)) % 128 >= 16] = 0.0
    out = run_cuda(batch, 2048, sorted=sorted_)
    np.testing.assert_array_equal(out, ffi_dsa.reference_prefill(*batch.args(), topk=2048, sorted=sorted_))
    assert batch.ks[0] == 0  # ids relative to the row's start are key indices
    risers = np.flatnonzero(np.arange(batch.ke[0]) % 128 < 16)[-2048:]
    assert sorted(out[0].tolist()) == risers.tolist()


@pytest.mark.parametrize("sorted_", ORDERS)
def test_a_long_zero_plateau_is_taken_by_position(sorted_):
    """Every score of 10K keys is 0.0: the buffer is cut once to the first K positions, and later
    zeros only tie the threshold (their positions lose)."""
    batch = make_exact_prefill_batch([10000], queries=[5], seed=33, q_values=(1,), w_values=(1,))
    batch.k[:] = fp8_bytes(np.full((10000, HEAD_DIM), -1.0))
    out = run_cuda(batch, 2048, sorted=sorted_)
    assert (out == np.arange(2048)).all()
    np.testing.assert_array_equal(out, ffi_dsa.reference_prefill(*batch.args(), topk=2048, sorted=sorted_))


@pytest.mark.parametrize("sorted_", ORDERS)
def test_lengths_around_k_and_the_page_at_any_offset(sorted_):
    """Row lengths 0, 1, 2, 63, 64, 65, 2047, 2048, 2049, 4095, 4097, starting at offsets that are not
    page-aligned, with keys past every row made NaN (they must never appear)."""
    lengths = [0, 1, 2, 63, 64, 65, 2047, 2048, 2049, 4095, 4097]
    starts = [0, 3, 70, 129, 1000, 5, 77, 640, 1, 2000, 13]
    num_keys = 6200
    rng = np.random.default_rng(34)
    batch = make_prefill_batch([num_keys], queries=[len(lengths)], seed=34)
    batch.ks[:] = starts
    batch.ke[:] = np.array(starts) + np.array(lengths)
    seen = np.zeros(num_keys, bool)
    for s, n in zip(starts, lengths):
        seen[s:s + n] = True
    batch.k[~seen, rng.integers(0, HEAD_DIM)] = 0x7F
    out = run_cuda(batch, 2048, sorted=sorted_)
    assert_valid(out, batch, sorted=sorted_)
    for i, n in enumerate(lengths):
        assert (out[i] >= 0).sum() == min(n, 2048) and (out[i, min(n, 2048):] == -1).all()


def test_a_causal_prompt_like_the_chain_kit_calls_it():
    """One prompt of 5000 tokens, all rows (1250 blocks, longest first), checked on a spread of rows;
    the same rows called as chunks of 1024 rows give the same ids."""
    batch = make_prefill_batch([5000], seed=35)
    batch.k_scale[:] = np.random.default_rng(35).uniform(0.5, 1.5, 5000).astype(np.float32)
    whole = run_cuda(batch, 2048)
    rows = np.r_[0:3, 1000:1003, 2046:2051, 4995:5000]
    assert_valid(whole[rows], rows_of(batch, rows))
    args = batch.to_torch("cuda")
    chunked = poisoned((5000, 2048), "cuda")
    for a in range(0, 5000, 1024):
        b = min(5000, a + 1024)
        ffi_dsa.prefill_call(args[0][a:b], args[1][:b], args[2][:b], args[3][a:b], args[4][a:b],
                                     args[5][a:b], chunked[a:b])
    np.testing.assert_array_equal(chunked.cpu().numpy(), whole)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 7])
def test_blocks_of_four_rows_with_any_remainder(rows):
    batch = make_exact_prefill_batch([300], queries=[rows], seed=36)
    for sorted_ in (False, True):
        out = run_cuda(batch, 64, sorted=sorted_)
        np.testing.assert_array_equal(out, ffi_dsa.reference_prefill(*batch.args(), topk=64, sorted=sorted_))


def test_unaligned_views_are_refused_naming_the_argument():
    batch = make_prefill_batch([200], queries=[8], seed=37)
    q, k, k_scale, w, ks, ke = batch.to_torch("cuda")
    out = poisoned((8, 64), "cuda")
    flat_scale = torch.empty(k_scale.numel() + 1, device="cuda")
    bad = {2: flat_scale[1:].copy_(k_scale)}
    flat_k = torch.empty((k.shape[0] + 1) * HEAD_DIM + 8, dtype=torch.uint8, device="cuda")
    bad[1] = flat_k[8:8 + k.numel()].view(k.shape).copy_(k.view(torch.uint8))
    for position, name in ((1, "k"), (2, "k_scale")):
        args = [q, k, k_scale, w, ks, ke]
        args[position] = bad[position]
        with pytest.raises(ValueError, match=rf"^{name} must start on a 16-byte boundary"):
            ffi_dsa.prefill_call(*args, out)
        assert (out == SENTINEL).all()


def test_graph_replay_sees_new_inputs():
    """No host sync and no allocation: the call is captured once and replayed on refilled inputs."""
    first = make_prefill_batch([3000, 500], queries=[300, 200], seed=38)
    second = make_prefill_batch([3000, 500], queries=[300, 200], seed=39)
    args = first.to_torch("cuda")
    out = poisoned((first.rows, 2048), "cuda")
    ffi_dsa.prefill_call(*args, out)  # outside capture: builds the module, sets attributes
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ffi_dsa.prefill_call(*args, out)
    for src, dst in zip(second.to_torch("cuda"), args):
        dst.copy_(src)
    out.fill_(SENTINEL)
    graph.replay()
    torch.cuda.synchronize()
    np.testing.assert_array_equal(out.cpu().numpy(), run_cuda(second, 2048))
    assert_valid(out.cpu().numpy(), second)


def test_torch_op_on_cuda_and_under_compile():
    batch = make_exact_prefill_batch([400, 90], queries=[40, 90], seed=40)
    args = batch.to_torch("cuda")
    expected = ffi_dsa.reference_prefill(*batch.args(), topk=128, sorted=True, ids="absolute")
    got = torch.ops.dsa.prefill_topk_indexer(*args, topk=128, sorted=True, ids="absolute")
    np.testing.assert_array_equal(got.cpu().numpy(), expected)
    compiled = torch.compile(lambda *a: torch.ops.dsa.prefill_topk_indexer(*a, topk=128, sorted=True,
                                                                          ids="absolute"), fullgraph=True)
    np.testing.assert_array_equal(compiled(*args).cpu().numpy(), expected)


def test_same_bytes_as_the_cpu_path_on_exact_data():
    batch = make_exact_prefill_batch([2600, 700, 64], queries=[40, 700, 64], seed=41)
    for sorted_ in (False, True):
        cpu = np.full((batch.rows, 512), SENTINEL, np.int32)
        ffi_dsa.prefill_call(*batch.args(), cpu, sorted=sorted_)
        np.testing.assert_array_equal(run_cuda(batch, 512, sorted=sorted_), cpu)
