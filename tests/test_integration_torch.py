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
from ffi_dsa.contract import MAX_QUERIES, NUM_HEADS, NUM_HEADS_NARROW
from ffi_dsa import torch_ops
from ffi_dsa.workloads import make_batch

from conftest import SENTINEL, assert_exact, assert_same_as_call, call_result, load_script
from mtp_batches import FORMS, Form, mtp_batch, query_rows_shape
from mtp_batches import LENS as MTP_LENS

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
    assert torch.ops.dsa.topk_indexer.default is torch_ops.topk_indexer
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
    """Torch work around both ops, so the ops sit inside a real graph (any q rank: doubling the
    weights keeps every ranking and tie)."""
    idx = torch.ops.dsa.topk_indexer(q, k, w * 2.0, s, bt, K)
    torch.ops.dsa.topk_indexer_out(q, k, w, s, bt, out, sorted=True)
    return idx, (idx >= 0).sum(dim=-1), out + 0


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


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("topk", [4096, -1])
def test_compiled_topk_out_of_range_leads_with_its_message(dynamic, topk):
    """torch.compile runs the fake kernel while tracing: a topk no output can have is the op's own
    ValueError with its message first (not dynamo's "RuntimeError when making fake tensor call" with
    the message further down), for both ops, before any other check."""
    from ffi_dsa.prefill_workloads import make_prefill_batch

    _, decode_args = batch_on(LENS_A, "cpu")
    prefill_args = make_prefill_batch([300, 100], queries=[8, 4], seed=5).to_torch("cpu")
    expected = "topk must be <= 2048 (the kernel supports K <= 2048), got 4096" if topk > 0 else \
        "topk must be >= 0, got -1"
    for op, args in ((torch.ops.dsa.topk_indexer, decode_args), (torch.ops.dsa.prefill_topk_indexer, prefill_args)):
        torch._dynamo.reset()
        compiled = torch.compile(lambda *a: op(*a, topk=topk, sorted=True), fullgraph=True, dynamic=dynamic)
        with pytest.raises(ValueError) as err:
            compiled(*args)
        assert str(err.value).startswith(expected), str(err.value)


