"""JAX: each op of the package as an XLA FFI custom call, usable under ``jax.jit``, ``jax.vmap`` and
``jax.shard_map``. The allocating entry points come here for JAX arrays:

    idx = jax.jit(ffi_dsa.topk_indexer, static_argnames=("topk", "sorted", "ids", "max_seq_len"))(
        q, k_cache, weights, seq_lens, block_table)
    idx = jax.jit(ffi_dsa.prefill_topk_indexer, static_argnames=("topk", "sorted", "ids"))(q, k, k_scale,
                                                                                           weights, ks, ke)

Each op's
exported DPS function is registered with ``jax_tvm_ffi.register_ffi_target`` as the XLA FFI target
``ffi_dsa_<op>`` (arg spec ``args, rets, attrs.<attribute>...``; the options are XLA attributes, so
static: decode's ``max_seq_len`` compiles once per value): the CPU target on first use, the
GPU target only when a call is made for the GPU (building the CUDA module needs nvcc). On the GPU,
tvm-ffi hands the kernel XLA's stream. fp8 arrays (``jnp.float8_e4m3fn``) go in directly;
uint8/int8 views are accepted too.

Several devices: under a ``jax.jit`` over a mesh, row-sharded inputs give one local call per device
on its own rows (a ``custom_partitioning`` rule, jax_sharding.py), and inside a user's
``jax.shard_map`` the call is the local one. ``jax.vmap`` over calls that share the key cache (decode)
or the key buffer (prefill) is one call on their rows stacked; over a vmapped cache, one call per
element.

Errors: a C++ error inside an XLA custom call surfaces as an opaque ``JaxRuntimeError``, so shapes
and dtypes are checked at trace time by the op's exported C++ ``<op>_check_shapes`` (the very checks
the kernel runs; no second copy in Python), which raises ValueError/TypeError naming the argument.
"""

from __future__ import annotations

import functools
import threading
import warnings

import jax
import jax.numpy as jnp
import jax_tvm_ffi
import tvm_ffi

from . import _build, _ffi_api
from ._arrays import _strict_bool
from ._op import Op, checked_topk
from .jax_sharding import batch_partitioned


def target(op: Op) -> str:
    """The XLA FFI target of `op`."""
    return f"ffi_dsa_{op.name}"


# ---- registration: once per op and platform -------------------------------------------------

_registered: set[tuple[str, str]] = set()
_lock = threading.Lock()


def register(op: Op, platform: str) -> None:
    """Register `op`'s target for `platform` ('cpu' or 'gpu') with jax-tvm-ffi, the first time it is
    asked for; idempotent, thread-safe."""
    if (op.name, platform) in _registered:
        return
    if platform not in ("cpu", "gpu"):
        raise ValueError(f"ffi_dsa supports JAX arrays on 'cpu' and 'gpu' (CUDA), got platform {platform!r}")
    with _lock:
        if (op.name, platform) in _registered:
            return
        gpu = platform == "gpu"
        # On the GPU an op with scratch takes XLA's: a last output sized by the CPU module's
        # workspace_bytes (the bound the launch itself uses), from which jax-tvm-ffi serves the
        # kernel's allocation. The call then allocates nothing and syncs nothing, so XLA may record
        # it in a command buffer (a CUDA graph) with the kernels around it.
        jax_tvm_ffi.register_ffi_target(
            target(op), op.kernel_for("cuda" if gpu else "cpu"),
            ["args", "rets", *(f"attrs.{o.attr}" for o in op.options)], platform=platform,
            allow_cuda_graph=gpu, use_last_output_for_alloc_workspace=gpu and op.workspace_rows is not None,
        )
        _registered.add((op.name, platform))


