"""torch custom ops around the compiled TVM-FFI functions; importing this module registers them
(``import ffi_dsa.torch_ops``). Each op of the package (decode.OP, prefill.OP) gets a functional op
and a destination-passing ``_out`` op that mutates its output:

    torch.ops.dsa.topk_indexer(q, k_cache, weights, seq_lens, block_table, topk=2048, sorted=False,
                               ids="slots", max_seq_len=None) -> Tensor
    torch.ops.dsa.topk_indexer_out(q, k_cache, weights, seq_lens, block_table, topk_indices, sorted=False,
                                   ids="slots", max_seq_len=None) -> ()
    torch.ops.dsa.prefill_topk_indexer(q, k, k_scale, weights, ks, ke, topk=2048, sorted=False,
                                       ids="relative") -> Tensor
    torch.ops.dsa.prefill_topk_indexer_out(q, k, k_scale, weights, ks, ke, topk_indices, sorted=False,
                                           ids="relative") -> ()
    torch.ops.dsa.mxfp4_topk_indexer(q, q_scale, k_cache, weights, seq_lens, block_table, topk=2048,
                                     sorted=False, ids="slots", max_seq_len=None) -> Tensor   (CPU for now)
    torch.ops.dsa.mxfp4_topk_indexer_out(q, q_scale, ..., block_table, topk_indices, sorted=False, ids="slots",
                                         max_seq_len=None) -> ()

A functional op returns the op's output shape (decode ``[B, topk]``, or ``[B, N, topk]`` for q
``[B, N, H, 128]``; prefill ``[M, topk]``) on q's device; an out op takes every output form its
contract allows. Decode's ``max_seq_len`` (``SymInt?``) is a host int, the same on each replay of a
graph that captured it; under ``torch.compile`` a value that changes between calls becomes a
symbolic int, checked when the kernel runs.

Every op has a fake (meta) kernel, so it traces under ``torch.compile(fullgraph=True)`` (also with
``dynamic=True``), passes ``torch.library.opcheck``, and runs inside ``torch.cuda.CUDAGraph`` capture:
the kernels never sync with the host, tvm-ffi launches them on torch's current stream (it reads the
stream from torch for every call), and the scratch decode's CUDA path needs for long rows comes from
torch's caching allocator through tvm-ffi's env allocator (stream-ordered, capture-safe).

They are registered by the low-level ``torch.library.Library`` route rather than
``torch.library.custom_op``, whose Python wrappers cost about twice the per-call overhead
(measured with ``python benchmarks/bench_torch_overhead.py``; docs/performance.md). The kernels
call the op's tvm-ffi function object (``Op.kernel_for``) directly; its C++ argument checks raise
ValueError/TypeError, which propagate unchanged through the dispatcher (these are Python kernels).
"""

from __future__ import annotations

import functools

import torch

from . import _ffi_api, decode, mxfp4, prefill
from ._arrays import named_argument_error
from ._op import Op, checked_topk
from .contract import DEFAULT_TOPK, MAX_TOPK

NAMESPACE = "dsa"
OPS = (decode.OP, prefill.OP, mxfp4.OP)


def schemas(op: Op) -> tuple[str, str]:
    """The functional op's schema and the out op's."""
    tensors = ", ".join(f"Tensor {p}" for p in op.inputs)
    options = "".join(f", {o.torch_type} {o.name}={o.default!r}".replace("'", '"') for o in op.options)
    return (f"{op.name}({tensors}, int topk={DEFAULT_TOPK}{options}) -> Tensor",
            f"{op.name}_out({tensors}, Tensor(a!) {op.params[-1]}{options}) -> ()")


def _with_defaults(op: Op, n_fixed: int):
    """args -> args with the trailing arguments the dispatcher left out filled in: it passes a
    Python kernel its arguments positionally and drops those at their default from the end. The
    `n_fixed` leading arguments are always there (the tensors); then topk (functional op only) and
    the options."""
    defaults = ((DEFAULT_TOPK,) if n_fixed == len(op.inputs) else ()) + tuple(o.default for o in op.options)
    full = n_fixed + len(defaults)

    def fill(args: tuple) -> tuple:
        return args if len(args) == full else args + defaults[len(args) - n_fixed:]

    return fill


def _attrs_from_values(op: Op):
    """option values, in order -> the native attributes (bool options are attributes as they are:
    the schema's ``bool`` already refused anything else)."""
    if all(o.torch_type == "bool" for o in op.options):
        return lambda values: values
    to_attrs = [o.to_attr for o in op.options]
    return lambda values: [to_attr(v) for to_attr, v in zip(to_attrs, values)]


def _check_options(op: Op, values) -> None:
    """Each option value is one its option takes (ValueError naming it), except a symbolic int: the
    traced value of an int option, which the real kernel checks when it runs."""
    for option, value in zip(op.options, values):
        if not isinstance(value, torch.SymInt):
            option.to_attr(value)


# ---- real kernels (CPU and CUDA dispatch keys) ------------------------------------------------
# On the eager hot path: kept flat (every Python call here adds to each eager call's host time).

