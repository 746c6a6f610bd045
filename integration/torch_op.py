"""torch custom ops around the compiled TVM-FFI function: ``torch.ops.dsa.topk_indexer`` (functional)
and ``torch.ops.dsa.topk_indexer_out`` (destination-passing, mutates ``topk_indices``).

    torch.ops.dsa.topk_indexer(q, k_cache, weights, seq_lens, block_table, topk=2048, sorted=False) -> Tensor
    torch.ops.dsa.topk_indexer_out(q, k_cache, weights, seq_lens, block_table, topk_indices, sorted=False) -> ()

The functional op returns ``[B, topk]`` for q ``[B, H, 128]`` and ``[B, N, topk]`` for q
``[B, N, H, 128]`` (N query tokens per row, docs/contract.md §7); the out variant takes either
output form the contract allows.

Both have fake (meta) kernels, so they trace under ``torch.compile(fullgraph=True)`` (also with
``dynamic=True``), pass ``torch.library.opcheck``, and run inside ``torch.cuda.CUDAGraph`` capture:
the kernel never syncs with the host, tvm-ffi launches it on torch's current stream (it reads the
stream from torch for every call), and the scratch the CUDA path needs for long rows comes from
torch's caching allocator through tvm-ffi's env allocator (stream-ordered, capture-safe).

Registration route, chosen by measurement (``python -m ffi_dsa.integration.bench_torch_overhead``;
torch 2.13 CPU, a 2-core machine shared with other jobs, medians of 21 x 5000 calls; the min column
is the quietest repetition):

                                                           B=0 (no compute)   B=1, seq 64, K=16
                                                           median    min      median    min
    tvm-ffi function, preallocated output                   1.7      1.1       32.5     26.2
    torch.empty + tvm-ffi function                          3.8      2.3       35.2     27.7
    Library.define/impl + register_fake (used here):
      torch.ops.dsa.topk_indexer.default                    8.6      5.6       40.2     31.8
      torch.ops.dsa.topk_indexer (OpOverloadPacket)         8.9      5.6       40.9     31.4
      torch.ops.dsa.topk_indexer_out.default                5.7      3.7       37.7     29.5
    torch.library.custom_op, same body                     17.5     11.5       49.3     37.3
      through torch.ops.dsa_bench.topk_indexer             18.0     11.7       52.1     37.4

So the low-level ``Library`` route costs ~4-5 us over a bare ``torch.empty`` + call (the dispatcher
boxing the arguments for a Python kernel), ``custom_op`` ~14 us (its Python wrappers on top), i.e.
the Library route halves the per-call overhead (NOTES.md: both pass opcheck and compile). The DPS
out-variant is the cheapest way in through torch.ops (no allocation).

The kernels call the tvm-ffi function object of ``ffi_dsa._ffi_api.topk_indexer_for(device)``
directly; its C++ argument checks raise ValueError/TypeError, which propagate unchanged through
the dispatcher (these are Python kernels).
"""

from __future__ import annotations

import torch

from .. import _ffi_api
from .._arrays import ARG_NAMES, named_argument_error, output_shape
from ..api import checked_topk
from ..contract import DEFAULT_TOPK, MAX_TOPK

NAMESPACE = "dsa"

_SCHEMA = (
    "topk_indexer(Tensor q, Tensor k_cache, Tensor weights, Tensor seq_lens, Tensor block_table, "
    f"int topk={DEFAULT_TOPK}, bool sorted=False) -> Tensor"
)
_SCHEMA_OUT = (
    "topk_indexer_out(Tensor q, Tensor k_cache, Tensor weights, Tensor seq_lens, Tensor block_table, "
    "Tensor(a!) topk_indices, bool sorted=False) -> ()"
)

# ---- real kernels (CPU and CUDA dispatch keys) ------------------------------------------------

# The two kernels are on the eager hot path: kept flat (every Python call here costs ~0.1 us).
def _topk_indexer_kernel(q, k_cache, weights, seq_lens, block_table, topk=DEFAULT_TOPK, sorted=False):
    if topk < 0 or topk > MAX_TOPK:
        checked_topk(topk)
    # The dispatcher lets None through for a Tensor argument: named here, off the hot path.
    try:
        device = q.device
        out = torch.empty(output_shape(q.shape, topk), dtype=torch.int32, device=device)
        # Dispatch on q's device: a mismatched argument reaches the C++ placement check (ValueError)
        # instead of the dispatcher picking a kernel from whichever tensor has the "highest" device.
        _ffi_api.topk_indexer_for(device.type)(q, k_cache, weights, seq_lens, block_table, out, sorted)
    except (TypeError, AttributeError) as err:
        raise named_argument_error(err, (q, k_cache, weights, seq_lens, block_table)) from None
    return out


