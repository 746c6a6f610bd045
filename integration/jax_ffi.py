"""JAX: the compiled TVM-FFI function as an XLA FFI custom call, usable under ``jax.jit`` and ``jax.vmap``.

    from ffi_dsa.integration.jax_ffi import topk_indexer
    idx = jax.jit(topk_indexer, static_argnames=("topk", "sorted"))(q, k_cache, weights, seq_lens, block_table)

The exported function ``topk_indexer(q, k_cache, weights, seq_lens, block_table, topk_indices, sorted)``
is registered with ``jax_tvm_ffi.register_ffi_target`` as the XLA FFI target ``ffi_dsa_topk_indexer``
(arg spec ``args, rets, attrs.sorted``): the CPU target on first use, the GPU target only when a
call is made for the GPU (building the CUDA module needs nvcc). On the GPU, tvm-ffi hands the kernel
XLA's stream. fp8 arrays (``jnp.float8_e4m3fn``) go in directly; uint8/int8 views are accepted too.

Several devices: under a ``jax.jit`` over a mesh, batch-sharded inputs give one local call per
device on its own rows (a ``custom_partitioning`` rule, jax_sharding.py), and inside a user's
``jax.shard_map`` the call is the local one.

Errors: a C++ error inside an XLA custom call surfaces as an opaque ``JaxRuntimeError``, so shapes
and dtypes are checked at trace time by the exported C++ ``check_shapes`` (the very checks the
kernel runs; no second copy in Python), which raises ValueError/TypeError naming the argument.
"""

from __future__ import annotations

import functools
import threading
import warnings

import jax
import jax.numpy as jnp
import jax_tvm_ffi
import tvm_ffi

from .. import _ffi_api
from .._arrays import ARG_NAMES, output_shape
from ..api import checked_topk
from ..contract import DEFAULT_TOPK
from .jax_sharding import batch_partitioned

TARGET = "ffi_dsa_topk_indexer"

def once_per_platform(register_target):
    """``register(platform)`` for an FFI target: calls ``register_target(platform)`` (which registers
    it with jax-tvm-ffi for 'cpu' or 'gpu') the first time a platform asks; idempotent, thread-safe."""
    done: set[str] = set()
    lock = threading.Lock()

    def register(platform: str) -> None:
        if platform in done:
            return
        if platform not in ("cpu", "gpu"):
            raise ValueError(f"ffi_dsa supports JAX arrays on 'cpu' and 'gpu' (CUDA), got platform {platform!r}")
        with lock:
            if platform not in done:
                register_target(platform)
                done.add(platform)

    return register


def _register_target(platform: str) -> None:
    gpu = platform == "gpu"
    fn = _ffi_api.topk_indexer_for("cuda" if gpu else "cpu")
    # On the GPU the call's scratch is XLA's: a last output sized by the CPU module's
    # workspace_bytes (the bound the launch itself uses), from which jax-tvm-ffi serves the
    # kernel's allocation. The call then allocates nothing and syncs nothing, so XLA may record it
    # in a command buffer (a CUDA graph) with the kernels around it, instead of the host launching
    # every kernel of a jitted step one by one.
    jax_tvm_ffi.register_ffi_target(
        TARGET, fn, ["args", "rets", "attrs.sorted"], platform=platform,
        allow_cuda_graph=gpu, use_last_output_for_alloc_workspace=gpu,
    )


register = once_per_platform(_register_target)


def checked_for_trace(args, topk, static_names: tuple, check_shapes, register, target: str) -> int:
    """What an entry point does before it calls its op: `topk` as a static int (TypeError naming
    the static arguments otherwise), the C++ checks on the arrays' shapes and dtypes
    (`check_shapes(shapes, dtypes, topk)`), and `target` registered for their platform."""
    try:
        topk = int(topk)
    except TypeError:
        raise TypeError("topk must be a static Python int (mark it static in jax.jit: "
                        f"static_argnames={tuple(static_names)!r})") from None
    check_shapes(tuple(tuple(int(d) for d in a.shape) for a in args), tuple(str(a.dtype) for a in args), topk)
    register_for(register, args, target)
    return topk


def register_for(register, arrays, target: str) -> None:
    """Register `target` (through its module's `register(platform)`) for the CPU, and for the
    platform of `arrays` when that is another one."""
    register("cpu")  # cheap, and lets a jit traced here also run on the CPU
    platform, known = _platform_of(arrays)
    if platform == "cpu":
        return
    try:
        register(platform)
    except Exception as err:
        if known:
            raise
        # Only a guess (tracers, default backend): a jit meant for the CPU must not fail because
        # the CUDA module cannot be built here. A GPU run would then fail in XLA.
        warnings.warn(f"ffi_dsa: could not register the {platform!r} FFI target {target} ({err}); "
                      "only the CPU target is available", RuntimeWarning, stacklevel=3)


def _platform_of(arrays) -> tuple[str, bool]:
    """(platform, known): the platform of a concrete input array (known), else JAX's default
    device (a guess: under ``jax.jit`` the inputs are tracers and carry no device)."""
    for a in arrays:
        try:
            return next(iter(a.devices())).platform, True
        except Exception:  # tracers (ConcretizationTypeError), deleted arrays: use the default
            break
    default = jax.config.jax_default_device
    if default is not None:
        return (default if isinstance(default, str) else default.platform), False
    return jax.default_backend(), False


def _dtype_arg(name: str, dtype) -> tvm_ffi.dtype:
    try:
        return tvm_ffi.dtype(str(jnp.dtype(dtype)))
    except Exception:
        raise TypeError(f"{name} has dtype {dtype}, which cannot be passed to the kernel") from None