def real_kernels(op: Op):
    """(functional, out) Python kernels of `op`: dispatch on q's device, so that a mismatched argument
    reaches the C++ placement check (ValueError) instead of the dispatcher picking a kernel from
    whichever tensor has the "highest" device. The dispatcher lets None through for a Tensor
    argument: named here, off the hot path."""
    n = len(op.inputs)
    # C-level: no Python frame per call; an op without a kernel for every device asks its Op, which
    # names the missing one (NotImplementedError) instead of loading a module that lacks it
    kernel_for = functools.partial(_ffi_api.kernel_for, op.name) if "cuda" in op.devices else op.kernel_for
    output_shape, names = op.output_shape, op.arg_names
    fill, fill_out = _with_defaults(op, n), _with_defaults(op, n + 1)
    attrs_of = _attrs_from_values(op)

    def functional(*args):
        args = fill(args)
        inputs, topk = args[:n], args[n]
        attrs = attrs_of(args[n + 1:])
        if topk < 0 or topk > MAX_TOPK:
            checked_topk(topk)
        try:
            device = inputs[0].device
            kernel = kernel_for(device.type)  # a device without a kernel fails before anything is allocated
            out = torch.empty(output_shape(inputs[0].shape, topk), dtype=torch.int32, device=device)
            kernel(*inputs, out, *attrs)
        except (TypeError, AttributeError) as err:
            raise named_argument_error(err, inputs, names) from None
        return out

    def out_variant(*args):
        args = fill_out(args)
        try:
            kernel_for(args[0].device.type)(*args[:n + 1], *attrs_of(args[n + 1:]))
        except (TypeError, AttributeError) as err:
            raise named_argument_error(err, args[:n + 1], names) from None

    return functional, out_variant


# ---- fake (meta) kernels ---------------------------------------------------------------------

def same_device(tensors, names) -> None:
    """Under meta/fake tensors the dispatcher picks the fake kernel when any argument is meta, so the
    real kernel's placement check would never see a meta argument among real ones: checked here
    (`names`: the op's argument names, in order)."""
    for t, name in zip(tensors, names):
        if t is None:
            raise TypeError(f"{name} must be a tensor, got None")
        if t.device != tensors[0].device:
            raise ValueError(f"{name} is on {t.device} but q is on {tensors[0].device}; every "
                             "argument must be on one device")


def fake_kernels(op: Op):
    """(functional, out) fake kernels of `op`: the output's shape, and the checks that need no data."""
    n = len(op.inputs)
    fill, fill_out = _with_defaults(op, n), _with_defaults(op, n + 1)

    def functional(*args):
        args = fill(args)
        inputs, topk = args[:n], args[n]
        if isinstance(topk, int):  # first: under torch.compile its message then leads (TopKRangeError)
            checked_topk(topk)
        _check_options(op, args[n + 1:])
        same_device(inputs, op.arg_names)
        return inputs[0].new_empty(op.output_shape(inputs[0].shape, topk), dtype=torch.int32)

    def out_variant(*args):
        args = fill_out(args)
        _check_options(op, args[n + 1:])
        same_device(args[:n + 1], op.arg_names)

    return functional, out_variant


def registered(name: str) -> bool:
    """Whether torch.ops.dsa.`name` exists (this file, or a copy of it, already ran)."""
    try:
        getattr(getattr(torch.ops, NAMESPACE), name).default
        return True
    except (AttributeError, RuntimeError):
        return False


def register(op: Op):
    """Defines torch.ops.dsa.<op> and <op>_out (pt2-compliant) with real kernels for CPU and CUDA and
    fake ones for tracing; returns the Library, which must stay alive for the ops to exist."""
    # FRAGMENT, not DEF: another fragment of the "dsa" namespace (or a second copy of this file
    # loaded under another module name) must not make the import fail.
    lib = torch.library.Library(NAMESPACE, "FRAGMENT")
    tags = (torch.Tag.pt2_compliant_tag,)
    for name, schema, kernel, fake in zip((op.name, f"{op.name}_out"), schemas(op), real_kernels(op),
                                          fake_kernels(op)):
        lib.define(schema, tags=tags)
        for key in ("CPU", "CUDA"):
            lib.impl(name, kernel, key)
        torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=lib)
    return lib


# Keep the Library objects alive: dropping one would unregister its ops.
_LIBS = [register(op) for op in OPS if not registered(op.name)]

topk_indexer = torch.ops.dsa.topk_indexer.default
topk_indexer_out = torch.ops.dsa.topk_indexer_out.default
prefill_topk_indexer = torch.ops.dsa.prefill_topk_indexer.default
prefill_topk_indexer_out = torch.ops.dsa.prefill_topk_indexer_out.default
mxfp4_topk_indexer = torch.ops.dsa.mxfp4_topk_indexer.default
mxfp4_topk_indexer_out = torch.ops.dsa.mxfp4_topk_indexer_out.default

__all__ = ["topk_indexer", "topk_indexer_out", "prefill_topk_indexer", "prefill_topk_indexer_out",
           "mxfp4_topk_indexer", "mxfp4_topk_indexer_out", "NAMESPACE", "OPS"]
