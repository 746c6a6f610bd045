"""TVM: each op of the package as global packed functions, called from Relax through
``R.call_dps_packed``.

    from ffi_dsa import tvm_relax
    tvm_relax.register_global_funcs()               # every op's globals (below)

    # in TVMScript (apache-tvm 0.27 spells the output type `out_ty`):
    #     out = R.call_dps_packed("ffi_dsa.topk_indexer", (q, k_cache, weights, seq_lens, block_table),
    #                             out_ty=R.Tensor((b, 2048), "int32"))

    mod = tvm_relax.indexer_module(topk=2048)       # the same program, built with the BlockBuilder
    vm = tvm_relax.build(mod, device=tvm.cpu())
    idx = vm["main"](q, k_cache, weights, seq_lens, block_table)   # tvm.runtime.Tensor [B, 2048] int32

    # N query tokens per row (q [B, N, H, 128]): the same program with out_ty R.Tensor((b, n, 2048))
    vm4 = tvm_relax.build(tvm_relax.indexer_module(topk=2048, q_rank=4), device=tvm.cpu())

    # positions in the row, and the batch's longest row as a run-time argument (an int64)
    vm = tvm_relax.build(tvm_relax.indexer_module(ids="positions", with_max_seq_len=True))
    idx = vm["main"](q, k_cache, weights, seq_lens, block_table, 8192)

    # prefill (docs/contract.md §8): out_ty R.Tensor((m, 2048), "int32")
    vm = tvm_relax.build(tvm_relax.prefill_module(topk=2048, sorted=False, ids="relative"))
    idx = vm["main"](q, k, k_scale, weights, ks, ke)     # tvm.runtime.Tensor [M, 2048] int32

    # MXFP4 pages (docs/contract.md §9): main(q, q_scale, k_cache, weights, seq_lens, block_table)
    vm = tvm_relax.build(tvm_relax.mxfp4_module(topk=512))

Relax passes DPS arguments as (inputs..., output) with no room for a scalar after the output, so
every combination of an op's options that take a few values gets its own global,
``global_name(op, **options)``: ``ffi_dsa.<op>``, then ``_sorted`` for descending score (the default
is ascending position), ``_positions`` for decode's ``ids="positions"`` (positions in the row
instead of global slots) and ``_absolute`` for prefill's ``ids="absolute"`` (rows of k instead of
``j - ks[i]``):

    ffi_dsa.topk_indexer, ffi_dsa.topk_indexer_sorted,
    ffi_dsa.topk_indexer_positions, ffi_dsa.topk_indexer_sorted_positions
    ffi_dsa.prefill_topk_indexer, ffi_dsa.prefill_topk_indexer_sorted,
    ffi_dsa.prefill_topk_indexer_absolute, ffi_dsa.prefill_topk_indexer_sorted_absolute
    ffi_dsa.mxfp4_topk_indexer, ffi_dsa.mxfp4_topk_indexer_sorted,
    ffi_dsa.mxfp4_topk_indexer_positions, ffi_dsa.mxfp4_topk_indexer_sorted_positions   (CPU for now)

An option that takes any int (decode's ``max_seq_len``) is a value of the call instead: a global
also takes it between the inputs and the output, ``(inputs..., max_seq_len, output)``, as a Relax
``R.Prim("int64")`` (``indexer_module(with_max_seq_len=True)`` makes it ``main``'s last parameter).

Each forwards to the op's compiled tvm-ffi function of the arguments' device (CPU, or CUDA: the CUDA
module is built on its first CUDA call) as the DPS entry points do with ``validate=False`` (the
kernels mask or clamp what only the device sees), and raises its ValueError/TypeError unchanged.
Registering needs only tvm-ffi; building and running the Relax program needs apache-tvm
(``pip install ffi-dsa[tvm]``).
"""

from __future__ import annotations

import itertools
import threading

import tvm_ffi

from . import decode, mxfp4, prefill
from ._arrays import _strict_bool
from ._op import Op, checked_topk
from .contract import DEFAULT_TOPK

OPS = (decode.OP, prefill.OP, mxfp4.OP)
_DEVICE_NAMES = {1: "cpu", 2: "cuda"}  # DLPack device types
_lock = threading.Lock()
_registered = False


def global_name(op: Op, **options) -> str:
    """The global serving `op` with `options` (the others at their defaults): ``ffi_dsa.<op>``, then
    ``_<option>`` for a bool option that is True and ``_<value>`` for another option off its default
    (ValueError naming an option for a value it does not take). A run-time option (any int) does
    not name a global: it is passed to it."""
    attrs = op.attrs(options)  # checks each value
    suffix = ""
    for option, attr in zip(op.options, attrs):
        value = options.get(option.name, option.default)
        if option.choices is None:
            continue
        if isinstance(option.default, bool):
            suffix += f"_{option.name}" if attr else ""
        elif value != option.default:
            suffix += f"_{value}"
    return f"ffi_dsa.{op.name}{suffix}"


def _global_func(op: Op, attrs: tuple):
    """A DPS global (inputs..., output), or (inputs..., the run-time options' values, output), calling
    `op`'s native function of the arguments' device with `attrs` (and those values, each checked)."""
    inputs = len(op.inputs)
    runtime = [i for i, o in enumerate(op.options) if o.choices is None]

    def dps(*args):
        call_attrs = attrs
        if runtime and len(args) == inputs + len(runtime) + 1:
            call_attrs = list(attrs)
            for i, value in zip(runtime, args[inputs:-1]):
                call_attrs[i] = op.options[i].to_attr(value)  # ValueError naming the option, nothing written
            args = (*args[:inputs], args[-1])
        dev = args[0].device.dlpack_device_type()
        op.kernel_for(_DEVICE_NAMES.get(dev, f"DLPack device type {dev}"))(*args, *call_attrs)  # ValueError: others

    return dps


