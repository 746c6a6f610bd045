"""docs/contract.md §3, caller mistakes: raise before anything is launched or written.

"Wrong dtype, rank, shape, device, non-contiguous memory, mismatched devices, K larger than the kernel
supports: a clear Python exception (ValueError/TypeError) naming the argument and what was expected.
Nothing is launched and nothing is written."

Every case below poisons the output, checks the exception type, checks that the message names the
argument, and checks that the output (and, where the output itself is the bad argument, that buffer
too) still holds the sentinel. A message names the argument as the caller typed it, ffi_dsa.call's
parameter name, first (docs/contract.md's name for q and k_cache follows in parentheses).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import ffi_dsa
from ffi_dsa.workloads import make_batch

from conftest import SENTINEL, assert_all_written, poisoned, poisoned_np

B, K = 2, 64
NAMES = ("q", "k", "w", "lens", "table", "out")
ARG_NAME = {"q": "q", "k": "k_cache", "w": "weights", "lens": "seq_lens", "table": "block_table",
            "out": "topk_indices"}
CONTRACT_NAME = {"q": "q_index_fp8", "k": "k_index_cache_fp8"}


def assert_names(message: str, which: str) -> None:
    """The message starts with the argument's name as ffi_dsa.call spells it."""
    name = ARG_NAME[which]
    assert message.startswith(f"{name} "), f"the message must start with {name}: {message}"


def names_first(which: str) -> str:
    """A pytest.raises(match=...) pattern: the message starts with the argument's name."""
    return rf"^{ARG_NAME[which]} "


def _good_args(device):
    batch = make_batch([150, 70], seed=60)
    q, k, w, lens, table = batch.to_torch(device)
    return dict(q=q, k=k, w=w, lens=lens, table=table, out=poisoned((B, K), device))


def _transposed(t):
    """Same shape and values, column-major memory: a non-contiguous view."""
    if t.dim() == 1:
        return _strided(t)
    return t.transpose(0, 1).contiguous().transpose(0, 1)


def _strided(t):
    """Same shape and values, every other element of a larger buffer: a non-contiguous view."""
    raw = t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t
    shape = list(raw.shape)
    shape[-1] *= 2
    big = torch.zeros(shape, dtype=raw.dtype, device=raw.device)
    big[..., ::2] = raw
    view = big[..., ::2]
    return view.view(t.dtype) if t.dtype == torch.float8_e4m3fn else view


def _poison_value(dtype):
    if dtype.is_floating_point:
        return -7.0
    return 0xEE if dtype == torch.uint8 else SENTINEL


def _poisoned_like(t, dtype=None, shape=None):
    dtype = dtype or t.dtype
    return torch.full(shape or tuple(t.shape), _poison_value(dtype), dtype=dtype, device=t.device)


