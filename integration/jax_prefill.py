"""JAX: the prefill indexer (docs/contract.md, prefill) as an XLA FFI custom call, under ``jax.jit``.

    from ffi_dsa.integration.jax_prefill import prefill_topk
    idx = jax.jit(prefill_topk, static_argnames=("topk", "sorted", "ids"))(q, k, k_scale, weights, ks, ke)

The CPU module's ``prefill_topk_indexer(q, k, k_scale, weights, ks, ke, topk_indices, sorted,
absolute_ids)`` is registered with ``jax_tvm_ffi.register_ffi_target`` as the XLA FFI target
``ffi_dsa_prefill_topk_indexer`` (arg spec ``args, rets, attrs.sorted, attrs.absolute_ids``), on
the CPU only: there is no CUDA prefill kernel yet, so arrays on another platform raise
NotImplementedError at trace time. ``jax.vmap`` runs the call once per element (XLA's
"sequential"); splitting rows over a mesh, as jax_sharding.py does for decode, is not done yet.

As in jax_ffi.py, shapes and dtypes are checked at trace time by the exported C++
``prefill_check_shapes`` (the kernel's own checks), raising ValueError/TypeError naming the argument.
"""

from __future__ import annotations

import functools
import threading

import jax
import jax.numpy as jnp
import jax_tvm_ffi
import tvm_ffi

from .. import _ffi_api
from ..api import checked_topk
from ..contract import DEFAULT_TOPK
from ..prefill import ARG_NAMES, absolute_ids, kernel_for
from .jax_ffi import _dtype_arg, _platform_of

TARGET = "ffi_dsa_prefill_topk_indexer"

_registered = False
_lock = threading.Lock()


def register() -> None:
    """Register the CPU FFI target; idempotent, thread-safe."""
    global _registered
    with _lock:
        if not _registered:
            jax_tvm_ffi.register_ffi_target(TARGET, kernel_for("cpu"), ["args", "rets", "attrs.sorted",
                                                                        "attrs.absolute_ids"], platform="cpu")
            _registered = True


@functools.lru_cache(maxsize=512)
def check_shapes(shapes: tuple, dtypes: tuple, topk: int) -> None:
    """Run the kernel's own C++ argument checks on shapes and dtypes (cached for valid inputs)."""
    checked_topk(topk)  # not a tensor shape yet, so C++ cannot see it
    args = []
    for name, shape, dtype in zip(ARG_NAMES, shapes, dtypes):  # (the inputs: zip stops before the output)
        args += [shape, _dtype_arg(name, dtype)]
    rows = shapes[0][0] if shapes[0] else 0
    _ffi_api.cpu().prefill_check_shapes(*args, (rows, topk), tvm_ffi.dtype("int32"))


@functools.cache
def _op(topk: int, sorted: bool, absolute: bool):
    def op(q, k, k_scale, weights, ks, ke):
        out = jax.ShapeDtypeStruct((q.shape[0], topk), jnp.int32)
        call = jax.ffi.ffi_call(TARGET, out, vmap_method="sequential")
        return call(q, k, k_scale, weights, ks, ke, sorted=sorted, absolute_ids=absolute)

    # jit: an eager call reuses one compiled executable per shape; inside a caller's jit it inlines.
    return jax.jit(op)


def prefill_topk(q, k, k_scale, weights, ks, ke, topk: int = DEFAULT_TOPK, sorted: bool = False,
                 ids: str = "relative"):
    """int32 ``[M, topk]``: each query row's top-K key ids (ffi_dsa.prefill_topk), as a JAX array.

    Works eagerly and inside ``jax.jit`` (``topk``, ``sorted`` and ``ids`` static there) on the
    CPU. Shape/dtype mistakes raise ValueError/TypeError at trace time.
    """
    absolute = absolute_ids(ids)
    args = [x if isinstance(x, jax.Array) else jnp.asarray(x) for x in (q, k, k_scale, weights, ks, ke)]
    try:
        topk = int(topk)
    except TypeError:
        raise TypeError("topk must be a static Python int (mark it static in jax.jit: "
                        "static_argnames=('topk', 'sorted', 'ids'))") from None
    check_shapes(tuple(tuple(int(d) for d in a.shape) for a in args), tuple(str(a.dtype) for a in args), topk)
    platform, known = _platform_of(args)
    if known and platform != "cpu":
        kernel_for("cuda" if platform == "gpu" else platform)  # NotImplementedError names the missing kernel
    # (Under jit the platform is only a guess: a jit over CPU arrays on a GPU host must still trace.
    # A call that does land on a GPU fails in XLA: no handler of this target is registered there.)
    register()
    return _op(topk, bool(sorted), absolute)(*args)


__all__ = ["prefill_topk", "register", "check_shapes", "TARGET"]
