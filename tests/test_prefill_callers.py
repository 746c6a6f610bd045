"""The prefill op's callers (docs/contract.md, prefill): torch.ops.dsa.prefill_topk_indexer(_out)
(eager, opcheck, torch.compile), JAX (ffi_dsa.jax_ops: eager, jax.jit, vmap) and
TVM (ffi_dsa.tvm_relax: the DPS globals, and Relax through R.call_dps_packed; the
Relax cases skip without apache-tvm).
Each must give exactly the bytes of ffi_dsa.prefill_call on the same inputs, and name
mistakes before anything is written. The CUDA cases (marked cuda) run where a GPU is present.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest
import torch
import torch._dynamo.utils as dynamo_utils
import tvm_ffi

import ffi_dsa
from ffi_dsa.contract import NUM_HEADS, NUM_HEADS_NARROW
from ffi_dsa import prefill, torch_ops, tvm_relax
from ffi_dsa.prefill_workloads import make_exact_prefill_batch, make_prefill_batch

from conftest import SENTINEL, assert_all_written, poisoned, poisoned_np

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
K = 16
# Request lengths of two chunks whose M, N and K-relevant sizes all differ, so that dynamo cannot
# tie them together and the second chunk must reuse the dynamic graph.
CHUNK_A = ([120, 7, 60], [50, 7, 30])      # M = 87, N = 187
CHUNK_B = ([300, 33], [20, 33])            # M = 53, N = 333
CALLS = [pytest.param(s, i, id=f"{'sorted' if s else 'position'}-{i}") for s in (False, True)
         for i in ("relative", "absolute")]


def dps_result(batch, topk=K, *, sorted=False, ids="relative") -> np.ndarray:
    """ffi_dsa.prefill_call on numpy inputs into a poisoned buffer: the bytes every caller
    must reproduce."""
    out = poisoned_np((batch.rows, topk))
    ffi_dsa.prefill_call(*batch.args(), out, sorted=sorted, ids=ids)
    assert_all_written(out)
    return out


def assert_same(got, batch, topk=K, *, sorted=False, ids="relative") -> None:
    got = got.cpu().numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, dps_result(batch, topk, sorted=sorted, ids=ids))
    rows = ffi_dsa.reference_prefill_scores(*batch.args(), ids=ids)
    assert ffi_dsa.check_prefill_topk(got, *batch.args(), sorted=sorted, ids=ids, rows=rows) == []


# ----------------------------------------------------------------------------------------------
# torch
# ----------------------------------------------------------------------------------------------

def test_import_ffi_dsa_registers_the_ops():
    assert torch.ops.dsa.prefill_topk_indexer.default is torch_ops.prefill_topk_indexer
    assert "Tensor(a!) topk_indices" in str(torch.ops.dsa.prefill_topk_indexer_out.default._schema)


@pytest.mark.parametrize("sorted_,ids", CALLS)
def test_torch_functional_and_out_match_dps(sorted_, ids):
    batch = make_prefill_batch(*CHUNK_A[:1], queries=CHUNK_A[1], seed=1)
    args = batch.to_torch()
    got = torch.ops.dsa.prefill_topk_indexer(*args, topk=K, sorted=sorted_, ids=ids)
    assert got.shape == (batch.rows, K)
    assert_same(got, batch, sorted=sorted_, ids=ids)
    out = poisoned((batch.rows, K))
    assert torch.ops.dsa.prefill_topk_indexer_out(*args, out, sorted=sorted_, ids=ids) is None
    assert_same(out, batch, sorted=sorted_, ids=ids)


def test_torch_narrow_heads_uint8_views_and_default_topk():
    batch = make_exact_prefill_batch([2100, 40], queries=[3, 40], seed=2, heads=NUM_HEADS_NARROW)
    q, k, *rest = batch.to_torch()
    got = torch.ops.dsa.prefill_topk_indexer(q.view(torch.uint8), k.view(torch.int8), *rest)
    assert got.shape == (batch.rows, 2048)
    np.testing.assert_array_equal(got.numpy(), ffi_dsa.reference_prefill(*batch.args(), topk=2048))
    assert_same(got, batch, 2048)


def test_torch_opcheck():
    batch = make_prefill_batch(*CHUNK_A[:1], queries=CHUNK_A[1], seed=3)
    q, k, scale, w, ks, ke = batch.to_torch()
    out = torch.empty((batch.rows, K), dtype=torch.int32)
    qu, ku = q.view(torch.uint8), k.view(torch.uint8)
    for weights in (w, w.clone().requires_grad_()):
        torch.library.opcheck(torch.ops.dsa.prefill_topk_indexer.default,
                              (qu, ku, scale, weights, ks, ke, K, True, "absolute"))
        torch.library.opcheck(torch.ops.dsa.prefill_topk_indexer_out.default,
                              (qu, ku, scale, weights, ks, ke, out, False, "relative"))


def _step(q, k, scale, w, ks, ke, out):
    """Torch work around both ops, so that they sit inside a real graph (doubling the weights keeps
    every ranking and tie)."""
    idx = torch.ops.dsa.prefill_topk_indexer(q, k, scale, w * 2.0, ks, ke, K, False, "absolute")
    torch.ops.dsa.prefill_topk_indexer_out(q, k, scale, w, ks, ke, out, sorted=True)
    return idx, (idx >= 0).sum(dim=-1), out + 0


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_dynamic(backend):
    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    compiled = torch.compile(_step, backend=backend, fullgraph=True, dynamic=True)
    for seed, (lens, queries) in enumerate((CHUNK_A, CHUNK_B)):
        batch = make_prefill_batch(lens, queries=queries, seed=seed)
        args = batch.to_torch()
        out = poisoned((batch.rows, K))
        idx, count, out_copy = compiled(*args, out)
        assert_same(idx, batch, ids="absolute")
        assert_same(out, batch, sorted=True)
        torch.testing.assert_close(count, (idx >= 0).sum(dim=-1))
        torch.testing.assert_close(out_copy, out)
    assert dict(dynamo_utils.counters["graph_break"]) == {}
    assert dynamo_utils.counters["stats"]["unique_graphs"] == 1, "the second chunk recompiled"


@pytest.mark.parametrize("edit,error,match", [
    (lambda a: {**a, "weights": a["weights"].double()}, TypeError, "^weights must be float32"),
    (lambda a: {**a, "k": a["k"][:, :100].contiguous()}, ValueError, "^k dimension 1 must be 128"),
    (lambda a: {**a, "ke": a["ke"][:-1]}, ValueError, "^ke dimension 0"),
    (lambda a: {**a, "k_scale": None}, (TypeError, RuntimeError), "k_scale"),
])
def test_torch_errors_name_the_argument_and_write_nothing(edit, error, match):
    batch = make_prefill_batch(*CHUNK_A[:1], queries=CHUNK_A[1], seed=4)
    args = edit(dict(zip(("q", "k", "k_scale", "weights", "ks", "ke"), batch.to_torch())))
    with pytest.raises(error, match=match):
        torch.ops.dsa.prefill_topk_indexer(*args.values(), topk=K)
    out = poisoned((batch.rows, K))
    with pytest.raises(error, match=match):
        torch.ops.dsa.prefill_topk_indexer_out(*args.values(), out)
    assert (out == SENTINEL).all()


def test_torch_topk_and_ids_errors():
    args = make_prefill_batch(*CHUNK_A[:1], queries=CHUNK_A[1], seed=5).to_torch()
    with pytest.raises(ValueError, match="K <= 2048"):
        torch.ops.dsa.prefill_topk_indexer(*args, topk=4096)
    with pytest.raises(ValueError, match="^topk must be >= 0"):
        torch.ops.dsa.prefill_topk_indexer(*args, topk=-1)
    with pytest.raises(ValueError, match="^ids must be"):
        torch.ops.dsa.prefill_topk_indexer(*args, topk=K, ids="global")
    compiled = torch.compile(lambda *a: torch.ops.dsa.prefill_topk_indexer(*a, topk=K), backend="aot_eager",
                             fullgraph=True)
    torch._dynamo.reset()
    with pytest.raises(ValueError, match="^weights dimension 1"):
        compiled(*args[:3], args[3][:, :32].contiguous(), *args[4:])


# ----------------------------------------------------------------------------------------------
# JAX
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def jax_ops():
    pytest.importorskip("jax")
    pytest.importorskip("jax_tvm_ffi")
    from ffi_dsa import jax_ops

    return jax_ops


def jax_args(batch, fp8=True):
    import jax
    import jax.numpy as jnp

    cpu = jax.devices("cpu")[0]
    arrays = [jnp.asarray(a) for a in batch.args()]
    if fp8:
        arrays[0], arrays[1] = arrays[0].view(jnp.float8_e4m3fn), arrays[1].view(jnp.float8_e4m3fn)
    return [jax.device_put(a, cpu) for a in arrays]


@pytest.mark.parametrize("sorted_,ids", CALLS)
def test_jax_eager_and_jit_match_dps(jax_ops, sorted_, ids):
    import jax

    batch = make_prefill_batch(*CHUNK_A[:1], queries=CHUNK_A[1], seed=6)
    for fp8 in (True, False):
        args = jax_args(batch, fp8)
        assert_same(ffi_dsa.prefill_topk_indexer(*args, topk=K, sorted=sorted_, ids=ids), batch, sorted=sorted_, ids=ids)
    jitted = jax.jit(ffi_dsa.prefill_topk_indexer, static_argnames=("topk", "sorted", "ids"))
    assert_same(jitted(*args, topk=K, sorted=sorted_, ids=ids), batch, sorted=sorted_, ids=ids)


def test_jax_inside_a_larger_jit_and_through_the_package(jax_ops):
    import jax

    batch = make_prefill_batch(*CHUNK_B[:1], queries=CHUNK_B[1], seed=7)
    args = jax_args(batch)

    @jax.jit
    def step(q, k, scale, w, ks, ke):
        idx = ffi_dsa.prefill_topk_indexer(q, k, scale, w * 2.0, ks, ke, topk=K, ids="absolute")
        return idx, (idx >= 0).sum(axis=-1)

    idx, count = step(*args)
    assert_same(idx, batch, ids="absolute")
    np.testing.assert_array_equal(np.asarray(count), (np.asarray(idx) >= 0).sum(axis=-1))
    got = ffi_dsa.prefill_topk_indexer(*args, topk=K, sorted=True)
    assert isinstance(got, jax.Array)
    assert_same(got, batch, sorted=True)


def test_jax_vmap_over_chunks_sharing_k_is_one_call(jax_ops):
    """Chunks over one key buffer fold into one call on their rows stacked (no loop), same bytes."""
    import jax
    import jax.numpy as jnp

    chunk = make_exact_prefill_batch([90, 30], seed=10)
    q, k, k_scale, weights, ks, ke = jax_args(chunk)
    flip = lambda x: jnp.stack([x, x[::-1]])  # noqa: E731  (element 1: the rows in reverse order)
    fn = jax.jit(jax.vmap(lambda q_, w_, a_, b_: ffi_dsa.prefill_topk_indexer(q_, k, k_scale, w_, a_, b_, topk=K)))
    args = (flip(q), flip(weights), flip(ks), flip(ke))
    jaxpr = str(jax.make_jaxpr(fn)(*args))
    rows = 2 * len(chunk.ks)
    assert jaxpr.count("ffi_call[") == 1 and f"i32[{rows},{K}] = ffi_call" in jaxpr, jaxpr
    assert "while[" not in jaxpr and "scan[" not in jaxpr, jaxpr
    got = np.asarray(fn(*args))
    assert_same(got[0], chunk)
    np.testing.assert_array_equal(got[1], got[0][::-1])


def test_jax_vmap_runs_each_element(jax_ops):
    import jax
    import jax.numpy as jnp

    chunks = [make_exact_prefill_batch([90, 30], seed=seed) for seed in (8, 9)]
    stacked = [jnp.stack(parts) for parts in zip(*(jax_args(c) for c in chunks))]
    got = jax.jit(jax.vmap(lambda *a: ffi_dsa.prefill_topk_indexer(*a, topk=K)))(*stacked)
    for chunk, g in zip(chunks, np.asarray(got)):
        assert_same(g, chunk)


@pytest.mark.parametrize("index,edit,error,match", [
    (0, lambda a: a[:, :48], ValueError, "^q dimension 1 \\(H, index heads\\)"),
    (2, lambda a: a.astype("float16"), TypeError, "^k_scale must be float32"),
    (4, lambda a: a[:-1], ValueError, "^ks dimension 0"),
])
def test_jax_errors_raise_at_trace_time(jax_ops, index, edit, error, match):
    import jax

    args = jax_args(make_prefill_batch(*CHUNK_A[:1], queries=CHUNK_A[1], seed=10))
    args[index] = edit(args[index])
    with pytest.raises(error, match=match):
        ffi_dsa.prefill_topk_indexer(*args, topk=K)
    with pytest.raises(error, match=match):
        jax.jit(ffi_dsa.prefill_topk_indexer, static_argnames=("topk",))(*args, topk=K)


def test_jax_topk_and_ids_errors(jax_ops):
    args = jax_args(make_prefill_batch(*CHUNK_A[:1], queries=CHUNK_A[1], seed=11))
    with pytest.raises(ValueError, match="K <= 2048"):
        ffi_dsa.prefill_topk_indexer(*args, topk=4096)
    with pytest.raises(ValueError, match="^ids must be"):
        ffi_dsa.prefill_topk_indexer(*args, topk=K, ids="global")
    with pytest.raises(ValueError, match=r"^ks\[3\] = -1 is negative"):
        args[4] = args[4].at[3].set(-1)
        ffi_dsa.prefill_topk_indexer(*args, topk=K, validate=True)


@pytest.mark.cuda
@pytest.mark.parametrize("sorted_,ids", [(False, "relative"), (True, "absolute")])
def test_jax_gpu_matches_the_dps_call_under_jit(jax_ops, sorted_, ids):
    import jax

    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("needs a JAX GPU")
    batch = make_exact_prefill_batch(*CHUNK_A[:1], queries=CHUNK_A[1], seed=12)
    args = [jax.device_put(a, gpu) for a in jax_args(batch)]
    fn = jax.jit(ffi_dsa.prefill_topk_indexer, static_argnames=("topk", "sorted", "ids"))
    out = fn(*args, topk=K, sorted=sorted_, ids=ids)
    assert next(iter(out.devices())).platform == "gpu"
    np.testing.assert_array_equal(np.asarray(out), ffi_dsa.reference_prefill(*batch.args(), topk=K, sorted=sorted_,
                                                                             ids=ids))


# ----------------------------------------------------------------------------------------------
# TVM: the DPS globals (tvm-ffi only) and Relax R.call_dps_packed (apache-tvm)
# ----------------------------------------------------------------------------------------------

try:
    import tvm
except ImportError:
    tvm = None

needs_tvm = pytest.mark.skipif(tvm is None, reason="apache-tvm is not installed (pip install ffi-dsa[tvm])")


def chunk_with_an_empty_row(lens, queries, seed, **kwargs):
    """A ragged causal chunk whose row 1 is empty (ks == ke): its output row is all -1."""
    batch = make_prefill_batch(lens, queries=queries, seed=seed, **kwargs)
    batch.ke[1] = batch.ks[1]
    return batch


@pytest.mark.parametrize("sorted_,ids", CALLS)
def test_tvm_global_funcs_are_dps(sorted_, ids):
    tvm_relax.register_global_funcs()
    name = tvm_relax.global_name(prefill.OP, sorted=sorted_, ids=ids)
    assert name == "ffi_dsa.prefill_topk_indexer" + "_sorted" * sorted_ + "_absolute" * (ids == "absolute")
    batch = chunk_with_an_empty_row(*CHUNK_A, seed=20)
    out = poisoned_np((batch.rows, K))
    assert tvm_ffi.get_global_func(name)(*batch.args(), out) is None
    assert (out[1] == -1).all()
    assert_same(out, batch, sorted=sorted_, ids=ids)


def test_tvm_global_func_errors_name_the_argument_and_write_nothing():
    tvm_relax.register_global_funcs()
    fn = tvm_ffi.get_global_func(tvm_relax.global_name(prefill.OP))
    q, k, scale, w, ks, ke = make_prefill_batch(*CHUNK_A[:1], queries=CHUNK_A[1], seed=21).args()
    out = poisoned_np((len(ks), K))
    with pytest.raises(TypeError, match="^weights must be float32"):
        fn(q, k, scale, w.astype(np.float64), ks, ke, out)
    with pytest.raises(ValueError, match="^ke dimension 0"):
        fn(q, k, scale, w, ks, ke[:-1].copy(), out)
    with pytest.raises(ValueError, match="K <= 2048"):
        fn(q, k, scale, w, ks, ke, poisoned_np((len(ks), 4096)))
    assert (out == SENTINEL).all()


def tvm_args(batch, fp8=True):
    """The chunk as tvm.runtime.Tensors on the CPU, q and k as float8_e4m3fn or as their uint8 bytes."""
    q, k, *rest = batch.args()
    if fp8:
        q, k = q.view(ml_dtypes.float8_e4m3fn), k.view(ml_dtypes.float8_e4m3fn)
    return [tvm.runtime.tensor(a) for a in (q, k, *rest)]


@functools.cache
def prefill_vm(topk=K, sorted_=False, ids="relative"):
    return tvm_relax.build(tvm_relax.prefill_module(topk=topk, sorted=sorted_, ids=ids))


@needs_tvm
@pytest.mark.parametrize("sorted_,ids", CALLS)
def test_tvm_relax_matches_dps(sorted_, ids):
    """One build, symbolic M and N: two chunks of different sizes, each with an empty row, fp8 or
    uint8 q and k, give ffi_dsa.prefill_call's bytes."""
    vm = prefill_vm(K, sorted_, ids)
    for seed, (lens, queries) in enumerate((CHUNK_A, CHUNK_B)):
        batch = chunk_with_an_empty_row(lens, queries, seed=22 + seed, spare_keys=seed * 5)
        for fp8 in (True, False):
            got = vm["main"](*tvm_args(batch, fp8)).numpy()
            assert got.shape == (batch.rows, K)
            assert (got[1] == -1).all()
            assert_same(got, batch, sorted=sorted_, ids=ids)