def _topk_indexer_out_kernel(q, k_cache, weights, seq_lens, block_table, topk_indices, sorted=False):
    try:
        _ffi_api.topk_indexer_for(q.device.type)(q, k_cache, weights, seq_lens, block_table, topk_indices, sorted)
    except (TypeError, AttributeError) as err:
        raise named_argument_error(err, (q, k_cache, weights, seq_lens, block_table, topk_indices)) from None


# ---- fake (meta) kernels ---------------------------------------------------------------------

def same_device(tensors, names=ARG_NAMES) -> None:
    """Under meta/fake tensors the dispatcher picks the fake kernel when any argument is meta, so the
    real kernel's placement check would never see a meta argument among real ones: checked here
    (`names`: the op's argument names, in order)."""
    for t, name in zip(tensors, names):
        if t is None:
            raise TypeError(f"{name} must be a tensor, got None")
        if t.device != tensors[0].device:
            raise ValueError(f"{name} is on {t.device} but q is on {tensors[0].device}; every "
                             "argument must be on one device")


def _topk_indexer_fake(q, k_cache, weights, seq_lens, block_table, topk=DEFAULT_TOPK, sorted=False):
    if isinstance(topk, int):
        checked_topk(topk)
    same_device((q, k_cache, weights, seq_lens, block_table))
    return q.new_empty(output_shape(q.shape, topk), dtype=torch.int32)


def _topk_indexer_out_fake(q, k_cache, weights, seq_lens, block_table, topk_indices, sorted=False):
    same_device((q, k_cache, weights, seq_lens, block_table, topk_indices))
    return None


def registered(name: str) -> bool:
    """Whether torch.ops.dsa.`name` exists (this file, or a copy of it, already ran)."""
    try:
        getattr(getattr(torch.ops, NAMESPACE), name).default
        return True
    except (AttributeError, RuntimeError):
        return False


def register_pair(name: str, schemas: tuple[str, str], kernels: tuple, fakes: tuple):
    """Defines torch.ops.dsa.`name` and `name`_out (pt2-compliant), with `kernels` for CPU and CUDA
    and `fakes` for tracing; returns the Library, which must stay alive for the ops to exist."""
    # FRAGMENT, not DEF: another fragment of the "dsa" namespace (or a second copy of this file
    # loaded under another module name) must not make the import fail.
    lib = torch.library.Library(NAMESPACE, "FRAGMENT")
    tags = (torch.Tag.pt2_compliant_tag,)
    for op, schema, kernel, fake in zip((name, f"{name}_out"), schemas, kernels, fakes):
        lib.define(schema, tags=tags)
        for key in ("CPU", "CUDA"):
            lib.impl(op, kernel, key)
        torch.library.register_fake(f"{NAMESPACE}::{op}", fake, lib=lib)
    return lib


# Keep the Library object alive: dropping it would unregister the ops.
_LIB = None if registered("topk_indexer") else register_pair(
    "topk_indexer", (_SCHEMA, _SCHEMA_OUT), (_topk_indexer_kernel, _topk_indexer_out_kernel),
    (_topk_indexer_fake, _topk_indexer_out_fake))

topk_indexer_op = torch.ops.dsa.topk_indexer.default
topk_indexer_out_op = torch.ops.dsa.topk_indexer_out.default


def topk_indexer(q, k_cache, weights, seq_lens, block_table, topk: int = DEFAULT_TOPK, sorted: bool = False):
    """``torch.ops.dsa.topk_indexer`` (functional): int32 ``[B, topk]`` on q's device, ``[B, N, topk]``
    for a rank-4 q (several query tokens per row, docs/contract.md §7)."""
    return topk_indexer_op(q, k_cache, weights, seq_lens, block_table, topk, sorted)


def topk_indexer_out(q, k_cache, weights, seq_lens, block_table, topk_indices, sorted: bool = False) -> None:
    """``torch.ops.dsa.topk_indexer_out`` (DPS): writes ``topk_indices`` (``[B, K]``; for a rank-4 q
    ``[B, N, K]`` or ``[B * N, K]``) in place."""
    topk_indexer_out_op(q, k_cache, weights, seq_lens, block_table, topk_indices, sorted)


__all__ = ["topk_indexer", "topk_indexer_out", "topk_indexer_op", "topk_indexer_out_op", "NAMESPACE"]
