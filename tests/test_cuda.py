"""CUDA-only checks (Hopper): long rows, large batches, streams, CUDA graphs, CPU/CUDA agreement.

Every device test of the other files also runs on "cuda"; these are the extras that only make sense
with a GPU. All are skipped when torch.cuda.is_available() is False.
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
    fp8_bytes,
    make_exact_batch,
    poisoned,
    row_ids,
    run_dps,
    set_token,
)
from mtp_batches import query_alone

pytestmark = pytest.mark.cuda


@pytest.mark.slow
@pytest.mark.parametrize("n", [131072, 1_048_576], ids=["128K", "1M"])
def test_long_row(n):
    """A single row of 128K / 1M tokens (tolerance rule), both orders."""
    batch = make_batch([n, 2049], seed=100)
    rows = ffi_dsa.reference_scores(*batch.args())
    for sorted_ in (False, True):
        out = run_dps(batch.to_torch("cuda"), sorted=sorted_)
        problems = ffi_dsa.check_topk(out, *batch.args(), sorted=sorted_, rows=rows)
        assert problems == [], problems[:5]


def test_batch_of_256_rows():
    """B = 256 rows of mixed lengths (0 to 6000) in one call (tolerance rule)."""
    lens = np.random.default_rng(101).integers(0, 6000, size=256)
    lens[:5] = [0, 1, 2047, 2048, 2049]
    batch = make_batch(lens, seed=101)
    out = run_dps(batch.to_torch("cuda"))
    assert_valid_topk(out, batch)


def test_batch_of_256_rows_exact():
    lens = np.random.default_rng(102).integers(0, 3000, size=256)
    batch = make_exact_batch(lens, seed=102, q_values=(0, 1), k_values=(0, 1), w_values=(1,), active_dims=3)
    assert_exact(run_dps(batch.to_torch("cuda")), batch)


def _one_kernel_batch_size() -> int:
    """A batch this large (>= 0.7 x the SMs) with a block table <= 16K tokens wide takes the one-kernel
    path: one CTA per row scores it into shared memory and selects it (sm90_schedule.h)."""
    return max(128, torch.cuda.get_device_properties(0).multi_processor_count)


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
def test_big_batch_of_rows_up_to_16k_one_cta_per_row(sorted_):
    """The one-kernel path: the contract's edge lengths up to the longest row it takes (16384 tokens), random
    page order, invalid page ids (negative, one past the end, far out), NaN tokens and a NaN row
    (tolerance rule, every output written)."""
    rows = _one_kernel_batch_size()
    lens = np.random.default_rng(120).integers(0, 16385, size=rows)
    lens[:10] = [0, 1, 2047, 2048, 2049, 16384, 16383, 4097, 9000, 12000]
    batch = make_batch(lens, seed=120)
    num_pages = batch.k_cache.shape[0]
    batch.block_table[5, 3] = -1
    batch.block_table[6, 0] = num_pages
    batch.block_table[7, 10] = num_pages + 999
    batch.block_table[4, 32] = -5  # the one token past K of a 2049-token row
    for t in (0, 5, 100, 4000, 11999):
        set_token(batch, 9, t, scale=float("nan"))
    batch.weights[8, 3] = np.nan
    out = run_dps(batch.to_torch("cuda"), sorted=sorted_)
    assert_valid_topk(out, batch, sorted=sorted_)


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
def test_big_batch_of_rows_up_to_16k_exact_ties(sorted_):
    """The one-kernel path on exact scores with many ties: the tie rule byte for byte."""
    rows = _one_kernel_batch_size()
    lens = np.random.default_rng(121).integers(0, 6000, size=rows)
    lens[:6] = [0, 1, 2047, 2048, 2049, 16384]
    batch = make_exact_batch(lens, seed=121, q_values=(0, 1), k_values=(0, 1), w_values=(1,), active_dims=4)
    assert_exact(run_dps(batch.to_torch("cuda"), sorted=sorted_), batch, sorted=sorted_)


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
def test_big_batch_of_rows_up_to_16k_special_values(sorted_):
    """The one-kernel path on the special values the small-batch tests give the two kernels: a row of
    equal scores, a row mostly NaN (fewer numbers than K), a NaN row, +inf ties, -inf below every
    number and NaN below -inf, exact ties everywhere else; byte-exact against the reference."""
    rows = _one_kernel_batch_size()
    lens = np.random.default_rng(122).integers(2049, 6000, size=rows)
    lens[:8] = [3000, 3000, 2500, 4000, 4000, 16384, 2048, 0]
    batch = make_exact_batch(lens, seed=122, q_values=(0, 1), k_values=(0, 1), w_values=(1,), active_dims=4)
    rng = np.random.default_rng(123)

    batch.weights[0, :] = 0.0                    # relu(logit) * 0: every score 0, the first K positions win
    for t in rng.choice(3000, size=2400, replace=False):   # 600 numbers for K = 2048 places
        set_token(batch, 1, int(t), scale=float("nan"))
    batch.weights[2, 9] = np.nan                 # the whole row NaN: its first K positions
    big = sorted(rng.choice(np.arange(100, 4000), size=40, replace=False).tolist())
    batch.q[3:5] = fp8_bytes(np.ones((2, 64, 128)))  # no zero q byte: an inf key dim meets no 0 (NaN)
    for t in big:                                # an inf scale on an all-ones key: +inf, tied by position
        set_token(batch, 3, t, key=1.0, scale=float("inf"))
    batch.weights[4, :] = -1.0                   # scores <= 0; the same inf tokens give -inf
    for t in big:
        set_token(batch, 4, t, key=1.0, scale=float("inf"))
    set_token(batch, 4, 17, scale=float("nan"))

    scores = ffi_dsa.reference_scores(*batch.args())
    assert (scores[0].scores == 0).all() and np.isnan(scores[2].scores).all()
    assert np.isnan(scores[1].scores).sum() == 2400
    assert np.isposinf(scores[3].scores[big]).all() and np.isneginf(scores[4].scores[big]).all()
    out = run_dps(batch.to_torch("cuda"), sorted=sorted_)
    assert out[0].tolist() == row_ids(batch, 0, range(DEFAULT_K))
    assert set(row_ids(batch, 3, big)) <= set(out[3].tolist())
    assert_exact(out, batch, sorted=sorted_)


@pytest.mark.slow
@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
@pytest.mark.parametrize("lens", [[131072, 9000, 3], [600_000, 70_000, 0]], ids=["128K", "600K"])
def test_long_rows_exact_ties_across_ctas(lens, sorted_):
    """Rows shared by many scoring CTAs and selected by a cluster of CTAs (the 600K row by 16 slices
    of 37.5K keys, too long for shared memory: read from L2 in several emit chunks): with many exact
    ties, the tie rule must hold across every boundary."""
    batch = make_exact_batch(lens, seed=110, q_values=(0, 1), k_values=(0, 1), w_values=(1,), active_dims=4)
    assert_exact(run_dps(batch.to_torch("cuda"), sorted=sorted_), batch, sorted=sorted_)


def test_more_rows_than_one_prefix_tile():
    """1500 short rows (more than one 640-row tile of the device-side page prefix sum), lengths
    0..300, many rows per scoring CTA; both the tolerance rule and the exact tie rule."""
    lens = np.random.default_rng(111).integers(0, 300, size=1500)
    batch = make_batch(lens, seed=111)
    assert_valid_topk(run_dps(batch.to_torch("cuda")), batch)
    exact = make_exact_batch(lens, seed=112, q_values=(0, 1), k_values=(0, 1), w_values=(1,), active_dims=3)
    assert_exact(run_dps(exact.to_torch("cuda")), exact)


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
def test_scored_rows_past_one_prefix_tile(sorted_):
    """Scored rows before, at and after the 640-row boundary of the scoring kernel's page prefix
    sum (a batch of more than 640 rows takes a second scan to find each CTA's first row), on the
    two-kernel path: one row of 20K tokens makes the block table wider than the one kernel's 16K.
    Sorted output scores the short rows too, so there every row is scored."""
    lens = np.random.default_rng(113).integers(0, 300, size=900)
    lens[[3, 639, 640, 641, 899]] = [2049, 4100, 3000, 2500, 5000]
    lens[700] = 20000
    batch = make_batch(lens, seed=113)
    assert_valid_topk(run_dps(batch.to_torch("cuda"), sorted=sorted_), batch, sorted=sorted_)
    exact = make_exact_batch(lens, seed=114, q_values=(0, 1), k_values=(0, 1), w_values=(1,), active_dims=3)
    assert_exact(run_dps(exact.to_torch("cuda"), sorted=sorted_), exact, sorted=sorted_)


def test_same_bytes_on_two_streams():
    """Determinism whatever the stream: launches on two side streams give identical bytes."""
    batch = make_batch([30000, 5000, 100, 2048], seed=103)
    args = batch.to_torch("cuda")
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = []
    for _ in range(3):
        for s in streams:
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                out = poisoned((4, DEFAULT_K), "cuda")
                ffi_dsa.call(*args, out)
            outs.append(out)
    torch.cuda.synchronize()
    first = outs[0].cpu().numpy()
    assert_all_written(first)
    assert_valid_topk(first, batch)
    for out in outs[1:]:
        assert np.array_equal(out.cpu().numpy(), first)


def test_cuda_graph_capture_and_replay_with_new_data():
    """The op captures into a torch.cuda.CUDAGraph; replays after copying new data (new q, keys,
    weights, lengths) into the same input buffers give the right answer for the new data."""
    lens = [5000, 3000, 70, 0]
    first = make_batch(lens, seed=104)
    static = [t.clone() for t in first.to_torch("cuda")]
    out = poisoned((4, DEFAULT_K), "cuda")

    side = torch.cuda.Stream()                      # warm up off the capture (module load, attributes)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ffi_dsa.call(*static, out)
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ffi_dsa.call(*static, out)

    for seed, new_lens in [(105, lens), (106, [4900, 3000, 1, 0]), (107, [5000, 17, 64, 2000])]:
        batch = make_batch(lens, seed=seed)         # same shapes as `first`
        batch.seq_lens[:] = new_lens
        for dst, src in zip(static, batch.to_torch("cuda")):
            dst.copy_(src)
        out.fill_(SENTINEL)
        graph.replay()
        torch.cuda.synchronize()
        got = out.cpu().numpy()
        assert_all_written(got)
        assert_valid_topk(got, batch)
        assert np.array_equal(got, run_dps(batch.to_torch("cuda")))


@pytest.mark.parametrize("path, rows, table_pages", [("two_kernels", 4, 512), ("one_kernel", 0, 256),
                                                     ("no_scores", 6, 32)])
@pytest.mark.parametrize("writer_last", ["seq_lens", "block_table"])
def test_inputs_written_by_the_kernels_just_before(path, rows, table_pages, writer_last):
    """The call's first kernel may start while the stream's previous kernel ends (programmatic
    dependent launch), and ffi_dsa's own kernels let the next one in early. Still, seq_lens and the
    block table written by the kernels right before the call, with no sync, are read as written:
    here they are the outputs of two earlier ffi_dsa calls (the block table: one call's top ids of
    rows that all read the same few pages; seq_lens: another call's top ids of one row), in either
    order. The chained call gives the same bytes as a call on copies made after a sync."""
    rows = rows or _one_kernel_batch_size()
    table_writer = make_batch([2 * table_pages] * rows, seed=140)
    pages = 2 * table_pages // 64
    rng = np.random.default_rng(140)
    table_writer.block_table[:, :pages] = [rng.permutation(pages) for _ in range(rows)]
    # ids < 2 * table_pages, distinct in a row: the reader's pool has that many pages and more
    lens_writer = make_batch([min(30000, 64 * table_pages)], seed=141)
    reader = make_batch([64] * rows, seed=142, spare_pages=2 * table_pages)
    q, k_cache, weights, _, _ = reader.to_torch("cuda")
    t_args, l_args = table_writer.to_torch("cuda"), lens_writer.to_torch("cuda")
    for repeat in range(3):
        table = poisoned((rows, table_pages), "cuda")
        lens = poisoned((1, rows), "cuda")
        out = poisoned((rows, DEFAULT_K), "cuda")
        writers = [lambda: ffi_dsa.call(*t_args, table), lambda: ffi_dsa.call(*l_args, lens)]
        if writer_last == "block_table":
            writers.reverse()
        # Keep the GPU busy while the host enqueues all three calls, so they run back to back (an
        # eager Python call takes longer to enqueue than these kernels take to run).
        torch.cuda._sleep(2_000_000)
        for write in writers:
            write()
        ffi_dsa.call(q, k_cache, weights, lens.view(rows), table, out)
        torch.cuda.synchronize()
        written = reader
        written.seq_lens = lens.cpu().numpy().reshape(rows)
        written.block_table = table.cpu().numpy()
        assert (written.block_table >= 0).all() and (written.block_table < 2 * table_pages).all()
        assert (written.seq_lens >= 0).all() and (written.seq_lens < 64 * table_pages).all()
        got = out.cpu().numpy()
        assert_valid_topk(got, written)
        assert np.array_equal(got, run_dps(written.to_torch("cuda"))), f"repeat {repeat}"


@pytest.mark.parametrize("lens", [[5000, 300], [1500, 7]], ids=["two_kernels", "no_scores"])
def test_after_copies_on_the_stream_eager_and_in_a_graph(lens):
    """The call's first kernel is launched with programmatic dependent launch, which pairs kernels;
    right after device-to-device copies (cudaMemcpyAsync, not kernels) on the stream, eagerly and
    inside a captured graph, the call still reads what the copies wrote. A smoke test of the launch
    attribute next to memcpy predecessors and in capture; nothing here forces an overlap, which
    test_inputs_written_by_the_kernels_just_before does."""
    batch = make_batch(lens, seed=150)
    args = batch.to_torch("cuda")
    expected = run_dps(args)
    staging = [torch.empty_like(t) for t in args]
    out = poisoned((len(lens), DEFAULT_K), "cuda")
    for dst, src in zip(staging, args):
        dst.copy_(src)
    ffi_dsa.call(*staging, out)
    assert np.array_equal(out.cpu().numpy(), expected)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for dst, src in zip(staging, args):
            dst.copy_(src)
        ffi_dsa.call(*staging, out)
    for t in staging:
        t.view(torch.uint8).fill_(0x7F)  # anything but the inputs: the replay's copies must restore them
    out.fill_(SENTINEL)
    graph.replay()
    torch.cuda.synchronize()
    assert np.array_equal(out.cpu().numpy(), expected)


def test_cpu_and_cuda_agree_random_via_tolerance():
    """Both devices give valid top-K answers on the same random batch (they may differ only where the
    the contract's tolerance allows)."""
    batch = make_batch([20000, 4000, 2047, 1], seed=108)
    for sorted_ in (False, True):
        cpu = run_dps(batch.to_torch("cpu"), sorted=sorted_)
        cuda = run_dps(batch.to_torch("cuda"), sorted=sorted_)
        assert_valid_topk(cpu, batch, sorted=sorted_)
        assert_valid_topk(cuda, batch, sorted=sorted_)
        assert ((cpu == -1) == (cuda == -1)).all()


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
def test_cpu_and_cuda_same_bytes_on_exact_data(sorted_):
    """On exact-score data the tie rule makes the answer unique: CPU and CUDA give the same bytes."""
    batch = make_exact_batch([20000, 4000, 2047, 1, 0], seed=109, q_values=(0, 1), k_values=(0, 1),
                             w_values=(1,), active_dims=4)
    cpu = run_dps(batch.to_torch("cpu"), sorted=sorted_)
    cuda = run_dps(batch.to_torch("cuda"), sorted=sorted_)
    assert np.array_equal(cpu, cuda)
    assert_exact(cuda, batch, sorted=sorted_)


# ----------------------------------------------------------------------------------------------
# Several GPUs in one process (skipped on a machine with one GPU)
# ----------------------------------------------------------------------------------------------

needs_two_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                    reason="needs two GPUs")


@needs_two_gpus
@pytest.mark.parametrize("path", ["two_kernels", "one_kernel"])
def test_second_gpu_while_the_first_is_current(path):
    """Tensors on cuda:1 while cuda:0 is current: the op runs on the tensors' device (its stream, its
    allocator, its kernel attributes), gives the exact answer, and leaves cuda:0 current."""
    if path == "two_kernels":
        lens = [9000, 3000, 2049, 1, 0]
    else:
        lens = np.random.default_rng(131).integers(0, 8000, size=_one_kernel_batch_size())
    batch = make_exact_batch(lens, seed=131, q_values=(0, 1), k_values=(0, 1), w_values=(1,), active_dims=4)
    with torch.cuda.device(0):
        for sorted_ in (False, True):
            out = run_dps(batch.to_torch("cuda:1"), sorted=sorted_)
            assert torch.cuda.current_device() == 0
            assert_exact(out, batch, sorted=sorted_)
        allocated = ffi_dsa.topk_indexer(*batch.to_torch("cuda:1"))
    assert allocated.device == torch.device("cuda:1")
    assert_exact(allocated.cpu().numpy(), batch)


@needs_two_gpus
def test_two_gpus_in_turn_on_side_streams_give_the_same_bytes():
    """Both GPUs of one process, called alternately, each on a side stream of its own device: every
    call gives the same bytes (identical GPUs, deterministic kernels)."""
    batch = make_batch([30000, 5000, 100, 2048], seed=132)
    args = {d: batch.to_torch(f"cuda:{d}") for d in (0, 1)}
    outs = []
    for _ in range(2):
        for d in (0, 1):
            with torch.cuda.device(d):
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    out = poisoned((4, DEFAULT_K), f"cuda:{d}")
                    ffi_dsa.call(*args[d], out)
                outs.append(out)
    for d in (0, 1):
        torch.cuda.synchronize(d)
    first = outs[0].cpu().numpy()
    assert_all_written(first)
    assert_valid_topk(first, batch)
    for out in outs[1:]:
        assert np.array_equal(out.cpu().numpy(), first)


@needs_two_gpus
def test_arguments_on_two_gpus_are_a_clear_error():
    """An output on another GPU than the inputs is a ValueError naming it; nothing is written."""
    batch = make_batch([300], seed=133)
    out = poisoned((1, DEFAULT_K), "cuda:1")
    with pytest.raises(ValueError, match="topk_indices is on device .* every argument must be on one device"):
        ffi_dsa.call(*batch.to_torch("cuda:0"), out)
    assert (out.cpu().numpy() == SENTINEL).all()


# ----------------------------------------------------------------------------------------------
# Several queries per row and 32 heads (docs/contract.md §7) on both CUDA paths.
# ----------------------------------------------------------------------------------------------

def _single_query_calls(batch, sorted_=False) -> np.ndarray:
    """The same answer as N single-query (rank-3) calls, query j with its own prefix length."""
    return np.stack([run_dps(query_alone(batch, j).to_torch("cuda"), sorted=sorted_)
                     for j in range(batch.q.shape[1])], axis=1)


# (queries, heads, longest query for the one-kernel path: N x the table's width of keys and the N
# query tiles must fit one CTA's shared memory, sm90_fused_rows.cuh)
QUERY_SHAPES = [(2, 64, 8192), (4, 32, 4096), (3, 64, 4096), (1, 32, 16384), (4, 64, 3200)]


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
@pytest.mark.parametrize("queries, heads, longest", QUERY_SHAPES, ids=[f"N{n}_H{h}" for n, h, _ in QUERY_SHAPES])
def test_queries_one_kernel_path(queries, heads, longest, sorted_):
    """One CTA per row scores each page for the row's N queries and selects each: causal prefixes
    around K and of 0 and 1 tokens, random page order, invalid page ids (tolerance rule), and the
    same bytes as N single-query calls."""
    rows = _one_kernel_batch_size()
    lens = np.random.default_rng(130 + queries).integers(0, longest + 1, size=rows)
    lens[:6] = [0, 1, queries, 2048, 2048 + queries - 1, longest]
    batch = make_batch(lens, seed=130 + queries, queries=queries, heads=heads)
    batch.block_table[5, 1] = -1
    batch.block_table[4, 0] = batch.k_cache.shape[0]
    out = run_dps(batch.to_torch("cuda"), sorted=sorted_)
    assert_valid_topk(out, batch, sorted=sorted_)
    np.testing.assert_array_equal(out, _single_query_calls(batch, sorted_))


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
@pytest.mark.parametrize("per_query_lens", [False, True], ids=["causal", "per_query_lens"])
@pytest.mark.parametrize("queries, heads", [(2, 64), (4, 32), (3, 64)], ids=["N2_H64", "N4_H32", "N3_H64"])
def test_queries_two_kernel_path(queries, heads, per_query_lens, sorted_):
    """Long and short rows on the two-kernel path (a row of 40K tokens: a select cluster per query
    row), with causal or per-query lengths (some longer for an earlier query, some past the block
    table, some negative): tolerance rule, and the same bytes as N single-query calls."""
    row_lens = np.array([40000, 9000, 2050, 1, 0, 4096])
    if per_query_lens:
        rng = np.random.default_rng(140 + queries)
        lens = rng.integers(0, 9001, size=(len(row_lens), queries))
        lens[0, 0], lens[1, -1], lens[2, 0], lens[3, 0] = 40000, 9000, 2049, -4
    else:
        lens = row_lens
    batch = make_batch(lens, seed=140 + queries, queries=queries, heads=heads, max_pages=625)
    batch.block_table[0, 7] = -3
    batch.seq_lens[1] = 625 * 64 + 999  # past the block table: cut to it (pages past 9000 tokens are -1)
    out = run_dps(batch.to_torch("cuda"), sorted=sorted_)
    assert_valid_topk(out, batch, sorted=sorted_)
    np.testing.assert_array_equal(out, _single_query_calls(batch, sorted_))


@pytest.mark.parametrize("path_rows", [3, "one_kernel"], ids=["two_kernels", "one_kernel"])
def test_rank4_one_query_equals_rank3(path_rows):
    """q [B, 1, H, 128] with weights [B, 1, H] and output [B, 1, K] gives the rank-3 call's bytes."""
    rows = _one_kernel_batch_size() if path_rows == "one_kernel" else path_rows
    lens = np.random.default_rng(150).integers(0, 12000, size=rows)
    batch = make_batch(lens, seed=150)
    flat = run_dps(batch.to_torch("cuda"))
    four = make_batch(lens, seed=150)
    four.q, four.weights = batch.q[:, None].copy(), batch.weights[:, None].copy()
    np.testing.assert_array_equal(run_dps(four.to_torch("cuda"))[:, 0], flat)
