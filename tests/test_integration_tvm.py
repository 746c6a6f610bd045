"""TVM: the global packed functions, and a Relax program calling them through R.call_dps_packed.

The global-function tests need only tvm-ffi; the Relax ones skip cleanly without apache-tvm
(``pip install ffi-dsa[tvm]``). Results are compared byte for byte with ``ffi_dsa.call``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm_ffi

from ffi_dsa.contract import NUM_HEADS
from ffi_dsa import decode, tvm_relax
from ffi_dsa.workloads import make_batch

from conftest import CUDA, SENTINEL, assert_exact, assert_same_as_call, call_result
from mtp_batches import FORMS, Form, mtp_batch, query_rows_shape

try:
    import ml_dtypes
    import tvm
except ImportError:
    tvm = None

needs_tvm = pytest.mark.skipif(tvm is None, reason="apache-tvm is not installed (pip install ffi-dsa[tvm])")
TVM_CUDA = tvm is not None and CUDA and tvm.runtime.enabled("cuda") and tvm.cuda(0).exist
K = 16
LENS = [150, 3, 0, 300]


def assert_same(got, batch, topk=K, sorted=False, device="cpu"):
    assert_same_as_call(got if isinstance(got, np.ndarray) else got.numpy(), batch, topk, sorted=sorted, device=device)


@pytest.mark.parametrize("sorted_", [False, True])
def test_global_funcs_are_dps(sorted_):
    tvm_relax.register_global_funcs()
    fn = tvm_ffi.get_global_func(tvm_relax.global_name(decode.OP, sorted=sorted_))
    batch = make_batch(LENS, seed=1)
    out = np.full((4, K), SENTINEL, np.int32)
    assert fn(*batch.args(), out) is None
    assert_same(out, batch, sorted=sorted_)


def test_global_func_raises_value_and_type_errors():
    tvm_relax.register_global_funcs()
    fn = tvm_ffi.get_global_func(tvm_relax.global_name(decode.OP))
    batch = make_batch(LENS, seed=2)
    out = np.full((4, K), SENTINEL, np.int32)
    with pytest.raises(TypeError, match="weights must be float32"):
        fn(batch.q, batch.k_cache, batch.weights.astype(np.float64), batch.seq_lens, batch.block_table, out)
    with pytest.raises(ValueError, match="K <= 2048"):
        fn(*batch.args(), np.empty((4, 4096), np.int32))
    assert (out == SENTINEL).all()


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_global_func_on_cuda_tensors():
    tvm_relax.register_global_funcs()
    batch = make_batch(LENS, seed=3)
    out = torch.full((4, K), SENTINEL, dtype=torch.int32, device="cuda")
    tvm_ffi.get_global_func(tvm_relax.global_name(decode.OP))(*batch.to_torch("cuda"), out)
    torch.cuda.synchronize()
    assert_same(out.cpu().numpy(), batch, device="cuda")


def _tvm_args(batch, device, q_fp8=True):
    q = batch.q.view(ml_dtypes.float8_e4m3fn) if q_fp8 else batch.q
    return [tvm.runtime.tensor(a, device=device) for a in (q, *batch.args()[1:])]


def _devices():
    return ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda,
                                               pytest.mark.skipif(not TVM_CUDA, reason="needs TVM with CUDA")])]


@needs_tvm
@pytest.mark.parametrize("device_name", _devices())
@pytest.mark.parametrize("sorted_", [False, True])
def test_relax_call_dps_packed(device_name, sorted_):
    device = tvm.cpu() if device_name == "cpu" else tvm.cuda(0)
    vm = tvm_relax.build(tvm_relax.indexer_module(topk=K, sorted=sorted_), device=device)
    # one build, symbolic shapes: batches of different sizes, fp8 or uint8 q
    for seed, lens in enumerate((LENS, [70, 5, 200, 64, 1, 129])):
        batch = make_batch(lens, seed=seed, spare_pages=seed + 2)
        for q_fp8 in (True, False):
            got = vm["main"](*_tvm_args(batch, device, q_fp8))
            assert tuple(got.shape) == (len(lens), K)
            assert_same(got.numpy(), batch, sorted=sorted_, device=device_name)


@needs_tvm
def test_relax_empty_batch_and_default_topk():
    vm = tvm_relax.build(tvm_relax.indexer_module())
    assert tuple(vm["main"](*_tvm_args(make_batch([]), tvm.cpu())).shape) == (0, 2048)
    batch = make_batch([2100, 5], seed=4)
    assert_same(vm["main"](*_tvm_args(batch, tvm.cpu())).numpy(), batch, topk=2048)


@needs_tvm
@pytest.mark.parametrize("index, edit, error, match", [
    (2, lambda x: x.astype(np.float16), TypeError, "weights must be float32"),
    (0, lambda x: x.astype(np.float32), TypeError, "q_index_fp8"),
    (1, lambda x: x[..., :100].copy(), ValueError, "k_index_cache_fp8"),
    (4, lambda x: x[:2].copy(), ValueError, "block_table"),
])
def test_relax_errors_come_from_the_kernel_checks(index, edit, error, match):
    vm = tvm_relax.build(tvm_relax.indexer_module(topk=K))
    batch = make_batch(LENS, seed=5)
    args = [batch.q, *batch.args()[1:]]
    args[index] = edit(args[index])
    with pytest.raises(error, match=match):
        vm["main"](*[tvm.runtime.tensor(a) for a in args])


@needs_tvm
def test_relax_topk_errors():
    with pytest.raises(ValueError, match="topk must be >= 0"):
        tvm_relax.indexer_module(topk=-1)
    with pytest.raises(ValueError, match="topk must be <= 2048"):
        tvm_relax.indexer_module(topk=4096)


# ---- several query tokens per row (MTP) and 32 heads: docs/contract.md §7 ---------------------

@pytest.mark.parametrize("form", FORMS)
def test_global_funcs_take_the_mtp_forms(form):
    """The DPS globals write either output form, [B, N, K] or [B * N, K]: the reference's bytes."""
    tvm_relax.register_global_funcs()
    fn = tvm_ffi.get_global_func(tvm_relax.global_name(decode.OP))
    batch = mtp_batch(form, seed=60)
    for shape in (batch.output_shape(K), query_rows_shape(batch, K)):
        out = np.full(shape, SENTINEL, np.int32)
        assert fn(*batch.args(), out) is None
        assert_exact(out.reshape(batch.output_shape(K)), batch, K, name=str(shape))