# (case id, argument that is wrong, mutation of that argument, expected exception)
CASES = [
    # --- wrong dtype: TypeError ---
    ("q_float32", "q", lambda a: a["q"].view(torch.uint8).float(), TypeError),
    ("q_float16", "q", lambda a: a["q"].view(torch.uint8).half(), TypeError),
    ("q_bfloat16", "q", lambda a: a["q"].view(torch.uint8).bfloat16(), TypeError),
    ("q_float8_e5m2", "q", lambda a: a["q"].view(torch.uint8).view(torch.float8_e5m2), TypeError),
    ("q_int32", "q", lambda a: a["q"].view(torch.uint8).int(), TypeError),
    ("k_float32", "k", lambda a: a["k"].float(), TypeError),
    ("k_int16", "k", lambda a: a["k"].short(), TypeError),
    ("k_float8", "k", lambda a: a["k"].view(torch.float8_e4m3fn), TypeError),
    ("weights_float64", "w", lambda a: a["w"].double(), TypeError),
    ("weights_bfloat16", "w", lambda a: a["w"].bfloat16(), TypeError),
    ("weights_float16", "w", lambda a: a["w"].half(), TypeError),
    ("seq_lens_int64", "lens", lambda a: a["lens"].long(), TypeError),
    ("seq_lens_int16", "lens", lambda a: a["lens"].short(), TypeError),
    ("seq_lens_float32", "lens", lambda a: a["lens"].float(), TypeError),
    ("block_table_int64", "table", lambda a: a["table"].long(), TypeError),
    ("block_table_float32", "table", lambda a: a["table"].float(), TypeError),
    ("out_int64", "out", lambda a: _poisoned_like(a["out"], torch.int64), TypeError),
    ("out_float32", "out", lambda a: _poisoned_like(a["out"], torch.float32), TypeError),
    ("out_uint8", "out", lambda a: _poisoned_like(a["out"], torch.uint8), TypeError),
    # --- wrong rank: ValueError ---
    ("q_rank2", "q", lambda a: a["q"][0], ValueError),
    ("q_rank5", "q", lambda a: a["q"][None, None], ValueError),
    ("k_rank3", "k", lambda a: a["k"].reshape(-1, 64, 132), ValueError),
    ("weights_rank1", "w", lambda a: a["w"].reshape(-1), ValueError),
    ("weights_rank3", "w", lambda a: a["w"][..., None], ValueError),  # [B, N=64, H=1] for N = 1
    ("weights_rank4", "w", lambda a: a["w"][..., None, None], ValueError),
    ("seq_lens_rank2_N2", "lens", lambda a: a["lens"][:, None].repeat(1, 2), ValueError),  # [B, 2] for N = 1
    ("seq_lens_rank3", "lens", lambda a: a["lens"][:, None, None], ValueError),
    ("seq_lens_rank0", "lens", lambda a: a["lens"][0], ValueError),
    ("block_table_rank1", "table", lambda a: a["table"].reshape(-1), ValueError),
    ("out_rank1", "out", lambda a: _poisoned_like(a["out"], shape=(B * K,)), ValueError),
    ("out_rank3", "out", lambda a: _poisoned_like(a["out"], shape=(B, K, 1)), ValueError),  # [B, N=K, 1] for N = 1
    ("out_rank4", "out", lambda a: _poisoned_like(a["out"], shape=(B, 1, K, 1)), ValueError),
    # --- wrong shape: ValueError ---
    ("q_H63", "q", lambda a: a["q"][:, :63].contiguous(), ValueError),
    ("q_H65", "q", lambda a: torch.cat([a["q"].view(torch.uint8), a["q"].view(torch.uint8)[:, :1]], 1)
     .view(torch.float8_e4m3fn), ValueError),
    ("q_D127", "q", lambda a: a["q"][:, :, :127].contiguous(), ValueError),
    ("q_D132", "q", lambda a: torch.zeros((B, 64, 132), dtype=torch.uint8, device=a["q"].device), ValueError),
    ("weights_H63", "w", lambda a: a["w"][:, :63].contiguous(), ValueError),
    ("k_page_bytes_128", "k", lambda a: a["k"][..., :128].contiguous(), ValueError),
    ("k_tokens_per_page_32", "k", lambda a: a["k"].reshape(-1, 32, 1, 132), ValueError),
    ("k_two_key_heads", "k", lambda a: a["k"].reshape(-1, 32, 2, 132), ValueError),
    # --- batch mismatch between arguments: ValueError, names the argument that disagrees with q ---
    ("weights_batch", "w", lambda a: torch.cat([a["w"], a["w"][:1]]), ValueError),
    ("seq_lens_batch", "lens", lambda a: a["lens"][:1].contiguous(), ValueError),
    ("block_table_batch", "table", lambda a: torch.cat([a["table"], a["table"]]), ValueError),
    ("out_batch", "out", lambda a: _poisoned_like(a["out"], shape=(B + 1, K)), ValueError),
    # --- K larger than the kernel supports: ValueError ---
    ("out_K2049", "out", lambda a: _poisoned_like(a["out"], shape=(B, 2049)), ValueError),
    ("out_K4096", "out", lambda a: _poisoned_like(a["out"], shape=(B, 4096)), ValueError),
    # --- non-contiguous memory: ValueError ---
    ("q_transposed", "q", lambda a: _transposed(a["q"].view(torch.uint8)).view(torch.float8_e4m3fn), ValueError),
    ("q_strided", "q", lambda a: _strided(a["q"]), ValueError),
    ("k_strided_pages", "k", lambda a: torch.stack([a["k"], a["k"]], 1)[:, 0], ValueError),
    ("weights_transposed", "w", lambda a: _transposed(a["w"]), ValueError),
    ("weights_strided", "w", lambda a: _strided(a["w"]), ValueError),
    ("seq_lens_strided", "lens", lambda a: _strided(a["lens"]), ValueError),
    ("block_table_transposed", "table", lambda a: _transposed(a["table"]), ValueError),
    ("out_transposed", "out", lambda a: _transposed(a["out"]), ValueError),
    ("out_strided", "out", lambda a: _strided(a["out"]), ValueError),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_argument_raises_names_it_and_writes_nothing(device, case):
    """Each mistake raises the contract's exception type, names the argument, and writes nothing."""
    _, which, mutate, exc_type = case
    args = _good_args(device)
    original_out = args["out"]
    args[which] = mutate(args)
    if "transposed" in case[0] or "strided" in case[0]:
        assert not args[which].is_contiguous(), "the test must build a non-contiguous view"

    with pytest.raises(exc_type) as exc:
        ffi_dsa.call(*(args[n] for n in NAMES))
    assert_names(str(exc.value), which)
    for buffer in (original_out, args["out"]):
        assert (buffer.cpu() == _poison_value(buffer.dtype)).all(), "nothing may be written when rejected"


def test_the_good_arguments_of_the_bad_input_cases_run(device):
    """Control for the table above: unmutated, the same arguments run and fill the output."""
    args = _good_args(device)
    ffi_dsa.call(*(args[n] for n in NAMES))
    assert_all_written(args["out"])


def test_messages_say_what_was_expected():
    """The message says what was expected, not only which argument was wrong."""
    args = _good_args("cpu")
    cases = [
        ("w", args["w"].double(), "float32"),
        ("lens", args["lens"].long(), "int32"),
        ("q", args["q"][:, :63].contiguous(), "64"),
        ("k", args["k"][..., :128].contiguous(), "132"),
        ("out", torch.empty((B, 4096), dtype=torch.int32), "2048"),
        ("w", _transposed(args["w"]), "contiguous"),
    ]
    for which, bad, expected in cases:
        a = dict(args, **{which: bad})
        with pytest.raises((TypeError, ValueError)) as exc:
            ffi_dsa.call(*(a[n] for n in NAMES))
        assert expected in str(exc.value), str(exc.value)


def test_topk_indexer_rejects_k_above_2048_and_negative_k(device):
    """The allocating wrapper names topk, which its caller typed (not topk_indices, an output the caller
    never made): topk > 2048 and a negative topk are ValueErrors."""
    args = _good_args(device)
    five = [args[n] for n in NAMES[:5]]
    for topk in (2049, 4096):
        with pytest.raises(ValueError, match=rf"^topk must be <= 2048 .*, got {topk}$"):
            ffi_dsa.topk_indexer(*five, topk=topk)
    with pytest.raises(ValueError, match="^topk must be >= 0"):
        ffi_dsa.topk_indexer(*five, topk=-1)


def test_k_above_2048_names_the_output_and_topk():
    """The C++ check behind every entry point: a DPS caller's output too wide is named first; the
    allocating entry points that reach it (torch.ops.dsa.topk_indexer, JAX, TVM) see their topk in it."""
    args = _good_args("cpu")
    args["out"] = torch.empty((B, 4096), dtype=torch.int32)
    with pytest.raises(ValueError) as exc:
        ffi_dsa.call(*(args[n] for n in NAMES))
    assert_names(str(exc.value), "out")
    assert "K=4096" in str(exc.value) and "topk=4096" in str(exc.value) and "K <= 2048" in str(exc.value)


@pytest.mark.parametrize("which, bad", [
    ("q", lambda a: a["q"].view(torch.uint8).float()),
    ("q", lambda a: a["q"][:, :63].contiguous()),
    ("k", lambda a: a["k"].float()),
    ("k", lambda a: a["k"][..., :128].contiguous()),
])
def test_q_and_k_cache_messages_give_the_contracts_name_too(which, bad):
    """q and k_cache are q_index_fp8 and k_index_cache_fp8 in docs/contract.md: the message says both."""
    args = _good_args("cpu")
    args[which] = bad(args)
    with pytest.raises((TypeError, ValueError)) as exc:
        ffi_dsa.call(*(args[n] for n in NAMES))
    assert str(exc.value).startswith(f"{ARG_NAME[which]} ({CONTRACT_NAME[which]}) "), str(exc.value)


# ----------------------------------------------------------------------------------------------
# numpy callers
# ----------------------------------------------------------------------------------------------

def _np_args():
    batch = make_batch([150, 70], seed=61)
    return dict(q=batch.q, k=batch.k_cache, w=batch.weights, lens=batch.seq_lens, table=batch.block_table,
                out=poisoned_np((B, K)))


NP_CASES = [
    ("q_float32", "q", lambda a: a["q"].astype(np.float32), TypeError),
    ("q_int32", "q", lambda a: a["q"].astype(np.int32), TypeError),
    ("weights_float64", "w", lambda a: a["w"].astype(np.float64), TypeError),
    ("seq_lens_int64", "lens", lambda a: a["lens"].astype(np.int64), TypeError),
    ("block_table_uint32", "table", lambda a: a["table"].astype(np.uint32), TypeError),
    ("q_H63", "q", lambda a: np.ascontiguousarray(a["q"][:, :63]), ValueError),
    ("q_strided", "q", lambda a: np.repeat(a["q"], 2, axis=2)[:, :, ::2], ValueError),
    ("weights_transposed", "w", lambda a: np.asfortranarray(a["w"]), ValueError),
    ("seq_lens_batch", "lens", lambda a: a["lens"][:1].copy(), ValueError),
    ("out_K4096", "out", lambda a: poisoned_np((B, 4096)), ValueError),
]


@pytest.mark.parametrize("case", NP_CASES, ids=[c[0] for c in NP_CASES])
def test_numpy_bad_argument_raises_names_it_and_writes_nothing(case):
    _, which, mutate, exc_type = case
    args = _np_args()
    original_out = args["out"]
    args[which] = mutate(args)
    with pytest.raises(exc_type) as exc:
        ffi_dsa.call(*(args[n] for n in NAMES))
    assert_names(str(exc.value), which)
    assert (original_out == SENTINEL).all() and (args["out"] == SENTINEL).all()


@pytest.mark.parametrize("fp8_type", ["float8_e5m2", "float8_e4m3fnuz", "float8_e4m3b11fnuz"])
def test_numpy_q_in_another_fp8_format_is_a_dtype_error(fp8_type):
    """q must be float8_e4m3fn (or raw bytes): a numpy array of another fp8 format is a wrong dtype
    (TypeError naming q), not silently reinterpreted as e4m3fn bytes."""
    args = _np_args()
    args["q"] = args["q"].view(getattr(ml_dtypes, fp8_type))
    with pytest.raises(TypeError) as exc:
        ffi_dsa.call(*(args[n] for n in NAMES))
    assert_names(str(exc.value), "q")
    assert (args["out"] == SENTINEL).all()


@pytest.mark.parametrize("which", ["k", "w", "out"])
def test_numpy_fp8_array_for_a_non_fp8_argument_is_a_dtype_error(which):
    """An ml_dtypes float8 array where int8/float32/int32 is expected is a wrong dtype: TypeError
    naming the argument (not a bare BufferError from DLPack)."""
    args = _np_args()
    original_out = args["out"]
    args[which] = args[which].view(np.uint8).view(ml_dtypes.float8_e4m3fn)
    with pytest.raises(TypeError) as exc:
        ffi_dsa.call(*(args[n] for n in NAMES))
    assert_names(str(exc.value), which)
    assert (original_out == SENTINEL).all()


class _NotATensor:
    """A framework object that is no DLPack tensor (no __dlpack__), e.g. a dataframe column."""

    shape = (B, K)


NOT_TENSORS = {"list": lambda x: x.tolist(), "None": lambda x: None, "str": lambda x: "q",
               "object": lambda x: _NotATensor()}


@pytest.mark.parametrize("kind", NOT_TENSORS)
@pytest.mark.parametrize("which", NAMES)
def test_argument_that_is_not_a_tensor_is_a_type_error_naming_it(which, kind):
    """A Python list, None, a string or an object without __dlpack__ instead of a tensor: TypeError
    naming the argument, before anything is written."""
    args = _np_args()
    original_out = args["out"]
    args[which] = NOT_TENSORS[kind](args[which])
    with pytest.raises(TypeError) as exc:
        ffi_dsa.call(*(args[n] for n in NAMES))
    assert_names(str(exc.value), which)
    assert (original_out == SENTINEL).all()


@pytest.mark.parametrize("kind", ["list", "None"])
def test_topk_indexer_q_that_is_not_a_tensor_is_a_type_error_naming_it(kind):
    args = _np_args()
    with pytest.raises(TypeError, match=names_first("q")):
        ffi_dsa.topk_indexer(NOT_TENSORS[kind](args["q"]), *(args[n] for n in NAMES[1:5]), topk=K)


@pytest.mark.parametrize("topk", [None, "64", 64.5j])
def test_topk_that_is_not_an_int_is_a_type_error_naming_it(topk):
    args = _np_args()
    with pytest.raises(TypeError, match="topk"):
        ffi_dsa.topk_indexer(*(args[n] for n in NAMES[:5]), topk=topk)


def test_an_output_passed_as_topk_says_to_call_the_dps_form():
    """A script of an earlier main called prefill_topk_indexer(..., topk_indices), the DPS form of
    then (CHANGELOG.md): the TypeError names topk and the entry point to call instead."""
    from ffi_dsa.prefill_workloads import make_prefill_batch

    chunk = make_prefill_batch([300, 100], queries=[8, 4], seed=64)
    out = poisoned_np((chunk.rows, K))
    with pytest.raises(TypeError, match=r"^topk must be an int .*ffi_dsa\.prefill_call") as err:
        ffi_dsa.prefill_topk_indexer(*chunk.args(), out)
    assert "got a ndarray" in str(err.value)
    with pytest.raises(TypeError, match=r"^topk must be an int .*ffi_dsa\.call"):
        ffi_dsa.topk_indexer(*(_np_args()[n] for n in NAMES[:5]), torch.zeros((2, K), dtype=torch.int32))
    with pytest.raises(AttributeError, match=r"^ffi_dsa\.prefill_topk was renamed: use ffi_dsa\.prefill_topk_indexer"):
        ffi_dsa.prefill_topk  # noqa: B018


@pytest.mark.parametrize("which", NAMES)
def test_meta_tensor_is_a_value_error_naming_it(which):
    """A torch meta tensor (shapes, no data) given to ffi_dsa.call: ValueError naming it."""
    args = _good_args("cpu")
    original_out = args["out"]
    args[which] = args[which].to("meta")
    with pytest.raises(ValueError) as exc:
        ffi_dsa.call(*(args[n] for n in NAMES))
    assert_names(str(exc.value), which)
    assert "meta" in str(exc.value), str(exc.value)
    assert (original_out == SENTINEL).all()


def test_jax_array_as_the_dps_output_is_a_type_error():
    """JAX arrays are immutable: ffi_dsa.call must not write into one."""
    jnp = pytest.importorskip("jax.numpy")
    args = _np_args()
    args["out"] = jnp.full((B, K), SENTINEL, dtype=jnp.int32)
    with pytest.raises(TypeError, match=names_first("out")):
        ffi_dsa.call(*(args[n] for n in NAMES))
    assert (np.asarray(args["out"]) == SENTINEL).all()


@pytest.mark.parametrize("op", ["topk_indexer", "topk_indexer_out"])
@pytest.mark.parametrize("which", NAMES[:5])
def test_torch_op_with_none_is_a_type_error_naming_it(op, which):
    """torch's dispatcher lets None through for a Tensor argument: the op names it."""
    args = _good_args("cpu")
    original_out = args["out"]
    args[which] = None
    fn = getattr(torch.ops.dsa, op)
    with pytest.raises(TypeError, match=names_first(which)):
        if op == "topk_indexer":
            fn(*(args[n] for n in NAMES[:5]), topk=K)
        else:
            fn(*(args[n] for n in NAMES))
    assert (original_out == SENTINEL).all()


@pytest.mark.parametrize("which", NAMES[1:5])
def test_torch_op_with_one_meta_argument_is_a_value_error_naming_it(which):
    """One meta tensor among CPU tensors sends torch.ops to the fake kernel, which checks placement."""
    args = _good_args("cpu")
    args[which] = args[which].to("meta")
    with pytest.raises(ValueError, match=names_first(which)):
        torch.ops.dsa.topk_indexer(*(args[n] for n in NAMES[:5]), topk=K)


# ----------------------------------------------------------------------------------------------
# Mixed devices (needs a GPU)
# ----------------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("which", ["k", "w", "lens", "table", "out"])
def test_mixed_devices_raise_naming_the_argument(which):
    """q on CUDA and one argument on the CPU: ValueError naming that argument, nothing written."""
    args = _good_args("cuda")
    original_out = args["out"]
    args[which] = args[which].cpu()
    with pytest.raises(ValueError) as exc:
        ffi_dsa.call(*(args[n] for n in NAMES))
    assert_names(str(exc.value), which)
    torch.cuda.synchronize()
    assert (original_out.cpu() == SENTINEL).all() and (args["out"].cpu() == SENTINEL).all()


@pytest.mark.cuda
def test_q_on_cpu_with_the_rest_on_cuda_raises():
    """q on the CPU, everything else on CUDA: ValueError naming the first argument that differs."""
    args = _good_args("cuda")
    args["q"] = args["q"].cpu()
    with pytest.raises(ValueError) as exc:
        ffi_dsa.call(*(args[n] for n in NAMES))
    assert_names(str(exc.value), "k")
    torch.cuda.synchronize()
    assert (args["out"].cpu() == SENTINEL).all()


# (case id, argument, mutation of the good arguments, queries per row, the end of the message)
ACCEPTED = [
    ("weights_BH1", "w", lambda a: a["w"][:, :, None], None,
     "; weights must be [2, 64] ([B * N, H]) or [2, 1, 64] ([B, N, H]), with B = 2, N = 1, H = 64 from q of shape "
     "[2, 64, 128] (a [B * N, H, 1] buffer holds those bytes: squeeze its last dimension)"),
    ("weights_rank_4", "w", lambda a: a["w"][:, None, :, None], None,
     "; weights must be [2, 64] ([B * N, H]) or [2, 1, 64] ([B, N, H]), with B = 2, N = 1, H = 64"),
    ("weights_B_for_N2", "w", lambda a: a["w"][:, 0], 2,
     "; weights must be [4, 64] ([B * N, H]) or [2, 2, 64] ([B, N, H]), with B = 2, N = 2, H = 64 from q of shape "
     "[2, 2, 64, 128]"),
    ("seq_lens_BN_for_N1", "lens", lambda a: torch.stack([a["lens"]] * 3, dim=1), None,
     "; seq_lens must be [2] ([B]) or [2, 1] ([B, N]), with B = 2"),
    ("block_table_rows", "table", lambda a: a["table"][:1], None,
     "; block_table must be [2, max_num_pages] ([B, max_num_pages]), with B = 2"),
    ("out_rows", "out", lambda a: poisoned((3, K), a["out"].device), 2,
     "; topk_indices must be [4, K] ([B * N, K]) or [2, 2, K] ([B, N, K]), with B = 2, N = 2, H = 64 from q of "
     "shape [2, 2, 64, 128], K <= 2048"),
    ("k_cache_flat", "k", lambda a: a["k"].reshape(a["k"].shape[0], -1), None,
     "; a [num_pages, 8448] or [num_pages, 64, 132] buffer holds those bytes: view it as [num_pages, 64, 1, 132]"),
]


@pytest.mark.parametrize("case", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_shape_errors_end_with_the_accepted_shapes_in_the_callers_numbers(device, case):
    """A shape mistake names the argument and the dimension, then every shape that would do, in the
    B, N, H (and K) of the caller's q: weights held as [B, H, 1] get the fix, not only the fault."""
    _, which, mutate, queries, ending = case
    q, k, w, lens, table = make_batch([150, 70], seed=61, queries=queries).to_torch(device)
    args = dict(q=q, k=k, w=w, lens=lens, table=table, out=poisoned((B * (queries or 1), K), device))
    args[which] = mutate(args)
    out = args["out"]
    with pytest.raises(ValueError, match=names_first(which)) as err:
        ffi_dsa.call(*(args[n] for n in NAMES))
    assert ending in str(err.value), str(err.value)
    assert (out == SENTINEL).all()
    if which != "out":
        with pytest.raises(ValueError, match=names_first(which)) as err:
            torch.ops.dsa.topk_indexer(*(args[n] for n in NAMES[:5]), topk=K)
        assert ending in str(err.value), str(err.value)


def test_prefill_shape_errors_end_with_the_accepted_shapes():
    from ffi_dsa.prefill_workloads import make_prefill_batch

    chunk = make_prefill_batch([300, 100], queries=[8, 4], seed=62)
    q, k, k_scale, weights, ks, ke = chunk.args()
    sizes = "with M = 12, H = 64 from q of shape [12, 64, 128], N = 400 from k of shape [400, 128]"
    for args, ending in [((q, k, k_scale, weights[:-1], ks, ke), f"; weights must be [12, 64] ([M, H]), {sizes}"),
                         ((q, k, k_scale[:-1], weights, ks, ke), f"; k_scale must be [400] ([N]), {sizes}"),
                         ((q, k, k_scale, weights, ks, ke[:, None]), f"; ke must be [12] ([M]), {sizes}")]:
        with pytest.raises(ValueError) as err:
            ffi_dsa.prefill_topk_indexer(*args, topk=K)
        assert str(err.value).endswith(ending), str(err.value)
    with pytest.raises(ValueError) as err:
        ffi_dsa.prefill_call(q, k, k_scale, weights, ks, ke, poisoned_np((13, K)))
    assert str(err.value).endswith(f"; topk_indices must be [12, K] ([M, K]), {sizes}, K <= 2048"), str(err.value)


def test_jax_trace_time_shape_errors_end_with_the_accepted_shapes():
    jnp = pytest.importorskip("jax.numpy")
    pytest.importorskip("jax_tvm_ffi")
    batch = make_batch([150, 70], seed=63)
    q = jnp.asarray(batch.q).view(jnp.float8_e4m3fn)
    k, w, lens, table = map(jnp.asarray, batch.args()[1:])
    with pytest.raises(ValueError, match="^weights dimension 1 must be 1") as err:
        ffi_dsa.topk_indexer(q, k, w[:, :, None], lens, table, topk=K)
    assert "; weights must be [2, 64] ([B * N, H]) or [2, 1, 64] ([B, N, H])" in str(err.value)
