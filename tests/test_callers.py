"""docs/contract.md §5, entry points: one compiled op, many callers.

q may be float8_e4m3fn or "a uint8/int8 view of the same bytes"; the cache may be int8 or uint8. Every
caller form must give the same bytes. ``ffi_dsa.topk_indexer`` allocates in the caller's framework.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import ffi_dsa
from ffi_dsa.contract import NUM_HEADS
from ffi_dsa.workloads import make_batch

from conftest import (
    DEFAULT_K,
    assert_all_written,
    assert_exact,
    assert_valid_topk,
    make_exact_batch,
    poisoned,
    poisoned_np,
    run_dps,
)
from mtp_batches import FORMS, Form, mtp_batch, query_rows_shape


def _numpy_forms(batch):
    q, k, w, lens, table = batch.args()
    return {
        "numpy_q_uint8": (q, k, w, lens, table),
        "numpy_q_int8": (q.view(np.int8), k, w, lens, table),
        "numpy_q_float8_e4m3fn": (q.view(ml_dtypes.float8_e4m3fn), k, w, lens, table),
        "numpy_k_uint8": (q, k.view(np.uint8), w, lens, table),
    }


def _torch_forms(batch, device):
    q, k, w, lens, table = batch.to_torch(device)
    assert q.dtype == torch.float8_e4m3fn
    return {
        "torch_q_float8_e4m3fn": (q, k, w, lens, table),
        "torch_q_uint8": (q.view(torch.uint8), k, w, lens, table),
        "torch_q_int8": (q.view(torch.int8), k, w, lens, table),
        "torch_k_uint8": (q, k.view(torch.uint8), w, lens, table),
    }


@pytest.mark.parametrize("sorted_", [False, True], ids=["position_order", "sorted"])
def test_numpy_and_torch_cpu_callers_agree_byte_for_byte(sorted_):
    """numpy (q as uint8, int8, ml_dtypes float8_e4m3fn) and torch (q as float8_e4m3fn, uint8, int8)
    give identical bytes on the CPU."""
    batch = make_batch([3000, 2048, 5, 0], seed=70)
    results = {}
    for name, args in _numpy_forms(batch).items():
        out = poisoned_np((4, DEFAULT_K))
        ffi_dsa.call(*args, out, sorted=sorted_)
        assert_all_written(out)
        results[name] = out
    for name, args in _torch_forms(batch, "cpu").items():
        results[name] = run_dps(args, sorted=sorted_)
    first = results["numpy_q_uint8"]
    assert_valid_topk(first, batch, sorted=sorted_)
    for name, out in results.items():
        assert out.dtype == np.int32
        assert np.array_equal(out, first), f"{name} differs from numpy_q_uint8"


def test_torch_callers_agree_on_device(device):
    """On any device, the four torch forms of the same inputs give the same bytes."""
    batch = make_batch([5000, 100], seed=71)
    results = {name: run_dps(args) for name, args in _torch_forms(batch, device).items()}
    first = next(iter(results.values()))
    assert_valid_topk(first, batch)
    for name, out in results.items():
        assert np.array_equal(out, first), name


def test_topk_indexer_returns_numpy_for_numpy_input():
    """The allocating form returns int32 [B, topk] in the caller's array type: numpy for numpy."""
    batch = make_exact_batch([700, 30], seed=72)
    for name, args in _numpy_forms(batch).items():
        out = ffi_dsa.topk_indexer(*args, topk=100)
        assert isinstance(out, np.ndarray), name
        assert out.dtype == np.int32 and out.shape == (2, 100)
        assert_exact(out, batch, topk=100)
    out = ffi_dsa.topk_indexer(*batch.args(), topk=100, sorted=True)
    assert_exact(out, batch, topk=100, sorted=True)


def test_topk_indexer_returns_torch_for_torch_input(device):
    """... and a torch tensor on the inputs' device for torch."""
    batch = make_exact_batch([700, 30], seed=73)
    for name, args in _torch_forms(batch, device).items():
        out = ffi_dsa.topk_indexer(*args, topk=100)
        assert isinstance(out, torch.Tensor), name
        assert out.dtype == torch.int32 and tuple(out.shape) == (2, 100)
        assert out.device == args[0].device
        assert_exact(out.cpu().numpy(), batch, topk=100)


def test_default_topk_is_2048(device):
    batch = make_batch([3000], seed=74)
    out = ffi_dsa.topk_indexer(*batch.to_torch(device))
    assert tuple(out.shape) == (1, 2048)
    assert_valid_topk(out, batch)


def test_call_writes_in_place_and_returns_none(device):
    """Destination-passing style: call() writes topk_indices in place (same storage) and returns None."""
    batch = make_exact_batch([300, 100], seed=75)
    out = poisoned((2, 50), device)
    ptr = out.data_ptr()
    assert ffi_dsa.call(*batch.to_torch(device), out) is None
    assert out.data_ptr() == ptr
    assert_all_written(out)
    assert_exact(out.cpu().numpy(), batch, topk=50)


