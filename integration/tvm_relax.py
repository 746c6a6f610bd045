"""TVM: the op as a global packed function, called from Relax through ``R.call_dps_packed``.

    from ffi_dsa.integration import tvm_relax
    tvm_relax.register_global_funcs()               # "ffi_dsa.topk_indexer", "ffi_dsa.topk_indexer_sorted",
                                                    # and prefill's four (below)

    # in TVMScript (apache-tvm 0.27 spells the output type `out_ty`):
    #     out = R.call_dps_packed("ffi_dsa.topk_indexer", (q, k_cache, weights, seq_lens, block_table),
    #                             out_ty=R.Tensor((b, 2048), "int32"))

    mod = tvm_relax.indexer_module(topk=2048)       # the same program, built with the BlockBuilder
    vm = tvm_relax.build(mod, device=tvm.cpu())
    idx = vm["main"](q, k_cache, weights, seq_lens, block_table)   # tvm.runtime.Tensor [B, 2048] int32

    # N query tokens per row (q [B, N, H, 128]): the same program with out_ty R.Tensor((b, n, 2048))
    vm4 = tvm_relax.build(tvm_relax.indexer_module(topk=2048, q_rank=4), device=tvm.cpu())

Relax passes DPS arguments as (inputs..., output) with no room for a scalar after the output, so
each ordering gets its own global: ``ffi_dsa.topk_indexer`` (ascending token position, the default)
and ``ffi_dsa.topk_indexer_sorted`` (descending score). They forward to the compiled tvm-ffi
function of the arguments' device (CPU, or CUDA: the CUDA module is built on its first CUDA call)
and raise its ValueError/TypeError unchanged. Registering needs only tvm-ffi; building and running
the Relax program needs apache-tvm (``pip install ffi-dsa[tvm]``).

Prefill (docs/contract.md §8) is registered by the same call, one global per ordering and id
option, named ``ffi_dsa.prefill_topk_indexer`` + ``_sorted`` (descending score) + ``_absolute``
(``ids="absolute"``: rows of k instead of ``j - ks[i]``); ``prefill_global_name(sorted, ids)``
gives the name:

    ffi_dsa.prefill_topk_indexer                   position order, ids j - ks[i] (the defaults)
    ffi_dsa.prefill_topk_indexer_sorted            score order,    ids j - ks[i]
    ffi_dsa.prefill_topk_indexer_absolute          position order, ids j
    ffi_dsa.prefill_topk_indexer_sorted_absolute   score order,    ids j

    # out = R.call_dps_packed("ffi_dsa.prefill_topk_indexer", (q, k, k_scale, weights, ks, ke),
    #                         out_ty=R.Tensor((m, 2048), "int32"))
    vm = tvm_relax.build(tvm_relax.prefill_module(topk=2048, sorted=False, ids="relative"))
    idx = vm["main"](q, k, k_scale, weights, ks, ke)     # tvm.runtime.Tensor [M, 2048] int32

They call ``ffi_dsa.prefill.kernel_for(device)`` as ``ffi_dsa.prefill_topk_indexer`` does with
``validate=False``: the kernel clamps ``ks < 0`` / ``ke > N`` and leaves ``ks >= ke`` rows all -1.
CPU and CUDA tensors each reach their module's kernel.
"""

from __future__ import annotations

import threading

import tvm_ffi

from .. import _ffi_api
from .. import prefill as _prefill
from .._arrays import output_shape
from ..api import checked_topk
from ..contract import DEFAULT_TOPK

GLOBAL_NAME = "ffi_dsa.topk_indexer"
GLOBAL_NAME_SORTED = "ffi_dsa.topk_indexer_sorted"
PREFILL_GLOBAL_NAME = "ffi_dsa.prefill_topk_indexer"
# (sorted, ids) -> the prefill global serving it
PREFILL_GLOBAL_NAMES = {
    (sorted_, ids): PREFILL_GLOBAL_NAME + ("_sorted" if sorted_ else "") + ("_absolute" if ids == "absolute" else "")
    for sorted_ in (False, True) for ids in _prefill.IDS
}

_DEVICE_NAMES = {1: "cpu", 2: "cuda"}  # DLPack device types
_lock = threading.Lock()
_registered = False


def _make_global(sorted_by_score: bool):
    def topk_indexer(q, k_cache, weights, seq_lens, block_table, topk_indices):
        dev = q.device.dlpack_device_type()
        fn = _ffi_api.topk_indexer_for(_DEVICE_NAMES.get(dev, f"DLPack device type {dev}"))  # ValueError: others
        fn(q, k_cache, weights, seq_lens, block_table, topk_indices, sorted_by_score)

    return topk_indexer


def _make_prefill_global(sorted_by_score: bool, absolute_ids: bool):
    def prefill_topk_indexer(q, k, k_scale, weights, ks, ke, topk_indices):
        dev = q.device.dlpack_device_type()
        fn = _prefill.kernel_for(_DEVICE_NAMES.get(dev, f"DLPack device type {dev}"))
        fn(q, k, k_scale, weights, ks, ke, topk_indices, sorted_by_score, absolute_ids)

    return prefill_topk_indexer