def capture_both_ops(static, out):
    """(graph, functional output): both ops captured in one CUDA graph on the `static` inputs, the out
    op writing `out`, the functional one sorted; warmed up (module built, attributes set) off the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.ops.dsa.topk_indexer_out(*static, out)
        torch.ops.dsa.topk_indexer(*static, topk=K)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        functional = torch.ops.dsa.topk_indexer(*static, topk=K, sorted=True)
        torch.ops.dsa.topk_indexer_out(*static, out)
    return graph, functional


@pytest.mark.cuda
def test_cuda_graph_capture_and_replay():
    batch, args = batch_on(LENS_A, "cuda")
    static = [a.clone() for a in args]
    out = torch.full((4, K), SENTINEL, dtype=torch.int32, device="cuda")
    graph, functional = capture_both_ops(static, out)
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
    (dict(topk=4096), ValueError, "K <= 2048"),  # (allocating: "topk must be <= 2048 (the kernel supports K <= 2048)")
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

        from ffi_dsa import jax_ops
    except ImportError:
        pass
    else:
        jargs = [jnp.asarray(batch.q).view(jnp.float8_e4m3fn), *map(jnp.asarray, batch.args()[1:])]
        results["jax"] = np.asarray(ffi_dsa.topk_indexer(*jargs, topk=K))
    try:
        import ml_dtypes
        import tvm

        from ffi_dsa import tvm_relax
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
    example_torch_decode = load_script("integration/example_torch_decode.py")

    torch._dynamo.reset()
    rc = example_torch_decode.main(["--device", device, "--backend", "aot_eager", "--steps", "2",
                                    "--batch", "3", "--context", "200", "--topk", "64"])
    assert rc == 0, capsys.readouterr().out
    assert capsys.readouterr().out.count("rows ok: True") == 2


# ---- several query tokens per row (MTP) and 32 heads: docs/contract.md §7 ---------------------
# On exact data (mtp_batches), every result must equal ffi_dsa.reference byte for byte.

@pytest.mark.parametrize("sorted_", [False, True])
@pytest.mark.parametrize("form", FORMS)
def test_mtp_functional_and_out_forms(device, form, sorted_):
    """The functional op returns [B, N, K] for a rank-4 q ([B, K] for rank 3); the out variant
    writes either output form, [B, N, K] or [B * N, K], with the same bytes."""
    batch = mtp_batch(form, seed=21)
    args = batch.to_torch(device)
    got = torch.ops.dsa.topk_indexer(*args, topk=K, sorted=sorted_)
    assert got.device == args[0].device and tuple(got.shape) == batch.output_shape(K)
    assert_exact(got, batch, K, sorted=sorted_, name="torch.ops.dsa.topk_indexer")
    for shape in {batch.output_shape(K), query_rows_shape(batch, K)}:
        out = torch.full(shape, SENTINEL, dtype=torch.int32, device=device)
        assert torch.ops.dsa.topk_indexer_out(*args, out, sorted=sorted_) is None
        assert out.cpu().numpy().tobytes() == got.cpu().numpy().tobytes(), f"out {shape}"


def test_mtp_weights_and_output_as_query_rows(device):
    """weights [B * N, H] are the bytes of [B, N, H]: the same result."""
    batch = mtp_batch(Form(2, NUM_HEADS), seed=22)
    q, k, w, s, bt = batch.to_torch(device)
    got = torch.ops.dsa.topk_indexer(q, k, w.reshape(-1, w.shape[-1]), s, bt, topk=K)
    assert_exact(got, batch, K)


def test_mtp_rank3_output_for_several_queries_is_refused(device):
    batch = mtp_batch(Form(2, NUM_HEADS), seed=23)
    out = torch.full((len(MTP_LENS), K), SENTINEL, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="topk_indices"):
        torch.ops.dsa.topk_indexer_out(*batch.to_torch(device), out)
    assert (out == SENTINEL).all()


@pytest.mark.parametrize("edit, match", [
    (lambda q, w, s: (torch.cat([q, q[:, :1]] * 2, dim=1), w, s), r"^q \(q_index_fp8\) dimension 1 \(N"),  # N = 5
    (lambda q, w, s: (q[:, :, :48].contiguous(), w[..., :48].contiguous(), s), r"\(H, index heads\)"),
    (lambda q, w, s: (q, w[:, :1].contiguous(), s), "weights"),
    (lambda q, w, s: (q, w, torch.stack([s] * 3, dim=1)), "seq_lens"),
])
def test_mtp_shape_errors(device, edit, match):
    """Mistakes in the new forms raise ValueError naming the argument, from the C++ check."""
    q, k, w, s, bt = mtp_batch(Form(2, NUM_HEADS), seed=24).to_torch(device)
    q, w, s = edit(q, w, s)
    with pytest.raises(ValueError, match=match):
        torch.ops.dsa.topk_indexer(q, k, w, s, bt, topk=K)


def test_opcheck_mtp(device):
    batch = mtp_batch(Form(2, NUM_HEADS_NARROW, per_query_lens=True), seed=25)
    q, k, w, s, bt = batch.to_torch(device)
    qu = q.view(torch.uint8)
    for out_shape in (batch.output_shape(K), query_rows_shape(batch, K)):
        out = torch.empty(out_shape, dtype=torch.int32, device=device)
        torch.library.opcheck(torch.ops.dsa.topk_indexer_out.default, (qu, k, w, s, bt, out, True))
    torch.library.opcheck(torch.ops.dsa.topk_indexer.default, (qu, k, w.clone().requires_grad_(), s, bt, K, False))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_mtp_dynamic_batch(device, backend):
    """N fixed, B changing: one graph for both batches; [B, N, K] out of the compiled op."""
    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    compiled = torch.compile(_step, backend=backend, fullgraph=True, dynamic=True)
    for seed, lens in enumerate((LENS_A, LENS_B)):
        batch = mtp_batch(Form(2, NUM_HEADS, per_query_lens=True), lens, seed=seed)
        out = torch.full(batch.output_shape(K), SENTINEL, dtype=torch.int32, device=device)
        idx, count, _ = compiled(*batch.to_torch(device), out)
        assert_exact(idx, batch, K, name="compiled functional")
        assert_exact(out, batch, K, sorted=True, name="compiled out variant")
        torch.testing.assert_close(count.cpu(), (idx >= 0).sum(dim=-1).cpu())
    assert dict(dynamo_utils.counters["graph_break"]) == {}
    assert dynamo_utils.counters["stats"]["unique_graphs"] == 1, "the second batch recompiled"


def test_compile_dynamic_n(device):
    """N is an ordinary dynamic dimension: N = 2, 3 and 4 share one graph. What does recompile, once
    each, is what dynamo guards on for any op: the first graph's H = 64 equals the cache's 64 tokens
    per page, so duck sizing ties the two and H = 32 compiles a graph in which H is free; N = 1 is
    specialized like every size-1 dimension; seq_lens [B, N] is another rank. Later calls of any of
    these kinds reuse their graphs."""
    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    compiled = torch.compile(_step, backend="aot_eager", fullgraph=True, dynamic=True)
    cases = [  # (form, row lengths, graphs compiled so far)
        (Form(2, NUM_HEADS), LENS_A, 1), (Form(3, NUM_HEADS), LENS_B, 1),
        (Form(MAX_QUERIES, NUM_HEADS), [70, 5, 200], 1),
        (Form(2, NUM_HEADS_NARROW), LENS_A, 2), (Form(MAX_QUERIES, NUM_HEADS_NARROW), [70, 5, 200], 2),
        (Form(3, NUM_HEADS), LENS_A, 2),
        (Form(1, NUM_HEADS), LENS_B, 3),
        (Form(2, NUM_HEADS, per_query_lens=True), LENS_A, 4),
        (Form(3, NUM_HEADS_NARROW, per_query_lens=True), LENS_B, 4),
    ]
    for seed, (form, lens, graphs) in enumerate(cases):
        batch = mtp_batch(form, lens, seed=seed)
        out = torch.full(batch.output_shape(K), SENTINEL, dtype=torch.int32, device=device)
        idx, _, _ = compiled(*batch.to_torch(device), out)
        assert_exact(idx, batch, K, name=form.id)
        assert_exact(out, batch, K, sorted=True, name=form.id)
        assert dynamo_utils.counters["stats"]["unique_graphs"] == graphs, form.id
    assert dict(dynamo_utils.counters["graph_break"]) == {}


@pytest.mark.cuda
def test_cuda_graph_capture_and_replay_mtp():
    """The MTP form captures and replays like the single-query one (new data, same shapes)."""
    form = Form(2, NUM_HEADS)
    static = [a.clone() for a in mtp_batch(form, seed=30).to_torch("cuda")]
    out = torch.full(query_rows_shape(mtp_batch(form, seed=30), K), SENTINEL, dtype=torch.int32, device="cuda")
    graph, functional = capture_both_ops(static, out)
    for seed in (31, 32):
        other = mtp_batch(form, seed=seed)
        for dst, src in zip(static, other.to_torch("cuda")):
            dst.copy_(src)
        out.fill_(SENTINEL)
        graph.replay()
        torch.cuda.synchronize()
        assert_exact(out.view(other.output_shape(K)), other, K, name="replayed out variant")
        assert_exact(functional, other, K, sorted=True, name="replayed functional")


def _jax_results(batch, topk, sorted_, device):
    """JAX jit and vmap (two requests sharing the cache, folded into one launch) on the platform
    of `device`; {} without JAX (or without a JAX GPU for "cuda")."""
    try:
        import jax
        import jax.numpy as jnp

        from ffi_dsa import jax_ops
        target = jax.devices("cpu" if device == "cpu" else "gpu")[0]
    except (ImportError, RuntimeError):
        return {}
    q, k, w, s, bt = [jax.device_put(a, target) for a in
                      (jnp.asarray(batch.q).view(jnp.float8_e4m3fn), *map(jnp.asarray, batch.args()[1:]))]
    jitted = jax.jit(ffi_dsa.topk_indexer, static_argnames=("topk", "sorted"))
    vmapped = jax.jit(jax.vmap(lambda q_, w_, s_, t_: ffi_dsa.topk_indexer(q_, k, w_, s_, t_, topk=topk,
                                                                          sorted=sorted_)))
    pair = vmapped(*(jnp.stack([x, x]) for x in (q, w, s, bt)))
    return {"jax.jit": np.asarray(jitted(q, k, w, s, bt, topk=topk, sorted=sorted_)),
            "jax.vmap[0]": np.asarray(pair[0]), "jax.vmap[1]": np.asarray(pair[1])}


def _tvm_results(batch, topk, sorted_, device):
    """The Relax program (R.call_dps_packed) for the batch's q rank; {} without apache-tvm."""
    try:
        import ml_dtypes
        import tvm

        from ffi_dsa import tvm_relax
    except ImportError:
        return {}
    if device == "cuda" and not (tvm.runtime.enabled("cuda") and tvm.cuda(0).exist):
        return {}
    dev = tvm.cpu() if device == "cpu" else tvm.cuda(0)
    vm = tvm_relax.build(tvm_relax.indexer_module(topk=topk, sorted=sorted_, q_rank=batch.q.ndim), device=dev)
    args = [tvm.runtime.tensor(a, device=dev) for a in (batch.q.view(ml_dtypes.float8_e4m3fn), *batch.args()[1:])]
    return {"tvm.relax": vm["main"](*args).numpy()}