def test_numpy_output_buffer_with_torch_cpu_inputs():
    """Any DLPack tensors on one device work together: torch CPU inputs, numpy output."""
    batch = make_exact_batch([400], seed=76)
    out = poisoned_np((1, 64))
    ffi_dsa.call(*batch.to_torch("cpu"), out)
    assert_all_written(out)
    assert_exact(out, batch, topk=64)


class _DLPackOnly:
    """A minimal foreign array: only the DLPack protocol, no numpy or torch type."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()

    @property
    def shape(self):
        return self._array.shape


def test_any_dlpack_tensor_is_accepted_by_call():
    """ffi_dsa.call takes any DLPack tensor (here: objects that only implement the protocol)."""
    batch = make_exact_batch([500, 64], seed=77)
    out = poisoned_np((2, 32))
    ffi_dsa.call(*(_DLPackOnly(a) for a in batch.args()), _DLPackOnly(out))
    assert_all_written(out)
    assert_exact(out, batch, topk=32)


def test_validate_works_for_numpy_and_torch_inputs():
    batch = make_exact_batch([500, 64], seed=78)
    out = ffi_dsa.topk_indexer(*batch.args(), topk=32, validate=True)
    assert_exact(out, batch, topk=32)
    out_t = ffi_dsa.topk_indexer(*batch.to_torch("cpu"), topk=32, validate=True)
    assert np.array_equal(out_t.numpy(), out)


def test_inputs_are_not_modified(device):
    """The op only writes topk_indices: every input keeps its bytes."""
    batch = make_batch([900, 70], seed=79)
    args = batch.to_torch(device)
    before = [a.view(torch.uint8).clone() if a.dtype == torch.float8_e4m3fn else a.clone() for a in args]
    run_dps(args)
    run_dps(args, sorted=True)
    for a, b in zip(args, before):
        a = a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a
        assert torch.equal(a, b)



def test_read_only_numpy_inputs_work_and_a_read_only_output_is_refused():
    """numpy cannot export read-only arrays through DLPack (e.g. np.asarray of a JAX array): inputs are
    accepted anyway; a read-only output raises ValueError naming topk_indices, and nothing is written."""
    batch = make_batch([300, 90], seed=41)
    args = [a.copy() for a in batch.args()]
    for a in args:
        a.setflags(write=False)
    out = np.full((2, 16), -7, np.int32)
    ffi_dsa.call(*args, out)
    assert ffi_dsa.check_topk(out, *batch.args()) == []
    frozen = np.full((2, 16), -7, np.int32)
    frozen.setflags(write=False)
    with pytest.raises(ValueError, match="topk_indices"):
        ffi_dsa.call(*batch.args(), frozen)
    assert (frozen == -7).all()


# ---- several query tokens per row (MTP) and 32 heads: docs/contract.md §7 ---------------------

@pytest.mark.parametrize("form", FORMS)
def test_mtp_numpy_and_torch_forms_agree_with_the_reference(device, form):
    """Every dtype form of q and the cache, numpy (CPU) and torch, either output form ([B, N, K] and
    [B * N, K]) and either weights form ([B, N, H] and [B * N, H]): the reference's bytes."""
    batch = mtp_batch(form, seed=80)
    forms = dict(_torch_forms(batch, device))
    if device == "cpu":
        forms.update(_numpy_forms(batch))
    q, k, w, lens, table = batch.to_torch(device)
    forms["torch_weights_as_query_rows"] = (q, k, w.reshape(-1, w.shape[-1]), lens, table)
    for name, args in forms.items():
        for shape in (batch.output_shape(DEFAULT_K), query_rows_shape(batch, DEFAULT_K)):
            out = poisoned(shape, device) if isinstance(args[0], torch.Tensor) else poisoned_np(shape)
            ffi_dsa.call(*args, out)
            assert_all_written(out)
            got = out.cpu().numpy() if isinstance(out, torch.Tensor) else out
            assert_exact(got.reshape(batch.output_shape(DEFAULT_K)), batch, DEFAULT_K, name=f"{name} {shape}")


@pytest.mark.parametrize("form", FORMS)
def test_topk_indexer_allocates_the_mtp_output(device, form):
    """The allocating form returns [B, N, topk] for a rank-4 q ([B, topk] for rank 3), numpy for
    numpy and torch for torch, with the reference's bytes."""
    batch = mtp_batch(form, seed=81)
    inputs = {"torch": batch.to_torch(device)}
    if device == "cpu":
        inputs["numpy"] = batch.args()
    for name, args in inputs.items():
        for sorted_ in (False, True):
            out = ffi_dsa.topk_indexer(*args, topk=100, sorted=sorted_)
            assert isinstance(out, torch.Tensor if name == "torch" else np.ndarray), name
            assert tuple(out.shape) == batch.output_shape(100), name
            assert_exact(out, batch, 100, sorted=sorted_, name=name)


def test_mtp_validate_accepts_both_seq_lens_forms():
    """validate=True checks lengths on the host in either seq_lens form and leaves the result alone."""
    for form in (Form(2, NUM_HEADS), Form(2, NUM_HEADS, per_query_lens=True)):
        batch = mtp_batch(form, seed=82)
        out = poisoned_np(batch.output_shape(32))
        ffi_dsa.call(*batch.args(), out, validate=True)
        assert_exact(out, batch, 32, name=form.id)
