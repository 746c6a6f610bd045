"""torch.ops.dsa.topk_indexer / topk_indexer_out: results, opcheck, torch.compile, CUDA graphs, errors.

Every result is compared byte for byte with ``ffi_dsa.call`` on the same inputs and checked with
``ffi_dsa.check_topk``. The CUDA cases carry ``@pytest.mark.cuda`` and skip without a GPU.
Compiled variants are few on purpose (inductor compiles slowly on small CPUs).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch._dynamo.utils as dynamo_utils

import ffi_dsa
from ffi_dsa.integration import torch_op
from ffi_dsa.workloads import make_batch

from conftest import SENTINEL, assert_same_as_call, call_result

# inductor itself calls the deprecated torch.jit.script_method in torch 2.13
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
K = 16
# B, num_pages and max_pages differ from each other and between the two batches, so dynamo's
# duck sizing cannot tie them together and a second batch must reuse the dynamic graph.
LENS_A = [150, 3, 0, 300]            # B=4, 13 pages, 5 per row at most
LENS_B = [70, 5, 200, 64, 1, 129]    # B=6, 17 pages, 4 per row at most


def batch_on(lens, device, seed=0, spare_pages=4):
    batch = make_batch(lens, seed=seed, spare_pages=spare_pages)
    return batch, batch.to_torch(device)


def assert_same(got, batch, topk=K, sorted=False):
    assert_same_as_call(got.cpu().numpy(), batch, topk, sorted=sorted, device=got.device.type)


def test_import_ffi_dsa_registers_the_ops():
    assert torch.ops.dsa.topk_indexer.default is torch_op.topk_indexer_op
    assert "Tensor(a!) topk_indices" in str(torch.ops.dsa.topk_indexer_out.default._schema)


@pytest.mark.parametrize("sorted_", [False, True])
@pytest.mark.parametrize("q_dtype", [torch.float8_e4m3fn, torch.uint8])
def test_functional_matches_call(device, sorted_, q_dtype):
    batch, (q, k, w, s, bt) = batch_on(LENS_A, device)
    got = torch.ops.dsa.topk_indexer(q.view(q_dtype), k, w, s, bt, topk=K, sorted=sorted_)
    assert got.device == q.device and got.shape == (4, K)
    assert_same(got, batch, sorted=sorted_)


def test_default_topk_is_2048(device):
    batch, args = batch_on([2100, 5], device)
    got = torch.ops.dsa.topk_indexer(*args)
    assert got.shape == (2, 2048)
    assert_same(got, batch, topk=2048)


@pytest.mark.parametrize("sorted_", [False, True])
def test_out_variant_writes_in_place(device, sorted_):
    batch, args = batch_on(LENS_A, device)
    out = torch.full((4, K), SENTINEL, dtype=torch.int32, device=device)
    assert torch.ops.dsa.topk_indexer_out(*args, out, sorted=sorted_) is None
    assert_same(out, batch, sorted=sorted_)


def test_empty_batch(device):
    _, args = batch_on([], device)
    assert torch.ops.dsa.topk_indexer(*args, topk=K).shape == (0, K)
    out = torch.empty((0, K), dtype=torch.int32, device=device)
    torch.ops.dsa.topk_indexer_out(*args, out)


def test_opcheck(device):
    _, (q, k, w, s, bt) = batch_on(LENS_A, device)
    w_grad = w.clone().requires_grad_()
    out = torch.empty((4, K), dtype=torch.int32, device=device)
    qu = q.view(torch.uint8)
    for weights in (w, w_grad):
        torch.library.opcheck(torch.ops.dsa.topk_indexer.default, (qu, k, weights, s, bt, K, True))
        torch.library.opcheck(torch.ops.dsa.topk_indexer_out.default, (qu, k, weights, s, bt, out, False))
    # test_schema compares inputs before/after with allclose, which torch does not implement for
    # float8 on CPU: the fp8 q runs the other three checks.
    no_schema = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.dsa.topk_indexer.default, (q, k, w_grad, s, bt, K), test_utils=no_schema)
    torch.library.opcheck(torch.ops.dsa.topk_indexer_out.default, (q, k, w, s, bt, out), test_utils=no_schema)


def _step(q, k, w, s, bt, out):
    """Torch work around both ops, so the ops sit inside a real graph."""
    idx = torch.ops.dsa.topk_indexer(q, k, w * 2.0, s, bt, K)
    torch.ops.dsa.topk_indexer_out(q, k, w, s, bt, out, sorted=True)
    return idx, (idx >= 0).sum(dim=1), out + 0


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_dynamic(device, backend):
    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    compiled = torch.compile(_step, backend=backend, fullgraph=True, dynamic=True)
    for seed, lens in enumerate((LENS_A, LENS_B)):
        batch, args = batch_on(lens, device, seed=seed)
        out = torch.full((len(lens), K), SENTINEL, dtype=torch.int32, device=device)
        idx, count, out_copy = compiled(*args, out)
        ref = _step(*args, torch.empty_like(out))
        assert_same(idx, batch)
        assert_same(out, batch, sorted=True)
        torch.testing.assert_close(count, ref[1])
        torch.testing.assert_close(out_copy, out)
    assert dict(dynamo_utils.counters["graph_break"]) == {}
    assert dynamo_utils.counters["stats"]["unique_graphs"] == 1, "the second batch recompiled"


def test_compiled_op_raises_value_error(device):
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: torch.ops.dsa.topk_indexer(*a, topk=K), backend="aot_eager",
                             fullgraph=True)
    _, (q, k, w, s, bt) = batch_on(LENS_A, device)
    with pytest.raises(ValueError, match="k_index_cache_fp8"):
        compiled(q, k[..., :100], w, s, bt)


@pytest.mark.cuda
def test_cuda_graph_capture_and_replay():
    batch, args = batch_on(LENS_A, "cuda")
    static = [a.clone() for a in args]
    out = torch.full((4, K), SENTINEL, dtype=torch.int32, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (builds/loads the module) off the capture
        torch.ops.dsa.topk_indexer_out(*static, out)
        torch.ops.dsa.topk_indexer(*static, topk=K)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        functional = torch.ops.dsa.topk_indexer(*static, topk=K, sorted=True)
        torch.ops.dsa.topk_indexer_out(*static, out)
    for seed in (1, 2):  # new data of the same shapes, copied into the captured buffers
        other, new_args = batch_on(LENS_A, "cuda", seed=seed)
        for dst, src in zip(static, new_args):
            dst.copy_(src)
        out.fill_(SENTINEL)
        graph.replay()
        torch.cuda.synchronize()
        assert_same(out, other)
        assert_same(functional, other, sorted=True)


@pytest.mark.cuda
def test_cuda_runs_on_the_current_stream():
    batch, args = batch_on([3000, 2100, 7], "cuda", seed=3)
    torch.ops.dsa.topk_indexer(*args, topk=K)  # load the module first
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # keep the side stream busy: a wrong stream would read/write early
        out = torch.full((3, K), SENTINEL, dtype=torch.int32, device="cuda")
        torch.ops.dsa.topk_indexer_out(*args, out)
        copy = out.clone()
    side.synchronize()
    assert_same(copy, batch)


@pytest.mark.parametrize("bad, error, match", [
    (dict(w=lambda t: t.double()), TypeError, "weights must be float32"),
    (dict(q=lambda t: t.view(torch.uint8).float()), TypeError, "q_index_fp8"),
    (dict(s=lambda t: t.long()), TypeError, "seq_lens"),
    (dict(k=lambda t: t[:, :, :, :100]), ValueError, "k_index_cache_fp8"),
    (dict(bt=lambda t: t[:2]), ValueError, "block_table"),
    (dict(q=lambda t: t.transpose(1, 2).contiguous().transpose(1, 2)), ValueError, "contiguous"),
    (dict(topk=4096), ValueError, "K <= 2048"),
    (dict(topk=-1), ValueError, "topk must be >= 0"),
])
def test_errors(device, bad, error, match):
    _, (q, k, w, s, bt) = batch_on(LENS_A, device)
    args = dict(q=q, k=k, w=w, s=s, bt=bt)
    bad = dict(bad)  # the parametrize dict is shared by the cpu and cuda cases
    topk = bad.pop("topk", K)
    for name, edit in bad.items():
        args[name] = edit(args[name])
    with pytest.raises(error, match=match):
        torch.ops.dsa.topk_indexer(*args.values(), topk=topk)
    if topk >= 0:  # the out variant raises the same and writes nothing
        out = torch.full((4, topk), SENTINEL, dtype=torch.int32, device=device)
        with pytest.raises(error, match=match):
            torch.ops.dsa.topk_indexer_out(*args.values(), out)
        assert (out == SENTINEL).all()


def test_out_variant_checks_the_output(device):
    _, args = batch_on(LENS_A, device)
    with pytest.raises(TypeError, match="topk_indices must be int32"):
        torch.ops.dsa.topk_indexer_out(*args, torch.empty((4, K), dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="topk_indices"):
        torch.ops.dsa.topk_indexer_out(*args, torch.empty((3, K), dtype=torch.int32, device=device))


@pytest.mark.cuda
def test_mixed_devices_raise_value_error():
    _, (q, k, w, s, bt) = batch_on(LENS_A, "cuda")
    with pytest.raises(ValueError, match="one device"):
        torch.ops.dsa.topk_indexer(q, k, w.cpu(), s, bt, topk=K)
    with pytest.raises(ValueError):
        torch.ops.dsa.topk_indexer(q.cpu(), k, w, s, bt, topk=K)


def test_all_callers_agree_byte_for_byte():
    """ffi_dsa.call (numpy), the torch op, JAX and TVM Relax on the same inputs (CPU)."""
    batch = make_batch(LENS_B, seed=11, spare_pages=4)
    want = call_result(batch, K)
    results = {"torch.ops.dsa": torch.ops.dsa.topk_indexer(*batch.to_torch(), topk=K).numpy()}
    try:
        import jax.numpy as jnp

        from ffi_dsa.integration import jax_ffi
    except ImportError:
        pass
    else:
        jargs = [jnp.asarray(batch.q).view(jnp.float8_e4m3fn), *map(jnp.asarray, batch.args()[1:])]
        results["jax"] = np.asarray(jax_ffi.topk_indexer(*jargs, topk=K))
    try:
        import ml_dtypes
        import tvm

        from ffi_dsa.integration import tvm_relax
    except ImportError:
        pass
    else:
        vm = tvm_relax.build(tvm_relax.indexer_module(topk=K))
        targs = [tvm.runtime.tensor(batch.q.view(ml_dtypes.float8_e4m3fn)),
                 *map(tvm.runtime.tensor, batch.args()[1:])]
        results["tvm"] = vm["main"](*targs).numpy()
    for name, got in results.items():
        assert got.dtype == np.int32 and got.tobytes() == want.tobytes(), name
    assert ffi_dsa.check_topk(want, *batch.args()) == []


def test_example_decode_runs(device, capsys):
    from ffi_dsa.integration import example_torch_decode

    torch._dynamo.reset()
    rc = example_torch_decode.main(["--device", device, "--backend", "aot_eager", "--steps", "2",
                                    "--batch", "3", "--context", "200", "--topk", "64"])
    assert rc == 0, capsys.readouterr().out
    assert capsys.readouterr().out.count("rows ok: True") == 2