@pytest.mark.parametrize("sorted_", [False, True])
@pytest.mark.parametrize("form", FORMS)
def test_all_callers_agree_on_mtp_batches(device, form, sorted_):
    """Every framework caller on the same MTP / 32-head inputs: the same bytes in the same shape,
    and those of ffi_dsa.reference (exact data). ffi_dsa.topk_indexer: test_callers.py."""
    batch = mtp_batch(form, seed=40)
    args = batch.to_torch(device)
    results = {"ffi_dsa.call (torch)": call_result(batch, K, sorted=sorted_, device=device),
               "ffi_dsa.call (torch, [B * N, K])": call_result(
                   batch, K, sorted=sorted_, device=device, shape=query_rows_shape(batch, K)).reshape(
                       batch.output_shape(K))}
    if device == "cpu":
        results["ffi_dsa.call (numpy)"] = call_result(batch, K, sorted=sorted_)
    results["torch.ops.dsa.topk_indexer"] = torch.ops.dsa.topk_indexer(*args, topk=K, sorted=sorted_)
    out = torch.full(batch.output_shape(K), SENTINEL, dtype=torch.int32, device=device)
    torch.ops.dsa.topk_indexer_out(*args, out, sorted=sorted_)
    results["torch.ops.dsa.topk_indexer_out"] = out
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: torch.ops.dsa.topk_indexer(*a, topk=K, sorted=sorted_),
                             backend="aot_eager", fullgraph=True, dynamic=True)
    results["torch.compile"] = compiled(*args)
    results.update(_jax_results(batch, K, sorted_, device))
    results.update(_tvm_results(batch, K, sorted_, device))
    for name, got in results.items():
        assert_exact(got, batch, K, sorted=sorted_, name=name)
