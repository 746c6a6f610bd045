"""Decode's ``ids`` and ``max_seq_len`` options (docs/contract.md, the decode op's options).

``ids="positions"`` writes each chosen token's position t in its row instead of its global slot
(``block_table[b, t // 64] * 64 + t % 64``, ``ids="slots"``, the default): the same selection, ties,
NaN rule, order and -1 tail. ``max_seq_len`` is a host int bounding the batch's longest row; it only
plans the CUDA path's work, so every bound (below the rows' real lengths, equal, above, none) gives
the same bytes. Checked here on CPU and, marked cuda, on a GPU:

* exact data (small integers, unit scales: ties and 0.0 plateaus everywhere), with NaN tokens,
  invalid page ids inside rows, garbage past each row, lengths 0/1/2047/2048/2049, N = 1..4 query
  tokens per row, H = 64 and 32, both orders: byte for byte against the float64 reference;
* random data with copied keys (exact ties): the contract's tolerance on the float64 scores;
* positions and slots of the same call: the positions mapped through the block table are the
  slots, byte for byte, and the slots mapped back are the positions;
* every bound of ``max_seq_len`` gives the bytes of no bound (on CUDA with a 130K-token row, a bound
  of 8192 and a table 2560 pages wide, and on both CUDA paths);
* bad values of either option: a ValueError naming it, nothing written.
The framework callers (torch ops, torch.compile, JAX, TVM) are checked against ``ffi_dsa.call`` at
the end of this file; the engine wirings in test_engine_wiring.py, several devices in
test_sharded_jax.py and test_jax_processes.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import ffi_dsa
from ffi_dsa import decode_reference
from ffi_dsa.contract import MAX_QUERIES, NUM_HEADS, NUM_HEADS_NARROW, PAGE_TOKENS
from ffi_dsa.workloads import make_batch

from conftest import (FP8_NAN_BYTES, SENTINEL, assert_all_written, assert_rows_equal, fill_past_rows,
                      make_exact_batch, poisoned, poisoned_np, run_dps, set_scale, set_token)
from engine_chains import duplicate_neighbours

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
# every length the contract singles out, a row shorter than a page, one of several pages
LENS = [0, 1, 2047, 2048, 2049, 700, 64]
TOPKS = (64, 2048)
QUERIES = [pytest.param(None, id="rank3")] + [pytest.param(n, id=f"n{n}") for n in range(1, MAX_QUERIES + 1)]
HEADS = [pytest.param(NUM_HEADS, id="H64"), pytest.param(NUM_HEADS_NARROW, id="H32")]
ORDERS = [pytest.param(False, id="position_order"), pytest.param(True, id="sorted")]
BAD_IDS = ["slot", "POSITIONS", "", None, 1, b"positions"]
BAD_BOUNDS = [-1, -(2**40), 1.5, "8192", True, np.float32(3.0), np.array([5]), torch.tensor(5)]


def hard_batch(queries, heads, seed, *, dense_ties: bool, per_query_lens: bool = False):
    """Exact data on LENS (dense_ties: 4 active dims of values -1..1, so most scores tie or are 0.0),
    a NaN key and a NaN scale, an invalid page id inside two rows, garbage past every row."""
    lens = np.array(LENS)
    if per_query_lens:
        rng = np.random.default_rng(seed)
        lens = np.stack([rng.integers(0, n + 1) for n in LENS for _ in range(queries)]).reshape(len(LENS), queries)
        lens[:, -1] = LENS
    values = dict(q_values=(-1, 0, 1), k_values=(-1, 0, 1), active_dims=4) if dense_ties else {}
    batch = make_exact_batch(lens, seed=seed, queries=queries, heads=heads, spare_pages=3, **values)
    set_token(batch, 5, 10, raw=np.full(128, FP8_NAN_BYTES[0], np.uint8))       # row 5: a NaN key
    page, slot = int(batch.block_table[6, 0]), 33                                 # row 6: a NaN scale
    set_scale(batch, page, slot, float("nan"))
    fill_past_rows(batch, seed)
    batch.block_table[3, 5] = -7                                                  # row 3: pages that
    batch.block_table[4, 1] = batch.k_cache.shape[0] + 2                          # are no page ids
    return batch


def to_slots(positions: np.ndarray, table: np.ndarray, queries: int) -> np.ndarray:
    """Positions -> global slots through the block table (query row r is row r // N's); -1 kept."""
    flat = positions.reshape(-1, positions.shape[-1]).astype(np.int64)
    rows = np.repeat(np.asarray(table, np.int64), queries, axis=0)
    t = np.maximum(flat, 0)
    page = np.take_along_axis(rows, t // PAGE_TOKENS, axis=1)
    return np.where(flat >= 0, page * PAGE_TOKENS + t % PAGE_TOKENS, -1).astype(np.int32).reshape(positions.shape)


def to_positions(slots: np.ndarray, batch, queries: int) -> np.ndarray:
    """Global slots -> positions, through each row's own pages (those below its longest length,
    which are distinct in these batches: the table holds anything past them); -1 kept."""
    flat = slots.reshape(-1, slots.shape[-1])
    longest = np.asarray(batch.seq_lens, np.int64).reshape(len(batch.seq_lens), -1).max(axis=1)
    out = np.full(flat.shape, -1, np.int32)
    for r, row in enumerate(flat):
        used = -(-int(longest[r // queries]) // PAGE_TOKENS)
        pages = np.asarray(batch.block_table[r // queries, :used], np.int64)
        where = {int(p): i for i, p in enumerate(pages) if p >= 0}
        for i, s in enumerate(row):
            if s >= 0:
                out[r, i] = where[int(s) // PAGE_TOKENS] * PAGE_TOKENS + int(s) % PAGE_TOKENS
    return out.reshape(slots.shape)


def call(batch, device, topk, **options) -> np.ndarray:
    """ffi_dsa.call into a poisoned buffer on `device` (numpy on the CPU, torch on CUDA); host int32."""
    if device == "cpu":
        out = poisoned_np(batch.output_shape(topk))
        ffi_dsa.call(*batch.args(), out, **options)
        assert_all_written(out)
        return out
    return run_dps(batch.to_torch(device), topk, **options)


# ---------------------------------------------------------------------------------------------------
# positions against the reference, and against slots
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sorted_", ORDERS)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("queries", QUERIES)
@pytest.mark.parametrize("dense_ties", [False, True], ids=["exact", "dense_ties"])
def test_positions_are_the_float64_reference_byte_for_byte(device, queries, heads, sorted_, dense_ties):
    batch = hard_batch(queries, heads, seed=100 + (queries or 0) + heads, dense_ties=dense_ties)
    rows = ffi_dsa.reference_scores(*batch.args(), magnitude=False)
    n = queries or 1
    for topk in TOPKS:
        positions = call(batch, device, topk, sorted=sorted_, ids="positions")
        slots = call(batch, device, topk, sorted=sorted_)
        expected = decode_reference.select_rows(rows, topk, sorted_, ids="positions")
        assert_rows_equal(positions, expected, f"K={topk}: positions vs the reference")
        assert_rows_equal(slots, decode_reference.select_rows(rows, topk, sorted_), f"K={topk}: slots vs the reference")
        assert_rows_equal(to_slots(positions, batch.block_table, n), slots, f"K={topk}: positions mapped to slots")
    # the cases the batch was built to hold really are there
    flat = positions.reshape(-1, 2048)
    assert (flat[:n] == -1).all() and (flat[-1] != -1).any()                    # row 0 is empty, row 6 not
    assert len(rows[5 * n + n - 1].positions) == min(700, LENS[5])  # the NaN token is a candidate
    assert len(rows[3 * n + n - 1].positions) == LENS[3] - 64        # the invalid page's tokens are not


@pytest.mark.parametrize("queries", [2, MAX_QUERIES])
def test_positions_with_one_length_per_query(device, queries):
    """seq_lens [B, N] (each query's own length): the reference's positions, and the slots mapped."""
    batch = hard_batch(queries, NUM_HEADS, seed=130 + queries, dense_ties=True, per_query_lens=True)
    expected = ffi_dsa.reference(*batch.args(), topk=2048, ids="positions")
    positions = call(batch, device, 2048, ids="positions")
    assert_rows_equal(positions, expected, "positions vs the reference")
    assert_rows_equal(to_slots(positions, batch.block_table, queries), call(batch, device, 2048), "mapped to slots")


@pytest.mark.parametrize("sorted_", ORDERS)
@pytest.mark.parametrize("queries", [None, 2, MAX_QUERIES], ids=["rank3", "n2", "n4"])
def test_positions_on_random_data_are_a_valid_topk_and_the_slots(device, queries, sorted_):
    """Random keys and scales with exact ties copied in: the tolerance rule under float64 scores, and
    the same selection as slots (mapped either way, byte for byte, on the same device)."""
    batch = make_batch([3000, 2049, 2048, 5000, 1, 0, 900], seed=140, queries=queries, spare_pages=2)
    duplicate_neighbours(batch, 140)
    fill_past_rows(batch, 140)
    n = queries or 1
    positions = call(batch, device, 2048, sorted=sorted_, ids="positions")
    slots = call(batch, device, 2048, sorted=sorted_)
    assert ffi_dsa.check_topk(positions, *batch.args(), sorted=sorted_, ids="positions") == []
    assert ffi_dsa.check_topk(slots, *batch.args(), sorted=sorted_) == []
    assert_rows_equal(to_slots(positions, batch.block_table, n), slots, "positions mapped to slots")
    assert_rows_equal(to_positions(slots, batch, n), positions, "slots mapped to positions")


def test_the_checks_catch_wrong_positions():
    """check_topk(ids="positions") refuses slots, a position past the row, and a swapped pair; the
    reference's positions differ from its slots on these batches."""
    batch = make_batch([3000, 900], seed=150)
    positions = ffi_dsa.topk_indexer(*batch.args(), ids="positions")
    slots = ffi_dsa.topk_indexer(*batch.args())
    assert not np.array_equal(positions, slots)
    assert ffi_dsa.check_topk(slots, *batch.args(), ids="positions") != []
    past = positions.copy()
    past[1, 0] = 900
    assert any("not in the row" in p for p in ffi_dsa.check_topk(past, *batch.args(), ids="positions"))
    swapped = positions.copy()
    swapped[0, [3, 4]] = swapped[0, [4, 3]]
    assert any("ascending" in p for p in ffi_dsa.check_topk(swapped, *batch.args(), ids="positions"))


# ---------------------------------------------------------------------------------------------------
# max_seq_len: a bound plans work, never changes the answer
# ---------------------------------------------------------------------------------------------------

BOUNDS = [None, 0, 1, 63, 64, 700, 2047, 2048, 2049, 4100, 4101, 1 << 20, 2**31 - 1, 2**40, np.int64(2049)]


@pytest.mark.parametrize("ids", ["slots", "positions"])
@pytest.mark.parametrize("queries", [None, 2, MAX_QUERIES], ids=["rank3", "n2", "n4"])
def test_every_max_seq_len_gives_the_same_bytes(device, ids, queries):
    batch = make_batch([4100, 2049, 0, 700, 1], seed=160, queries=queries, max_pages=80)  # a wider table
    fill_past_rows(batch, 160)
    unbounded = call(batch, device, 2048, ids=ids)
    assert ffi_dsa.check_topk(unbounded, *batch.args(), ids=ids) == []
    for bound in BOUNDS:
        assert_rows_equal(call(batch, device, 2048, ids=ids, max_seq_len=bound), unbounded, f"max_seq_len={bound!r}")
        for sorted_ in (False, True):
            got = ffi_dsa.topk_indexer(*batch.to_torch(device), sorted=sorted_, ids=ids, max_seq_len=bound)
            assert_rows_equal(got.cpu().numpy(), call(batch, device, 2048, sorted=sorted_, ids=ids), f"sorted {bound}")


# ---------------------------------------------------------------------------------------------------
# CUDA: a row far longer than the bound, and both kernel paths
# ---------------------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.parametrize("ids", ["slots", "positions"])
def test_cuda_a_130k_row_beyond_a_bound_of_8192_on_a_wide_table(ids):
    """A 130K-token row among 8K rows, tables 2560 pages wide, max_seq_len=8192 (the select plans for
    8K rows): the bytes of no bound, and a valid top-K under the float64 scores."""
    lens = [130_000, 8192, 5000, 0, 2049]
    batch = make_batch(lens, seed=170, max_pages=2560)
    duplicate_neighbours(batch, 170)
    fill_past_rows(batch, 170)
    unbounded = call(batch, "cuda", 2048, ids=ids)
    assert ffi_dsa.check_topk(unbounded, *batch.args(), ids=ids) == []
    for bound in (8192, 1, max(lens), None):
        assert_rows_equal(call(batch, "cuda", 2048, ids=ids, max_seq_len=bound), unbounded, f"max_seq_len={bound}")
    sorted_ = call(batch, "cuda", 2048, sorted=True, ids=ids, max_seq_len=8192)
    assert ffi_dsa.check_topk(sorted_, *batch.args(), sorted=True, ids=ids) == []


@pytest.mark.cuda
@pytest.mark.parametrize("sorted_", ORDERS)
@pytest.mark.parametrize("queries", [None, 2, MAX_QUERIES], ids=["rank3", "n2", "n4"])
def test_cuda_both_paths_give_the_reference_positions(queries, sorted_):
    """128 rows of up to 4K tokens on a 64-page table: the one-kernel path takes them (a batch of
    >= 0.7 x the SMs), the two-kernel path with fused=False; exact data, so every path, bound and id
    kind is the float64 reference byte for byte."""
    from ffi_dsa.cuda_options import using_cuda_options

    rng = np.random.default_rng(180)
    lens = rng.integers(0, 4097, size=128)
    lens[:5] = [0, 1, 2047, 2048, 2049]
    batch = make_exact_batch(lens, seed=180, queries=queries, max_pages=64, q_values=(-1, 0, 1),
                             k_values=(-1, 0, 1), active_dims=8)
    fill_past_rows(batch, 180)
    n = queries or 1
    expected = {ids: ffi_dsa.reference(*batch.args(), topk=2048, sorted=sorted_, ids=ids)
                for ids in ("slots", "positions")}
    for fused in (True, False):
        with using_cuda_options(fused=fused):
            for bound in (None, 512, int(lens.max())):
                got = {ids: call(batch, "cuda", 2048, sorted=sorted_, ids=ids, max_seq_len=bound)
                       for ids in ("slots", "positions")}
                for ids in got:
                    assert_rows_equal(got[ids], expected[ids], f"fused={fused}, max_seq_len={bound}, {ids}")
                assert_rows_equal(to_slots(got["positions"], batch.block_table, n), got["slots"], "mapped")


# ---------------------------------------------------------------------------------------------------
# bad values: a ValueError naming the option, nothing written
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", BAD_IDS, ids=repr)
def test_a_bad_ids_is_a_value_error_naming_it(device, value):
    args = make_batch([300, 70], seed=190).to_torch(device)
    out = poisoned((2, 64), device)
    with pytest.raises(ValueError, match=r"^ids must be 'slots' .* or 'positions'"):
        ffi_dsa.call(*args, out, ids=value)
    with pytest.raises(ValueError, match=r"^ids must be"):
        ffi_dsa.topk_indexer(*args, topk=64, ids=value)
    if isinstance(value, str):  # the torch schema says str: torch itself refuses the others
        with pytest.raises(ValueError, match=r"^ids must be"):
            torch.ops.dsa.topk_indexer_out(*args, out, ids=value)
        with pytest.raises(ValueError, match=r"^ids must be"):
            torch.ops.dsa.topk_indexer(*args, topk=64, ids=value)
    elif not isinstance(value, bytes):  # (torch converts bytes to a str, as its schema allows)
        with pytest.raises((RuntimeError, TypeError), match="ids"):
            torch.ops.dsa.topk_indexer_out(*args, out, ids=value)
    assert (out == SENTINEL).all(), "a bad ids wrote the output"


@pytest.mark.parametrize("value", BAD_BOUNDS, ids=repr)
def test_a_bad_max_seq_len_is_a_value_error_naming_it(device, value):
    batch = make_batch([300, 70], seed=191)
    args = batch.to_torch(device)
    out = poisoned((2, 64), device)
    host = poisoned_np((2, 64))
    expected = re.escape("max_seq_len must be None or an int >= 0")
    with pytest.raises(ValueError, match=f"^{expected}"):
        ffi_dsa.call(*args, out, max_seq_len=value)
    if device == "cpu":
        with pytest.raises(ValueError, match=f"^{expected}"):
            ffi_dsa.call(*batch.args(), host, max_seq_len=value)
    with pytest.raises(ValueError, match=f"^{expected}"):
        ffi_dsa.topk_indexer(*args, topk=64, ids="positions", max_seq_len=value)
    if isinstance(value, int) and not isinstance(value, bool):  # torch's int? takes these as they are
        with pytest.raises(ValueError, match=f"^{expected}"):
            torch.ops.dsa.topk_indexer_out(*args, out, max_seq_len=value)
    elif isinstance(value, (float, str)):
        with pytest.raises((RuntimeError, TypeError), match="max_seq_len"):
            torch.ops.dsa.topk_indexer_out(*args, out, max_seq_len=value)
    assert (out == SENTINEL).all() and (host == SENTINEL).all(), "a bad max_seq_len wrote the output"


def test_the_ids_values_are_stated_once_in_cpp():
    """ffi_dsa reads both ops' ids values from the C++ contract (contract.h), default first."""
    from ffi_dsa import _build, contract, decode, prefill

    header = (_build.native_dir() / "include" / "ffi_dsa" / "contract.h").read_text()
    assert 'kDecodeIds[2] = {"slots", "positions"}' in header
    assert 'kPrefillIds[2] = {"relative", "absolute"}' in header
    assert decode.IDS == contract.DECODE_IDS == ("slots", "positions")
    assert prefill.IDS == contract.PREFILL_IDS == ("relative", "absolute")
    options = {o.name: o for o in decode.OP.options}
    assert options["ids"].choices == decode.IDS and options["ids"].default == decode.IDS[0]
    assert options["max_seq_len"].default is None and options["max_seq_len"].choices is None


# ---------------------------------------------------------------------------------------------------
# every caller: the bytes of ffi_dsa.call with the same options
# ---------------------------------------------------------------------------------------------------

CALLER_LENS = [3000, 2049, 0, 1, 700]
OPTIONS = [pytest.param(dict(ids="positions"), id="positions"),
           pytest.param(dict(ids="positions", max_seq_len=512), id="positions_bounded"),
           pytest.param(dict(ids="slots", max_seq_len=3000), id="slots_bounded")]


def caller_batch(seed, queries=None):
    batch = make_batch(CALLER_LENS, seed=seed, queries=queries, spare_pages=2)
    duplicate_neighbours(batch, seed)
    fill_past_rows(batch, seed)
    return batch


def assert_call_bytes(got, batch, device, topk=2048, *, sorted=False, **options):
    got = got.cpu().numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    assert got.dtype == np.int32 and got.shape == batch.output_shape(topk)
    assert_rows_equal(got, call(batch, device, topk, sorted=sorted, **options), f"{options}")
    assert ffi_dsa.check_topk(got, *batch.args(), sorted=sorted, ids=options.get("ids", "slots")) == []


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("queries", [None, 2], ids=["rank3", "n2"])
def test_torch_ops_functional_and_out(device, queries, options):
    batch = caller_batch(200, queries)
    args = batch.to_torch(device)
    assert_call_bytes(torch.ops.dsa.topk_indexer(*args, **options), batch, device, **options)
    assert_call_bytes(torch.ops.dsa.topk_indexer(*args, 2048, True, *options.values()), batch, device, sorted=True,
                      **options)
    out = poisoned(batch.output_shape(2048), device)
    assert torch.ops.dsa.topk_indexer_out(*args, out, **options) is None
    assert_call_bytes(out, batch, device, **options)


def test_torch_opcheck_with_the_options(device):
    q, k, w, s, bt = caller_batch(201).to_torch(device)
    qu = q.view(torch.uint8)
    out = torch.empty((len(CALLER_LENS), 64), dtype=torch.int32, device=device)
    torch.library.opcheck(torch.ops.dsa.topk_indexer.default, (qu, k, w, s, bt, 64, True, "positions", 1024))
    torch.library.opcheck(torch.ops.dsa.topk_indexer_out.default, (qu, k, w, s, bt, out, False, "positions", None))


def _compiled_step(q, k, w, s, bt, out, bound: int):
    idx = torch.ops.dsa.topk_indexer(q, k, w * 2.0, s, bt, 2048, False, "positions", bound)
    torch.ops.dsa.topk_indexer_out(q, k, w, s, bt, out, True, "positions", bound + 1)
    return idx, (idx >= 0).sum(dim=-1)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_with_a_changing_bound(device, backend):
    """torch.compile(fullgraph, dynamic): positions from both ops, max_seq_len a symbolic int that
    changes between calls (one graph), the eager bytes."""
    import torch._dynamo.utils as dynamo_utils

    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    compiled = torch.compile(_compiled_step, backend=backend, fullgraph=True, dynamic=True)
    for seed, bound in ((202, 700), (203, 5000)):
        batch = caller_batch(seed)
        args = batch.to_torch(device)
        out = poisoned(batch.output_shape(2048), device)
        idx, count = compiled(*args, out, bound)
        assert_call_bytes(idx, batch, device, ids="positions")
        assert_call_bytes(out, batch, device, sorted=True, ids="positions")
        assert torch.equal(count.cpu(), (idx >= 0).sum(dim=-1).cpu())
    assert dict(dynamo_utils.counters["graph_break"]) == {}
    assert dynamo_utils.counters["stats"]["unique_graphs"] == 1, "a new bound recompiled"


@pytest.mark.cuda
def test_torch_cuda_graph_replays_positions_with_its_bound():
    batch = caller_batch(204)
    static = [a.clone() for a in batch.to_torch("cuda")]
    out = poisoned(batch.output_shape(2048), "cuda")
    torch.ops.dsa.topk_indexer_out(*static, out, ids="positions", max_seq_len=64)  # warm up off the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        functional = torch.ops.dsa.topk_indexer(*static, ids="positions", max_seq_len=64)
        torch.ops.dsa.topk_indexer_out(*static, out, True, "positions", 64)
    for seed in (205, 206):
        other = caller_batch(seed)
        for dst, src in zip(static, other.to_torch("cuda")):
            dst.copy_(src)
        out.fill_(SENTINEL)
        graph.replay()
        torch.cuda.synchronize()
        assert_call_bytes(functional, other, "cuda", ids="positions")
        assert_call_bytes(out, other, "cuda", sorted=True, ids="positions")


def _jax():
    jax = pytest.importorskip("jax")
    pytest.importorskip("jax_tvm_ffi")
    return jax


def _jax_device(jax, device):
    if device == "cpu":
        return jax.devices("cpu")[0]
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("needs a JAX GPU")


def _jax_args(jax, batch, device):
    import jax.numpy as jnp

    where = _jax_device(jax, device)
    q = jnp.asarray(batch.q).view(jnp.float8_e4m3fn)
    return [jax.device_put(a, where) for a in (q, *map(jnp.asarray, batch.args()[1:]))]


@pytest.mark.parametrize("options", OPTIONS)
def test_jax_eager_jit_and_vmap(device, options):
    jax = _jax()
    import jax.numpy as jnp

    batch = caller_batch(210, queries=2)
    args = _jax_args(jax, batch, device)
    assert_call_bytes(ffi_dsa.topk_indexer(*args, **options), batch, device, **options)
    jitted = jax.jit(ffi_dsa.topk_indexer, static_argnames=("topk", "sorted", "ids", "max_seq_len"))
    assert_call_bytes(jitted(*args, sorted=True, **options), batch, device, sorted=True, **options)
    # vmap over weights with the cache shared: one call on the stacked rows
    q, k, w, s, bt = args
    many = jax.vmap(lambda x: ffi_dsa.topk_indexer(q, k, x, s, bt, **options))(jnp.stack([w, 2.0 * w]))
    assert_call_bytes(many[1], batch, device, **options)


def test_jax_option_mistakes():
    jax = _jax()
    batch = caller_batch(211)
    args = _jax_args(jax, batch, "cpu")
    with pytest.raises(ValueError, match="^ids must be"):
        ffi_dsa.topk_indexer(*args, ids="slot")
    with pytest.raises(ValueError, match="^max_seq_len must be None or an int >= 0"):
        ffi_dsa.topk_indexer(*args, max_seq_len=-5)
    traced = jax.jit(lambda bound, *a: ffi_dsa.topk_indexer(*a, max_seq_len=bound))
    with pytest.raises(TypeError, match="^max_seq_len must be a static Python value"):
        traced(4096, *args)


def test_jax_distributed_step_checks_its_options():
    _jax()
    from ffi_dsa import jax_distributed

    import jax

    mesh = jax.sharding.Mesh(np.array(jax.devices("cpu")[:1]), (jax_distributed.AXIS,))
    with pytest.raises(ValueError, match="^ids must be"):
        jax_distributed.data_parallel_topk(mesh, 2048, ids="pos")
    with pytest.raises(ValueError, match="^max_seq_len must be"):
        jax_distributed.data_parallel_topk(mesh, 2048, max_seq_len=-1)
    batch = caller_batch(212)
    step = jax_distributed.data_parallel_topk(mesh, 2048, ids="positions", max_seq_len=100)
    arrays = jax_distributed.global_arrays(mesh, _jax_args(jax, batch, "cpu"))
    assert_call_bytes(jax_distributed.local_rows(step(*arrays)), batch, "cpu", ids="positions")


@pytest.mark.parametrize("sorted_", ORDERS)
def test_tvm_globals_take_positions_and_a_bound(device, sorted_):
    import tvm_ffi

    from ffi_dsa import decode, tvm_relax

    tvm_relax.register_global_funcs()
    name = tvm_relax.global_name(decode.OP, sorted=sorted_, ids="positions", max_seq_len=99)
    assert name == "ffi_dsa.topk_indexer" + ("_sorted" if sorted_ else "") + "_positions"
    fn = tvm_ffi.get_global_func(name)
    batch = caller_batch(213)
    args = batch.to_torch(device)
    for bound in ((), (0,), (512,), (1 << 20,)):  # (inputs..., [max_seq_len], output)
        out = poisoned(batch.output_shape(2048), device)
        fn(*args, *bound, out)
        assert_call_bytes(out, batch, device, sorted=sorted_, ids="positions")
    out = poisoned(batch.output_shape(2048), device)
    with pytest.raises(ValueError, match="^max_seq_len must be"):
        fn(*args, -1, out)
    assert (out == SENTINEL).all()
    with pytest.raises(ValueError, match="^ids must be"):
        tvm_relax.global_name(decode.OP, ids="slot")


def test_tvm_relax_module_with_positions_and_a_bound_argument():
    tvm = pytest.importorskip("tvm")
    import ml_dtypes

    from ffi_dsa import tvm_relax

    vm = tvm_relax.build(tvm_relax.indexer_module(topk=2048, q_rank=4, ids="positions", with_max_seq_len=True))
    batch = caller_batch(214, queries=2)
    args = [tvm.runtime.tensor(batch.q.view(ml_dtypes.float8_e4m3fn))]
    args += [tvm.runtime.tensor(a) for a in batch.args()[1:]]
    for bound in (0, 64, 3000):
        assert_call_bytes(vm["main"](*args, bound).numpy(), batch, "cpu", ids="positions")
    with pytest.raises(ValueError, match="max_seq_len must be"):
        vm["main"](*args, -3)
    with pytest.raises(ValueError, match="^ids must be"):
        tvm_relax.indexer_module(ids="offsets")