def register_for(op: Op, arrays) -> None:
    """Register `op` for the CPU, and for the platform of `arrays` when that is another one."""
    register(op, "cpu")  # cheap, and lets a jit traced here also run on the CPU
    platform, known = _platform_of(arrays)
    if platform == "cpu":
        return
    try:
        register(op, platform)
    except Exception as err:
        if known:
            raise
        # Only a guess (tracers, default backend): a jit meant for the CPU must not fail because
        # the CUDA module cannot be built here. A GPU run would then fail in XLA.
        warnings.warn(f"ffi_dsa: could not register the {platform!r} FFI target {target(op)} ({err}); "
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


# ---- trace-time checks and sizes -------------------------------------------------------------

def _dtype_arg(name: str, dtype) -> tvm_ffi.dtype:
    try:
        return tvm_ffi.dtype(str(jnp.dtype(dtype)))
    except Exception:
        raise TypeError(f"{name} has dtype {dtype}, which cannot be passed to the kernel") from None


@functools.lru_cache(maxsize=512)
def check_shapes(op: Op, shapes: tuple, dtypes: tuple, topk: int) -> None:
    """Run `op`'s own C++ argument checks on its inputs' shapes and dtypes and the int32 output a
    call would make (cached for valid inputs)."""
    checked_topk(topk)  # not a tensor shape yet, so C++ cannot see it
    native_check = getattr(_ffi_api.cpu(), f"{op.name}_check_shapes")
    types = [_dtype_arg(name, dtype) for name, dtype in zip(op.arg_names, dtypes)]
    native_check([*shapes, op.output_shape(shapes[0], topk)], [*types, tvm_ffi.dtype("int32")])


def _gpu_archs() -> list[str]:
    """The CUDA archs a GPU call traced here may run on: those of the GPUs JAX sees, else (no GPU to
    ask: the program may be exported for one) every arch the package holds kernels for."""
    known = [str(a) for a in _ffi_api.cpu().cuda_archs()]
    try:
        capabilities = {tuple(int(x) for x in d.compute_capability.split(".")) for d in jax.devices("gpu")}
    except Exception:  # no GPU backend
        capabilities = set()
    present = [a for a in known if _build.arch_capability(a) in capabilities]
    return present or known


def workspace_bytes(op: Op, shapes) -> int:
    """Bytes of XLA scratch a GPU call of `op` with these (local) input shapes takes: the largest the
    kernels of any arch it may run on take (cuda/include/ffi_dsa/cuda_archs.h), so that the size
    assumes no arch."""
    rows, pages = op.workspace_rows(shapes)
    return max(int(_ffi_api.cpu().workspace_bytes(arch, int(rows), int(pages))) for arch in _gpu_archs())


# ---- the call: local, partitioned over devices, batched under vmap --------------------------

def _local_call(op: Op, topk: int, attrs: dict):
    """One call of `op` on this device's operands."""
    def call(*args):
        out = jax.ShapeDtypeStruct(op.output_shape(args[0].shape, topk), jnp.int32)
        # vmap_method: only reached if the raw primitive is vmapped outside the custom_vmap rule below.
        def on_cpu(*a):
            return jax.ffi.ffi_call(target(op), out, vmap_method="sequential")(*a, **attrs)

        if op.workspace_rows is None:
            return on_cpu(*args)

        def on_gpu(*a):
            size = max(1, workspace_bytes(op, tuple(x.shape for x in args)))
            scratch = jax.ShapeDtypeStruct((size,), jnp.uint8)
            return jax.ffi.ffi_call(target(op), (out, scratch), vmap_method="sequential")(*a, **attrs)[0]

        return jax.lax.platform_dependent(*args, cpu=on_cpu, default=on_gpu)

    return call


@functools.cache
def batched_op(op: Op, topk: int, attrs: tuple):
    """`op` with a vmap rule that uses the kernel's own rows.

    Rows are independent and every argument but the shared ones (decode's cache, prefill's keys and
    scales) is per row, so vmapping over calls that share those is the same op on more rows: fold the
    vmapped axis into the rows and launch once, instead of XLA's generic "sequential" (one launch per
    element, in a loop). When a shared argument itself is vmapped (a cache per element), the page ids
    or key ranges of different elements name different keys, so those elements run one after the
    other (lax.map).
    """
    named = dict(zip((o.attr for o in op.options), attrs))
    # Under a jit over several devices, one local call per device on its own rows (jax_sharding.py);
    # on one device this is the plain call.
    partitioned = batch_partitioned(_local_call(op, topk, named), op.row_args, op.length_args)

    @jax.custom_batching.custom_vmap
    def batched(*args):
        return partitioned(*args)

    @batched.def_vmap
    def _rule(axis_size, in_batched, *args):
        def lead(x, is_batched):  # give every argument the vmapped axis in front
            return x if is_batched else jnp.broadcast_to(x, (axis_size, *x.shape))

        if any(in_batched[i] for i in range(len(args)) if i not in op.row_args):
            full = tuple(lead(x, b) for x, b in zip(args, in_batched))
            return jax.lax.map(lambda a: batched(*a), full), True

        # [V, B, ...] -> [V * B, ...]: every per-row form folds alike (decode's weights [V, B * N, H]
        # becomes [V * B * N, H], row-major like q's [V * B, N, ...]).
        def fold(x, is_batched):
            x = lead(x, is_batched)
            return x.reshape((-1, *x.shape[2:]))

        rows = args[0].shape[1] if in_batched[0] else args[0].shape[0]
        folded = [fold(x, b) if i in op.row_args else x for i, (x, b) in enumerate(zip(args, in_batched))]
        out = batched(*folded)
        return out.reshape(axis_size, rows, *out.shape[1:]), True

    # jit: an eager call then reuses one compiled executable per shape (about half the overhead of
    # binding custom_vmap eagerly); inside a caller's jit this simply inlines.
    return jax.jit(batched)


def _validate_concrete(op: Op, inputs) -> None:
    """`op`'s host checks (validate=True) on concrete arrays; a traced one (under jax.jit, vmap or
    shard_map) has no values to read, which is a ValueError saying what to do instead of numpy's
    TracerArrayConversionError."""
    traced = [name for name, x in zip(op.params, inputs) if isinstance(x, jax.core.Tracer)]
    if traced:
        check = f"{op.validate_with} " if op.validate_with else "the op's host checks "
        raise ValueError(f"validate=True reads the inputs' values on the host, but {', '.join(traced)} "
                         f"{'is' if len(traced) == 1 else 'are'} traced (inside jax.jit, vmap or shard_map), with "
                         f"no values yet: run {check}on the concrete arrays before the traced function, or call "
                         "the op outside it with validate=True; inside it pass validate=False (the kernels mask "
                         "what validate would report)")
    op.validate(*inputs)


def call(op: Op, inputs, topk, options: dict, validate: bool = False):
    """`op`'s output as a JAX array (the allocating entry points' JAX route): the trace-time checks,
    the targets registered, the call. `validate` runs the op's host checks on concrete arrays (under
    jit there is nothing on the host to look at)."""
    for option in op.options:
        if isinstance(options.get(option.name), jax.core.Tracer):
            raise TypeError(f"{option.name} must be a static Python value (mark it static in jax.jit: "
                            f"static_argnames={('topk', *(o.name for o in op.options))!r})")
    attrs = op.attrs(options)
    if _strict_bool("validate", validate):
        _validate_concrete(op, inputs)
    args = [x if isinstance(x, jax.Array) else jnp.asarray(x) for x in inputs]
    try:
        topk = int(topk)
    except TypeError:
        static = ("topk", *(o.name for o in op.options))
        raise TypeError(f"topk must be a static Python int (mark it static in jax.jit: static_argnames={static!r})") \
            from None
    check_shapes(op, tuple(tuple(int(d) for d in a.shape) for a in args), tuple(str(a.dtype) for a in args), topk)
    register_for(op, args)
    return batched_op(op, topk, attrs)(*args)


__all__ = ["call", "register", "check_shapes", "workspace_bytes", "target"]