@needs_tvm
@pytest.mark.parametrize("device_name", _devices())
@pytest.mark.parametrize("sorted_", [False, True])
def test_relax_mtp(device_name, sorted_):
    """q_rank=4: one build serves every N, H and seq_lens form; the output is [b, n, topk]."""
    device = tvm.cpu() if device_name == "cpu" else tvm.cuda(0)
    vm = tvm_relax.build(tvm_relax.indexer_module(topk=K, sorted=sorted_, q_rank=4), device=device)
    for seed, form in enumerate(f.values[0] for f in FORMS):
        if form.queries is None:
            continue
        batch = mtp_batch(form, seed=61 + seed)
        for q_fp8 in (True, False):
            got = vm["main"](*_tvm_args(batch, device, q_fp8)).numpy()
            assert_exact(got, batch, K, sorted=sorted_, name=form.id)
            np.testing.assert_array_equal(got, call_result(batch, K, sorted=sorted_, device=device_name))


@needs_tvm
def test_relax_mtp_errors():
    with pytest.raises(ValueError, match="q_rank must be 3"):
        tvm_relax.indexer_module(topk=K, q_rank=2)
    vm = tvm_relax.build(tvm_relax.indexer_module(topk=K, q_rank=4))
    batch = mtp_batch(Form(2, NUM_HEADS), seed=70)
    args = [batch.q, batch.k_cache, batch.weights[:, :1].copy(), batch.seq_lens, batch.block_table]
    with pytest.raises(ValueError, match="weights dimension 1"):
        vm["main"](*[tvm.runtime.tensor(a) for a in args])
