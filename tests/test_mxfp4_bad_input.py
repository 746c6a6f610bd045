"""The MXFP4 op's caller mistakes (docs/contract.md §9 and §3): a named ValueError/TypeError before
anything is written, for the arguments MXFP4 adds (q's packing, q_scale, the page format) and those
it shares with decode; an FP8 page or query given to the MXFP4 op and an MXFP4 page given to the
FP8 op are named as such; bool options are strict; a CUDA tensor is refused (no CUDA kernel yet)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import ffi_dsa
from ffi_dsa import _op, mxfp4, torch_ops
from ffi_dsa.workloads import make_batch

from conftest import SENTINEL
from mxfp4_helpers import make_exact_mxfp4_batch

K = 64


def good_args():
    batch = make_exact_mxfp4_batch([150, 70], seed=61, queries=2)
    return dict(q=batch.q, q_scale=batch.q_scale, k_cache=batch.k_cache, weights=batch.weights,
                seq_lens=batch.seq_lens, block_table=batch.block_table,
                topk_indices=np.full((2, 2, K), SENTINEL, np.int32))


def assert_refused(error, pattern: str, **changes) -> None:
    """mxfp4_call with `changes` raises `error` matching `pattern` and writes nothing; so does
    mxfp4_topk_indexer where the bad argument is an input."""
    args = {**good_args(), **changes}
    out = args["topk_indices"]
    with pytest.raises(error, match=pattern):
        ffi_dsa.mxfp4_call(*args.values())
    if isinstance(out, np.ndarray) and out.dtype == np.int32:
        assert (out == SENTINEL).all(), "the output was written"
    if "topk_indices" not in changes:
        with pytest.raises(error, match=pattern):
            ffi_dsa.mxfp4_topk_indexer(*list(args.values())[:-1], topk=K)


def test_the_good_arguments_run():
    args = good_args()
    ffi_dsa.mxfp4_call(*args.values())
    assert (args["topk_indices"] != SENTINEL).all()


def test_an_fp8_page_given_to_the_mxfp4_op():
    fp8_pages = make_batch([150, 70], seed=62).k_cache
    assert_refused(ValueError, r"^k_cache holds FP8 pages \(132 bytes per token.*ffi_dsa\.call", k_cache=fp8_pages)


def test_an_mxfp4_page_given_to_the_fp8_op():
    batch = make_batch([150, 70], seed=63)
    mxfp4_pages = good_args()["k_cache"]
    out = np.full((2, K), SENTINEL, np.int32)
    with pytest.raises(ValueError, match=r"^k_cache \(k_index_cache_fp8\) holds MXFP4 pages \(68 bytes per token"
                                         r".*ffi_dsa\.mxfp4_call"):
        ffi_dsa.call(batch.q, mxfp4_pages, batch.weights, batch.seq_lens, batch.block_table, out)
    assert (out == SENTINEL).all()


def test_an_fp8_query_of_128_bytes_per_head():
    fp8_q = make_batch([150, 70], seed=64, queries=2).q  # [B, N, H, 128] fp8 bytes
    assert_refused(ValueError, r"^q has 128 bytes per head .*an FP8 query's.*64 bytes", q=fp8_q)


def test_a_float8_query_is_a_dtype_error():
    q = torch.from_numpy(good_args()["q"]).view(torch.float8_e4m3fn)
    assert_refused(TypeError, r"^q must be uint8 \(two E2M1 values per byte; int8 accepted\), got float8_e4m3fn", q=q)


@pytest.mark.parametrize("bad,pattern", [
    (lambda s: s.astype(np.uint32), r"^q_scale must be int32 \(four UE8M0 scale bytes per head"),
    (lambda s: s.astype(np.float32), r"^q_scale must be int32"),
    (lambda s: s.view(np.uint8), r"^q_scale must be int32"),
    (lambda s: s[..., :32], r"^q_scale dimension 2 must be 64 \(H, index heads, from q\)"),
    (lambda s: s[:, :1], r"^q_scale dimension 1 must be 2 \(N, query tokens per row, from q\)"),
    (lambda s: s.reshape(4, 64)[:3], r"^q_scale dimension 0 must be 4 \(B \* N, query rows, from q\)"),
    (lambda s: s.reshape(-1), r"^q_scale must have rank 2 \[B \* N, H\] or rank 3 \[B, N, H\]"),
], ids=["uint32", "float32", "bytes", "heads", "queries", "rows", "rank"])
def test_a_q_scale_of_the_wrong_shape_or_dtype(bad, pattern):
    error = TypeError if "must be int32" in pattern else ValueError
    assert_refused(error, pattern, q_scale=np.ascontiguousarray(bad(good_args()["q_scale"])))


def test_the_q_scale_of_b_times_n_rows_is_accepted():
    args = good_args()
    args["q_scale"] = args["q_scale"].reshape(4, 64)
    ffi_dsa.mxfp4_call(*args.values())


@pytest.mark.parametrize("change,error,pattern", [
    (dict(q=lambda q: q[:, :, :48]), ValueError, r"^q dimension 2 \(H, index heads\) must be 64 or 32"),
    (dict(q=lambda q: np.concatenate([q, q, q], axis=1)), ValueError, r"^q dimension 1 \(N, query tokens per row\)"),
    (dict(q=lambda q: q[..., :32]), ValueError, r"^q dimension 3 must be 64 \(bytes per head"),
    (dict(q=lambda q: q.astype(np.int32)), TypeError, r"^q must be uint8"),
    (dict(k_cache=lambda k: k.view(np.int8)), None, None),  # int8 is accepted
    (dict(k_cache=lambda k: k[..., :64]), ValueError, r"^k_cache dimension 3 must be 68 \(64 E2M1 value bytes"),
    (dict(k_cache=lambda k: k.astype(np.float32)), TypeError, r"^k_cache must be uint8 or int8"),
    (dict(k_cache=lambda k: k.reshape(-1, 64, 68)), ValueError, r"^k_cache must have rank 4 \[num_pages, 64, 1, 68\]"),
    (dict(weights=lambda w: w.astype(np.float64)), TypeError, r"^weights must be float32"),
    (dict(weights=lambda w: w[..., :32]), ValueError, r"^weights dimension 2 must be 64"),
    (dict(seq_lens=lambda s: s.astype(np.int64)), TypeError, r"^seq_lens must be int32"),
    (dict(block_table=lambda t: t[:1]), ValueError, r"^block_table dimension 0 must be 2"),
    (dict(topk_indices=lambda o: np.full((2, 2, 2049), SENTINEL, np.int32)), ValueError,
     r"^topk_indices has K=2049 columns.*K <= 2048"),
    (dict(topk_indices=lambda o: o.astype(np.int64)), TypeError, r"^topk_indices must be int32"),
    (dict(weights=lambda w: np.asfortranarray(w.reshape(4, 64))), ValueError, r"^weights must be contiguous"),
    (dict(q_scale=lambda s: None), TypeError, r"^q_scale must be a tensor"),
], ids=["heads", "n5", "head_bytes", "q_int32", "k_int8", "k_token_bytes", "k_float", "k_rank", "w_float64",
        "w_heads", "lens_int64", "table_rows", "k2049", "out_int64", "w_strided", "q_scale_none"])
def test_mistakes_name_their_argument(change, error, pattern):
    args = good_args()
    (name, make), = change.items()
    bad = make(args[name])
    if error is None:
        args[name] = bad
        ffi_dsa.mxfp4_call(*args.values())
        return
    assert_refused(error, pattern, **{name: bad})


def test_topk_of_the_allocating_form():
    args = list(good_args().values())[:-1]
    with pytest.raises(ValueError, match=r"topk must be <= 2048"):
        ffi_dsa.mxfp4_topk_indexer(*args, topk=2049)
    with pytest.raises(ValueError, match=r"topk must be >= 0"):
        ffi_dsa.mxfp4_topk_indexer(*args, topk=-1)


@pytest.mark.parametrize("option", ["sorted", "validate"])
@pytest.mark.parametrize("value", [1, 0, "yes", None, np.int32(1)], ids=["1", "0", "str", "None", "np_int"])
def test_bool_options_are_strict(option, value):
    args = good_args()
    kind = type(value).__name__ if type(value).__module__ == "builtins" else f"numpy.{type(value).__name__}"
    with pytest.raises(TypeError, match=rf"^{option} must be a bool \(True or False\), got {kind} "):
        ffi_dsa.mxfp4_call(*args.values(), **{option: value})
    assert (args["topk_indices"] == SENTINEL).all()
    with pytest.raises(TypeError, match=rf"^{option} must be a bool"):
        ffi_dsa.mxfp4_topk_indexer(*list(args.values())[:-1], topk=K, **{option: value})
    ffi_dsa.mxfp4_call(*args.values(), **{option: np.bool_(True)})  # numpy's bool is a bool


def test_a_bad_ids_or_bound_names_the_option():
    args = good_args()
    with pytest.raises(ValueError, match=r"^ids must be 'slots'"):
        ffi_dsa.mxfp4_call(*args.values(), ids="global")
    with pytest.raises(ValueError, match=r"^max_seq_len must be None or an int >= 0"):
        ffi_dsa.mxfp4_call(*args.values(), max_seq_len=-1)
    assert (args["topk_indices"] == SENTINEL).all()


class CudaLooking:
    """A DLPack-looking tensor on a CUDA device (this machine may have none): what the entry points
    see of a CUDA array before they reach a kernel."""

    def __init__(self, array):
        self.shape, self.dtype = array.shape, array.dtype
        self.device = torch.device("cuda", 0)

    def __dlpack__(self, *args, **kwargs):
        raise AssertionError("a CUDA tensor's data must not be reached: the op has no CUDA kernel")

    def __dlpack_device__(self):
        return (2, 0)


def test_a_cuda_tensor_is_refused_before_anything_is_written():
    args = {name: CudaLooking(a) for name, a in good_args().items()}
    message = re.escape("ffi_dsa.mxfp4_topk_indexer has no CUDA kernel yet (it runs on CPU tensors)")
    with pytest.raises(NotImplementedError, match=message):
        ffi_dsa.mxfp4_call(*args.values())
    with pytest.raises(NotImplementedError, match=message):
        ffi_dsa.mxfp4_topk_indexer(*list(args.values())[:-1], topk=K)
    functional, out_variant = torch_ops.real_kernels(mxfp4.OP)  # torch.ops.dsa.mxfp4_topk_indexer(_out)
    with pytest.raises(NotImplementedError, match=message):
        functional(*list(args.values())[:-1], K)
    with pytest.raises(NotImplementedError, match=message):
        out_variant(*args.values())
    with pytest.raises(NotImplementedError, match=message):
        mxfp4.OP.kernel_for("cuda")
    assert mxfp4.OP.devices == ("cpu",) and isinstance(mxfp4.OP, _op.Op)


def test_the_jax_gpu_target_is_refused():
    jax_ops = pytest.importorskip("ffi_dsa.jax_ops")
    with pytest.raises(NotImplementedError, match="no CUDA kernel yet"):
        jax_ops.register(mxfp4.OP, "gpu")


def test_the_tvm_global_refuses_a_cuda_tensor():
    from ffi_dsa import tvm_relax

    class TvmCudaLooking:
        class device:  # noqa: N801  (a tvm_ffi.Device's one method the global reads)
            @staticmethod
            def dlpack_device_type():
                return 2

    dps = tvm_relax._global_func(mxfp4.OP, mxfp4.OP.attrs({}))
    with pytest.raises(NotImplementedError, match="no CUDA kernel yet"):
        dps(*[TvmCudaLooking()] * 7)