def prefill_global_name(sorted: bool = False, ids: str = "relative") -> str:
    """The prefill global for one ordering and id option (ValueError naming ids for another ids)."""
    _prefill.absolute_ids(ids)
    return PREFILL_GLOBAL_NAMES[bool(sorted), ids]


def register_global_funcs() -> None:
    """Register ``ffi_dsa.topk_indexer``, ``ffi_dsa.topk_indexer_sorted`` and the four prefill
    globals of ``PREFILL_GLOBAL_NAMES`` (idempotent)."""
    global _registered
    with _lock:
        if _registered:
            return
        tvm_ffi.register_global_func(GLOBAL_NAME, _make_global(False), override=True)
        tvm_ffi.register_global_func(GLOBAL_NAME_SORTED, _make_global(True), override=True)
        for (sorted_, ids), name in PREFILL_GLOBAL_NAMES.items():
            tvm_ffi.register_global_func(name, _make_prefill_global(sorted_, ids == "absolute"), override=True)
        _registered = True


_Q_DIMS = {3: ("b", "h", "d"), 4: ("b", "n", "h", "d")}  # q [B, H, 128], or [B, N, H, 128] (§7)


def indexer_module(topk: int = DEFAULT_TOPK, sorted: bool = False, q_rank: int = 3):
    """A Relax IRModule whose ``main(q, k_cache, weights, seq_lens, block_table)`` returns the
    int32 top-K ids through ``R.call_dps_packed``: ``[b, topk]`` for q ``[b, h, d]``, or with
    ``q_rank=4`` (N query tokens per row, docs/contract.md §7) ``[b, n, topk]`` for q ``[b, n, h, d]``.

    The parameters are declared loosely (symbolic dims, any dtype; only q's rank is fixed, since
    the output's shape comes from it): one build serves every batch and pool size, and a wrong
    shape or dtype reaches the kernel's own checks, which raise ValueError/TypeError naming the
    argument, instead of Relax's generic signature-check errors.
    """
    from tvm import relax, tirx

    topk = checked_topk(topk)
    if q_rank not in _Q_DIMS:
        raise ValueError(f"q_rank must be 3 (q [B, H, 128]) or 4 (q [B, N, H, 128]), got {q_rank!r}")
    register_global_funcs()
    q_dims = [tirx.Var(n, "int64") for n in _Q_DIMS[q_rank]]
    T = relax.TensorType
    q = relax.Var("q", T(q_dims, dtype=None))
    params = [q] + [relax.Var(n, T(dtype=None, ndim=-1)) for n in ("k_cache", "weights", "seq_lens", "block_table")]

    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(relax.call_dps_packed(
                GLOBAL_NAME_SORTED if sorted else GLOBAL_NAME, relax.Tuple(params),
                out_ty=T(list(output_shape(q_dims, topk)), "int32")))
        bb.emit_func_output(out)
    return bb.get()


def prefill_module(topk: int = DEFAULT_TOPK, sorted: bool = False, ids: str = "relative"):
    """A Relax IRModule whose ``main(q, k, k_scale, weights, ks, ke)`` returns the int32 top-K ids
    ``[m, topk]`` of a prefill chunk (docs/contract.md §8) through ``R.call_dps_packed`` on
    ``prefill_global_name(sorted, ids)``.

    Declared as loosely as :func:`indexer_module`: q ``[m, h, d]`` with symbolic dims (its m is the
    output's), every other parameter of any shape, and no dtypes (fp8 or uint8/int8 views). One build
    serves every chunk size M, key count N and head count (64 or 32), and a wrong shape or dtype
    reaches the kernel's checks, which raise ValueError/TypeError naming the argument (q, k,
    k_scale, weights, ks, ke, topk_indices), instead of Relax's RuntimeError from a signature check.
    """
    from tvm import relax, tirx

    topk = checked_topk(topk)
    name = prefill_global_name(sorted, ids)
    register_global_funcs()
    q_dims = [tirx.Var(n, "int64") for n in ("m", "h", "d")]
    T = relax.TensorType
    q = relax.Var(_prefill.ARG_NAMES[0], T(q_dims, dtype=None))
    params = [q] + [relax.Var(n, T(dtype=None, ndim=-1)) for n in _prefill.ARG_NAMES[1:6]]

    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(relax.call_dps_packed(
                name, relax.Tuple(params), out_ty=T([q_dims[0], topk], "int32")))
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


__all__ = ["register_global_funcs", "indexer_module", "prefill_module", "prefill_global_name", "build", "GLOBAL_NAME",
           "GLOBAL_NAME_SORTED", "PREFILL_GLOBAL_NAME", "PREFILL_GLOBAL_NAMES"]