def register_global_funcs() -> None:
    """Register one global for every op and every combination of its options (idempotent)."""
    global _registered
    with _lock:
        if _registered:
            return
        for op in OPS:
            named = [o for o in op.options if o.choices is not None]
            for values in itertools.product(*(o.choices for o in named)):
                options = {o.name: v for o, v in zip(named, values)}
                tvm_ffi.register_global_func(global_name(op, **options), _global_func(op, op.attrs(options)),
                                             override=True)
        _registered = True


_Q_DIMS = {3: ("b", "h", "d"), 4: ("b", "n", "h", "d")}  # q [B, H, 128], or [B, N, H, 128] (§7)


def indexer_module(topk: int = DEFAULT_TOPK, sorted: bool = False, q_rank: int = 3, ids: str = "slots",
                   with_max_seq_len: bool = False):
    """A Relax IRModule whose ``main(q, k_cache, weights, seq_lens, block_table)`` returns decode's
    int32 top-K ids through ``R.call_dps_packed``: ``[b, topk]`` for q ``[b, h, d]``, or with
    ``q_rank=4`` (N query tokens per row, docs/contract.md §7) ``[b, n, topk]`` for q ``[b, n, h, d]``.
    ``ids`` as in ffi_dsa.call; ``with_max_seq_len=True`` adds a last parameter ``max_seq_len``
    (``R.Prim("int64")``: the caller's bound on the batch's longest row, 0 unknown, given per call)."""
    if q_rank not in _Q_DIMS:
        raise ValueError(f"q_rank must be 3 (q [B, H, 128]) or 4 (q [B, N, H, 128]), got {q_rank!r}")
    runtime = ("max_seq_len",) if _strict_bool("with_max_seq_len", with_max_seq_len) else ()
    return _dps_module(decode.OP, topk, _Q_DIMS[q_rank], runtime, sorted=sorted, ids=ids)


def mxfp4_module(topk: int = DEFAULT_TOPK, sorted: bool = False, q_rank: int = 3, ids: str = "slots",
                 with_max_seq_len: bool = False):
    """As :func:`indexer_module`, for the MXFP4 op (docs/contract.md §9): ``main(q, q_scale, k_cache,
    weights, seq_lens, block_table)`` (then ``max_seq_len`` with ``with_max_seq_len=True``), q
    ``[b, h, 64]`` or with ``q_rank=4`` ``[b, n, h, 64]``."""
    if q_rank not in _Q_DIMS:
        raise ValueError(f"q_rank must be 3 (q [B, H, 64]) or 4 (q [B, N, H, 64]), got {q_rank!r}")
    runtime = ("max_seq_len",) if with_max_seq_len else ()
    return _dps_module(mxfp4.OP, topk, _Q_DIMS[q_rank], runtime, sorted=sorted, ids=ids)


def prefill_module(topk: int = DEFAULT_TOPK, sorted: bool = False, ids: str = "relative"):
    """A Relax IRModule whose ``main(q, k, k_scale, weights, ks, ke)`` returns prefill's int32 top-K
    ids ``[m, topk]`` (docs/contract.md §8) through ``R.call_dps_packed``."""
    return _dps_module(prefill.OP, topk, ("m", "h", "d"), sorted=sorted, ids=ids)


def _dps_module(op: Op, topk, q_dims: tuple, runtime: tuple = (), **options):
    """``main(inputs..., runtime...)`` calling `op`'s global for `options` by ``R.call_dps_packed``,
    the run-time options named in `runtime` passed as int64 values between the inputs and the output.

    The parameters are declared loosely (symbolic dims, any dtype; only q's rank is fixed, since the
    output's shape comes from it): one build serves every batch and pool (or chunk and key) size and
    both head counts, and a wrong shape or dtype reaches the kernel's own checks, which raise
    ValueError/TypeError naming the argument, instead of Relax's generic signature-check errors.
    """
    from tvm import ir, relax, tirx

    topk = checked_topk(topk)
    name = global_name(op, **options)
    register_global_funcs()
    dims = [tirx.Var(n, "int64") for n in q_dims]
    T = relax.TensorType
    params = [relax.Var(op.params[0], T(dims, dtype=None))]
    params += [relax.Var(p, T(dtype=None, ndim=-1)) for p in op.inputs[1:]]
    params += [relax.Var(name, ir.PrimType("int64")) for name in runtime]

    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(relax.call_dps_packed(
                name, relax.Tuple(params), out_ty=T(list(op.output_shape(dims, topk)), "int32")))
        bb.emit_func_output(out)
    return bb.get()


def build(mod, device=None, target: str | None = None):
    """Compile a Relax module and return a ``relax.VirtualMachine`` on ``device`` (CPU default)."""
    import tvm
    from tvm import relax

    device = device if device is not None else tvm.cpu()
    if target is None:
        target = "llvm" if device.dlpack_device_type() == 1 else "cuda"
    return relax.VirtualMachine(relax.build(mod, target=target), device)


__all__ = ["register_global_funcs", "global_name", "indexer_module", "mxfp4_module", "prefill_module", "build", "OPS"]