def run_shape_check(native_check, names, shapes: tuple, dtypes: tuple, out_shape) -> None:
    """`native_check` (an op's exported C++ check on (shape, dtype) pairs) on the inputs' shapes and
    dtypes and an int32 output of `out_shape`; `names` name the inputs in its dtype errors."""
    args = []
    for name, shape, dtype in zip(names, shapes, dtypes):  # (the inputs: zip stops before the output)
        args += [shape, _dtype_arg(name, dtype)]
    native_check(*args, out_shape, tvm_ffi.dtype("int32"))


@functools.lru_cache(maxsize=512)
def check_shapes(shapes: tuple, dtypes: tuple, topk: int) -> None:
    """Run the kernel's own C++ argument checks on shapes and dtypes (cached for valid inputs)."""
    checked_topk(topk)  # not a tensor shape yet, so C++ cannot see it
    run_shape_check(_ffi_api.cpu().check_shapes, ARG_NAMES, shapes, dtypes, output_shape(shapes[0], topk))


def workspace_bytes(q_shape, block_table_shape) -> int:
    """Bytes of XLA scratch a GPU call of these (local) shapes takes: the CPU module's
    workspace_bytes, from cuda/include/ffi_dsa/workspace_bytes.h."""
    query_rows = q_shape[0] * (q_shape[1] if len(q_shape) == 4 else 1)
    return int(_ffi_api.cpu().workspace_bytes(int(query_rows), int(block_table_shape[1])))


def _ffi_topk(q, k_cache, weights, seq_lens, block_table, *, topk: int, sorted: bool):
    args = (q, k_cache, weights, seq_lens, block_table)
    out = jax.ShapeDtypeStruct(output_shape(q.shape, topk), jnp.int32)
    # Only reached if the raw primitive is vmapped outside the custom_vmap rule below.
    vmap_method = "sequential"

    def on_cpu(*a):
        return jax.ffi.ffi_call(TARGET, out, vmap_method=vmap_method)(*a, sorted=bool(sorted))

    def on_gpu(*a):
        scratch = jax.ShapeDtypeStruct((max(1, workspace_bytes(q.shape, block_table.shape)),), jnp.uint8)
        return jax.ffi.ffi_call(TARGET, (out, scratch), vmap_method=vmap_method)(*a, sorted=bool(sorted))[0]

    return jax.lax.platform_dependent(*args, cpu=on_cpu, default=on_gpu)


@functools.cache
def _batched_op(topk: int, sorted: bool):
    """The op with a vmap rule that uses the kernel's own batch dimension.

    Every argument but the cache is per row ([B, ...]) and rows are independent, so vmapping over
    requests that share one paged cache (the usual case: one page pool, many sequences) is the
    same op on a bigger batch: fold the vmapped axis into B and launch once, instead of XLA's
    generic "sequential" (one launch per element, in a loop). When the cache itself is vmapped
    (one pool per element), page ids of different elements name different pages, so those
    elements run one after the other (lax.map, i.e. "sequential").
    """

    # Under a jit over several devices, one local call per device on its own rows
    # (jax_sharding.py); on one device this is the plain call.
    partitioned = batch_partitioned(functools.partial(_ffi_topk, topk=topk, sorted=sorted))

    @jax.custom_batching.custom_vmap
    def op(q, k_cache, weights, seq_lens, block_table):
        return partitioned(q, k_cache, weights, seq_lens, block_table)

    @op.def_vmap
    def _rule(axis_size, in_batched, q, k_cache, weights, seq_lens, block_table):
        def lead(x, batched):  # give every argument the vmapped axis in front
            return x if batched else jnp.broadcast_to(x, (axis_size, *x.shape))

        q_b, k_b, w_b, s_b, t_b = in_batched
        if k_b:
            rows = tuple(lead(x, b) for x, b in zip((q, weights, seq_lens, block_table), (q_b, w_b, s_b, t_b)))
            out = jax.lax.map(lambda a: op(a[0], a[1], a[2], a[3], a[4]),
                              (rows[0], k_cache, rows[1], rows[2], rows[3]))
            return out, True

        # [V, B, ...] -> [V * B, ...]: every per-row form folds alike (weights [V, B * N, H] becomes
        # [V * B * N, H], row-major like q's [V * B, N, ...]).
        def fold(x, batched):
            x = lead(x, batched)
            return x.reshape((-1, *x.shape[2:]))

        batch = q.shape[1] if q_b else q.shape[0]
        out = op(fold(q, q_b), k_cache, fold(weights, w_b), fold(seq_lens, s_b), fold(block_table, t_b))
        return out.reshape(axis_size, batch, *out.shape[1:]), True

    # jit: an eager call then reuses one compiled executable per shape (about half the overhead of
    # binding custom_vmap eagerly); inside a caller's jit this simply inlines.
    return jax.jit(op)


def topk_indexer(q, k_cache, weights, seq_lens, block_table, topk: int = DEFAULT_TOPK, sorted: bool = False):
    """int32 ``[B, topk]``: the top-K token ids of each row (docs/contract.md), as a JAX array;
    ``[B, N, topk]`` for a rank-4 q ``[B, N, H, 128]`` (N query tokens per row, §7).

    Works eagerly and inside ``jax.jit`` (``topk`` and ``sorted`` must be static there),
    ``jax.vmap`` and ``jax.shard_map``; a jit over several devices keeps the batch sharding of the
    inputs (jax_sharding.py). Shape/dtype mistakes raise ValueError/TypeError at trace time.
    """
    args = [x if isinstance(x, jax.Array) else jnp.asarray(x) for x in (q, k_cache, weights, seq_lens, block_table)]
    topk = checked_for_trace(args, topk, ("topk", "sorted"), check_shapes, register, TARGET)
    return _batched_op(topk, bool(sorted))(*args)


__all__ = ["topk_indexer", "register", "check_shapes", "workspace_bytes", "TARGET"]
