"""Every entry point of the MXFP4 op on the CPU (docs/contract.md §9), each compared byte for byte
with ``ffi_dsa.mxfp4_call`` on numpy arrays: the allocating form on numpy, torch and JAX arrays;
``torch.ops.dsa.mxfp4_topk_indexer`` and ``_out`` (eager, ``torch.compile(fullgraph=True)``,
``opcheck``); JAX under ``jax.jit``, ``jax.vmap`` and over a 4-device mesh; the TVM globals and a
Relax program."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import tvm_ffi
from torch._dynamo import utils as dynamo_utils

import ffi_dsa
from ffi_dsa import mxfp4, tvm_relax
from ffi_dsa.mxfp4_workloads import make_mxfp4_batch

from conftest import SENTINEL, script_env
from mxfp4_helpers import assert_valid_mxfp4, run_mxfp4

K = 512
LENS = [1500, 3, 0, 700]
FORMS = [dict(), dict(queries=2), dict(queries=4, heads=32)]
FORM_IDS = ["N1_rank3", "N2", "N4_H32"]


def batch_of(form: dict, seed: int = 0):
    return make_mxfp4_batch(LENS, seed=seed, **form)


def assert_same(got, batch, topk=K, **options):
    got = got.cpu().numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, run_mxfp4(batch, topk, **options))
    assert_valid_mxfp4(got, batch, sorted=options.get("sorted", False), ids=options.get("ids", "slots"))


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_allocating_form_on_numpy_and_torch(form):
    batch = batch_of(form, seed=1)
    for sorted_ in (False, True):
        assert_same(ffi_dsa.mxfp4_topk_indexer(*batch.args(), topk=K, sorted=sorted_), batch, sorted=sorted_)
        got = ffi_dsa.mxfp4_topk_indexer(*batch.to_torch(), topk=K, sorted=sorted_, ids="positions")
        assert isinstance(got, torch.Tensor)
        assert_same(got, batch, sorted=sorted_, ids="positions")


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_torch_ops_eager(form):
    batch = batch_of(form, seed=2)
    args = batch.to_torch()
    assert_same(torch.ops.dsa.mxfp4_topk_indexer(*args, K), batch)
    assert_same(torch.ops.dsa.mxfp4_topk_indexer(*args, topk=K, sorted=True, ids="positions", max_seq_len=1500),
                batch, sorted=True, ids="positions")
    out = torch.full(batch.output_shape(K), SENTINEL, dtype=torch.int32)
    torch.ops.dsa.mxfp4_topk_indexer_out(*args, out, sorted=True)
    assert_same(out, batch, sorted=True)


def test_opcheck():
    batch = batch_of(FORMS[1], seed=3)
    q, q_scale, k, w, s, bt = batch.to_torch()
    out = torch.empty(batch.output_shape(K), dtype=torch.int32)
    for weights in (w, w.clone().requires_grad_()):
        torch.library.opcheck(torch.ops.dsa.mxfp4_topk_indexer.default, (q, q_scale, k, weights, s, bt, K, True))
        torch.library.opcheck(torch.ops.dsa.mxfp4_topk_indexer_out.default, (q, q_scale, k, weights, s, bt, out, False))


def _step(q, q_scale, k, w, s, bt, out):
    """Torch work around both ops (doubling the weights keeps every ranking and tie)."""
    idx = torch.ops.dsa.mxfp4_topk_indexer(q, q_scale, k, w * 2.0, s, bt, K)
    torch.ops.dsa.mxfp4_topk_indexer_out(q, q_scale, k, w, s, bt, out, sorted=True)
    return idx, (idx >= 0).sum(dim=-1), out + 0


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_dynamic(backend):
    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    compiled = torch.compile(_step, backend=backend, fullgraph=True, dynamic=True)
    for seed, lens in enumerate((LENS, [900, 2100, 5])):
        batch = make_mxfp4_batch(lens, seed=seed, queries=2)
        out = torch.full(batch.output_shape(K), SENTINEL, dtype=torch.int32)
        idx, count, out_copy = compiled(*batch.to_torch(), out)
        assert_same(idx, batch)
        assert_same(out, batch, sorted=True)
        torch.testing.assert_close(out_copy, out)
        torch.testing.assert_close(count, (idx >= 0).sum(dim=-1))
    assert dict(dynamo_utils.counters["graph_break"]) == {}
    assert dynamo_utils.counters["stats"]["unique_graphs"] == 1, "the second batch recompiled"


def test_compiled_op_raises_the_named_error():
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: torch.ops.dsa.mxfp4_topk_indexer(*a, topk=K), backend="aot_eager",
                             fullgraph=True)
    q, q_scale, k, w, s, bt = batch_of(FORMS[0], seed=4).to_torch()
    with pytest.raises(TypeError, match="^q_scale must be int32"):
        compiled(q, q_scale.float(), k, w, s, bt)


# ---- JAX ------------------------------------------------------------------------------------------

jax = pytest.importorskip("jax")
pytest.importorskip("jax_tvm_ffi")
import jax.numpy as jnp  # noqa: E402

jitted = jax.jit(ffi_dsa.mxfp4_topk_indexer, static_argnames=("topk", "sorted", "ids", "max_seq_len"))
CPU = jax.devices("cpu")[0]


def on_cpu(arrays):
    """JAX arrays on the CPU (JAX's default device may be a GPU, where the op has no kernel yet)."""
    return [jax.device_put(jnp.asarray(a), CPU) for a in arrays]


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_jax_eager_and_jit(form):
    batch = batch_of(form, seed=5)
    args = on_cpu(batch.args())
    got = ffi_dsa.mxfp4_topk_indexer(*args, topk=K)
    assert isinstance(got, jax.Array)
    assert_same(got, batch)
    assert_same(jitted(*args, topk=K, sorted=True, ids="positions", max_seq_len=2048), batch, sorted=True,
                ids="positions")


def test_jax_trace_time_errors_name_the_argument():
    args = on_cpu(batch_of(FORMS[0], seed=6).args())
    args[1] = args[1][:, :32]
    with pytest.raises(ValueError, match=r"^q_scale dimension 1 must be 64"):
        jitted(*args, topk=K)


def test_jax_vmap_over_batches_sharing_the_cache():
    """vmap over stacked batches that share one cache: one call on the rows stacked, each element
    the answer of its own call."""
    first, second = batch_of(FORMS[1], seed=7), batch_of(FORMS[1], seed=8)
    second.k_cache = first.k_cache  # shared cache (same shapes: same lengths)
    stacked = on_cpu(np.stack([a, b]) for a, b in zip(first.args(), second.args()))
    (cache,) = on_cpu([first.k_cache])
    fn = jax.vmap(lambda q, qs, w, s, bt: ffi_dsa.mxfp4_topk_indexer(q, qs, cache, w, s, bt, topk=K))
    got = np.asarray(fn(stacked[0], stacked[1], stacked[3], stacked[4], stacked[5]))
    assert_same(got[0], first)
    assert_same(got[1], second)


_MESH_SCRIPT = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import ffi_dsa
    from ffi_dsa.mxfp4_workloads import make_mxfp4_batch

    assert len(jax.devices("cpu")) == 4
    batch = make_mxfp4_batch([900, 3, 0, 1400, 64, 2049, 10, 700], seed=9, queries=2)
    expected = np.full(batch.output_shape(512), -7, np.int32)
    ffi_dsa.mxfp4_call(*batch.args(), expected)
    mesh = Mesh(np.array(jax.devices("cpu")), ("x",))
    row, whole = NamedSharding(mesh, P("x")), NamedSharding(mesh, P())
    specs = (row, row, whole, row, row, row)  # the cache replicated, every per-row input split
    args = [jax.device_put(jnp.asarray(a), s) for a, s in zip(batch.args(), specs)]
    fn = jax.jit(lambda *a: ffi_dsa.mxfp4_topk_indexer(*a, topk=512))
    text = fn.lower(*args).compile().as_text()
    assert "all-gather" not in text and "all-to-all" not in text, "the batch operands were gathered"
    got = fn(*args)
    assert got.sharding.spec[0] == "x", got.sharding
    np.testing.assert_array_equal(np.asarray(got), expected)
    print("mesh ok")
''')


def test_jax_over_a_4_device_mesh(tmp_path):
    """Row-sharded inputs under a jit over a mesh: one local call per device on its rows, no
    collective of the operands, the bytes of the one-device call (a fresh process: the 4 CPU devices
    must exist before JAX starts)."""
    script = tmp_path / "mesh.py"
    script.write_text(_MESH_SCRIPT)
    flags = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env={**script_env(), "XLA_FLAGS": flags},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "mesh ok" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]


# ---- TVM ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sorted_", [False, True])
@pytest.mark.parametrize("ids", ["slots", "positions"])
def test_tvm_globals_are_dps(sorted_, ids):
    tvm_relax.register_global_funcs()
    name = tvm_relax.global_name(mxfp4.OP, sorted=sorted_, ids=ids)
    suffix = ("_sorted" if sorted_ else "") + ("_positions" if ids != "slots" else "")
    assert name == "ffi_dsa.mxfp4_topk_indexer" + suffix
    batch = batch_of(FORMS[1], seed=10)
    out = np.full(batch.output_shape(K), SENTINEL, np.int32)
    assert tvm_ffi.get_global_func(name)(*batch.args(), out) is None
    assert_same(out, batch, sorted=sorted_, ids=ids)
    out[...] = SENTINEL  # with the run-time bound between the inputs and the output
    tvm_ffi.get_global_func(name)(*batch.args(), 4096, out)
    assert_same(out, batch, sorted=sorted_, ids=ids)


def test_tvm_global_raises_the_named_error():
    tvm_relax.register_global_funcs()
    batch = batch_of(FORMS[0], seed=11)
    out = np.full(batch.output_shape(K), SENTINEL, np.int32)
    args = list(batch.args())
    args[2] = np.zeros((4, 64, 1, 132), np.uint8)  # FP8 pages
    with pytest.raises(ValueError, match="^k_cache holds FP8 pages"):
        tvm_ffi.get_global_func("ffi_dsa.mxfp4_topk_indexer")(*args, out)
    assert (out == SENTINEL).all()


@pytest.mark.parametrize("q_rank", [3, 4])
def test_tvm_relax_program(q_rank):
    tvm = pytest.importorskip("tvm")
    batch = batch_of(FORMS[0] if q_rank == 3 else FORMS[2], seed=12)
    vm = tvm_relax.build(tvm_relax.mxfp4_module(topk=K, sorted=True, q_rank=q_rank, with_max_seq_len=True),
                         device=tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(a) for a in batch.args()], 2048)
    assert_same(got.numpy(), batch, sorted=True)