@needs_tvm
def test_tvm_relax_default_topk_narrow_heads_and_an_empty_chunk():
    vm = prefill_vm(2048)
    for seed, heads in enumerate((NUM_HEADS, NUM_HEADS_NARROW)):
        batch = make_exact_prefill_batch([2100, 40], queries=[3, 40], seed=24 + seed, heads=heads)
        got = vm["main"](*tvm_args(batch)).numpy()
        np.testing.assert_array_equal(got, ffi_dsa.reference_prefill(*batch.args(), topk=2048))
        assert_same(got, batch, 2048)
    assert tuple(vm["main"](*tvm_args(make_prefill_batch([]))).shape) == (0, 2048)


@needs_tvm
@pytest.mark.parametrize("index,edit,error,match", [
    (3, lambda a: a.astype(np.float16), TypeError, "^weights must be float32"),
    (0, lambda a: a.astype(np.float32), TypeError, "^q must be float8_e4m3fn"),
    (1, lambda a: a[:, :100].copy(), ValueError, "^k dimension 1 must be 128"),
    (2, lambda a: a[:-1].copy(), ValueError, "^k_scale dimension 0"),
    (5, lambda a: a[:-1].copy(), ValueError, "^ke dimension 0"),
])
def test_tvm_relax_errors_come_from_the_kernel_checks(index, edit, error, match):
    args = list(make_prefill_batch(*CHUNK_A[:1], queries=CHUNK_A[1], seed=26).args())
    args[index] = edit(args[index])
    with pytest.raises(error, match=match):
        prefill_vm()["main"](*[tvm.runtime.tensor(a) for a in args])


@needs_tvm
def test_tvm_relax_topk_and_ids_errors():
    with pytest.raises(ValueError, match="^topk must be >= 0"):
        tvm_relax.prefill_module(topk=-1)
    with pytest.raises(ValueError, match="^topk must be <= 2048"):
        tvm_relax.prefill_module(topk=4096)
    with pytest.raises(TypeError, match="^topk must be an int"):
        tvm_relax.prefill_module(topk=16.0)
    with pytest.raises(ValueError, match="^ids must be"):
        tvm_relax.prefill_module(topk=K, ids="global")
