"""JAX: the prefill indexer (docs/contract.md, prefill) as an XLA FFI custom call, under ``jax.jit``.

    from ffi_dsa.integration.jax_prefill import prefill_topk
    idx = jax.jit(prefill_topk, static_argnames=("topk", "sorted", "ids"))(q, k, k_scale, weights, ks, ke)

The CPU module's ``prefill_topk_indexer(q, k, k_scale, weights, ks, ke, topk_indices, sorted,
absolute_ids)`` is registered with ``jax_tvm_ffi.register_ffi_target`` as the XLA FFI target
``ffi_dsa_prefill_topk_indexer`` (arg spec ``args, rets, attrs.sorted, attrs.absolute_ids``): the
CPU target on first use, the GPU target (the CUDA module's export of the same name) when a call is
made for the GPU. ``jax.vmap`` over chunks that share k is one call on their rows stacked (element
by element when k itself is vmapped). Under a ``jax.jit`` over a mesh, row-sharded q, weights, ks
and ke give one local call per device on its own rows with k and k_scale replicated, as for decode
(jax_sharding.py); a row count that does not divide is padded by XLA with empty rows; inside a
user's ``jax.shard_map`` the call is the local one.

As in jax_ffi.py, shapes and dtypes are checked at trace time by the exported C++
``prefill_check_shapes`` (the kernel's own checks), raising ValueError/TypeError naming the argument.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import jax_tvm_ffi

from .. import _ffi_api
from ..api import checked_topk
from ..contract import DEFAULT_TOPK
from ..prefill import ARG_NAMES, absolute_ids, kernel_for
from .jax_ffi import checked_for_trace, once_per_platform, run_shape_check
from .jax_sharding import batch_partitioned

TARGET = "ffi_dsa_prefill_topk_indexer"


def _register_target(platform: str) -> None:
    # The CUDA kernel takes no scratch and syncs nothing, so XLA may record it in a command buffer.
    gpu = platform == "gpu"
    jax_tvm_ffi.register_ffi_target(TARGET, kernel_for("cuda" if gpu else "cpu"),
                                    ["args", "rets", "attrs.sorted", "attrs.absolute_ids"],
                                    platform=platform, allow_cuda_graph=gpu)


register = once_per_platform(_register_target)  # register(platform): 'cpu' or 'gpu'


@functools.lru_cache(maxsize=512)
def check_shapes(shapes: tuple, dtypes: tuple, topk: int) -> None:
    """Run the kernel's own C++ argument checks on shapes and dtypes (cached for valid inputs)."""
    checked_topk(topk)  # not a tensor shape yet, so C++ cannot see it
    rows = shapes[0][0] if shapes[0] else 0
    run_shape_check(_ffi_api.cpu().prefill_check_shapes, ARG_NAMES, shapes, dtypes, (rows, topk))


# Positions of the per-row operands among (q, k, k_scale, weights, ks, ke): a mesh splits these by
# rows and replicates k and k_scale, so each device runs the call on its own query rows.
ROW_ARGS = (0, 3, 4, 5)


def _rows_emptied(args, valid):
    """The operands with the rows where `valid` is False made empty (ks = ke = 0: all -1, no work)."""
    q, k, k_scale, weights, ks, ke = args
    return q, k, k_scale, weights, jnp.where(valid, ks, 0).astype(ks.dtype), jnp.where(valid, ke, 0).astype(ke.dtype)


@functools.cache
def _op(topk: int, sorted: bool, absolute: bool):
    def local(q, k, k_scale, weights, ks, ke):
        out = jax.ShapeDtypeStruct((q.shape[0], topk), jnp.int32)
        call = jax.ffi.ffi_call(TARGET, out, vmap_method="sequential")
        return call(q, k, k_scale, weights, ks, ke, sorted=sorted, absolute_ids=absolute)

    # Under a jit over several devices, one local call per device on its rows (jax_sharding.py); on
    # one device this is the plain call.
    partitioned = batch_partitioned(local, ROW_ARGS, _rows_emptied)

    @jax.custom_batching.custom_vmap
    def op(q, k, k_scale, weights, ks, ke):
        return partitioned(q, k, k_scale, weights, ks, ke)

    @op.def_vmap
    def _rule(axis_size, in_batched, *args):
        # Rows are independent and read only k: over a shared k the vmapped chunks are one call on
        # their rows stacked; a vmapped k (a key buffer per element) runs element by element.
        def lead(x, batched):
            return x if batched else jnp.broadcast_to(x, (axis_size, *x.shape))

        if in_batched[1] or in_batched[2]:
            full = tuple(lead(x, b) for x, b in zip(args, in_batched))
            return jax.lax.map(lambda a: op(*a), full), True

        def fold(x, batched):  # [V, M, ...] -> [V * M, ...]
            x = lead(x, batched)
            return x.reshape((-1, *x.shape[2:]))

        rows = args[0].shape[1] if in_batched[0] else args[0].shape[0]
        folded = [fold(x, b) if i in ROW_ARGS else x for i, (x, b) in enumerate(zip(args, in_batched))]
        return op(*folded).reshape(axis_size, rows, topk), True

    # jit: an eager call reuses one compiled executable per shape; inside a caller's jit it inlines.
    return jax.jit(op)


def prefill_topk(q, k, k_scale, weights, ks, ke, topk: int = DEFAULT_TOPK, sorted: bool = False,
                 ids: str = "relative"):
    """int32 ``[M, topk]``: each query row's top-K key ids (ffi_dsa.prefill_topk), as a JAX array.

    Works eagerly and inside ``jax.jit`` (``topk``, ``sorted`` and ``ids`` static there) on the
    CPU and the GPU. Shape/dtype mistakes raise ValueError/TypeError at trace time.
    """
    absolute = absolute_ids(ids)
    args = [x if isinstance(x, jax.Array) else jnp.asarray(x) for x in (q, k, k_scale, weights, ks, ke)]
    topk = checked_for_trace(args, topk, ("topk", "sorted", "ids"), check_shapes, register, TARGET)
    return _op(topk, bool(sorted), absolute)(*args)


__all__ = ["prefill_topk", "register", "check_shapes", "TARGET"]
