"""Array-library plumbing: which framework an argument comes from, host copies, allocation."""

from __future__ import annotations

import numpy as np

# DLPack device types (dlpack.h)
DL_CPU, DL_CUDA = 1, 2

def _strict_bool(name: str, value) -> bool:
    """`value` as a Python bool when it is a bool (Python's or numpy's), else TypeError naming the
    option `name`: truthiness would read ``"no"`` as True and a tensor as a host sync, so an option
    that is a switch takes a switch, as torch's ``bool`` schema arguments do."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    kind = type(value)
    kind = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    raise TypeError(f"{name} must be a bool (True or False), got {kind} {value!r}")


def framework(x) -> str:
    module = type(x).__module__
    if module.startswith("torch"):
        return "torch"
    if module.startswith("jax") or module.startswith("jaxlib"):
        return "jax"
    if isinstance(x, np.ndarray):
        return "numpy"
    return "dlpack"


def device_type(x) -> str:
    """'cpu' or 'cuda' (anything else raises), read through DLPack so every framework works."""
    if isinstance(x, np.ndarray):
        return "cpu"
    # torch first through its C properties: torch's __dlpack_device__ is Python code, a large share
    # of an eager call's host time (other devices fall through to the DLPack answer below).
    if type(x).__module__.startswith("torch") and hasattr(x, "is_cuda"):
        if x.is_cuda:
            return "cuda"
        if x.is_cpu:
            return "cpu"
    try:
        dev_type, _ = x.__dlpack_device__()
    except AttributeError:
        raise TypeError(f"expected a DLPack tensor (torch, JAX, numpy, CuPy), got {type(x).__name__}") from None
    if dev_type == DL_CPU:
        return "cpu"
    if dev_type == DL_CUDA:
        return "cuda"
    raise ValueError(f"ffi_dsa supports CPU and CUDA tensors, got DLPack device type {dev_type}")


def check_tensor(x, name: str) -> None:
    """TypeError/ValueError naming the argument when `x` cannot reach the kernel as a tensor: not a
    DLPack tensor at all (a list, None, a framework object without __dlpack__), or a tensor with no
    data (torch's meta device)."""
    if isinstance(x, np.ndarray):
        return
    if not hasattr(x, "__dlpack__"):
        raise TypeError(f"{name} must be a tensor (torch, JAX, numpy, CuPy: anything with __dlpack__), "
                        f"got {type(x).__module__}.{type(x).__qualname__}")
    if getattr(x, "is_meta", False):
        raise ValueError(f"{name} is a torch meta tensor (shapes only, no data): ffi_dsa runs on CPU and CUDA "
                         "tensors (torch.ops.dsa.* give meta tensors their fake result)")


def named_argument_error(err: Exception, args, names) -> Exception:
    """The error to raise for `err`, caught around a call of the native function with the op's
    tensor arguments `args` (called `names`): the first argument that is no tensor, named; else
    `err` itself (tvm-ffi reports a mistyped argument by its position only)."""
    for x, name in zip(args, names):
        try:
            check_tensor(x, name)
        except (TypeError, ValueError) as named:
            return named
    return err


def as_dlpack_ready(x, name: str, fp8_ok: bool = False, output: bool = False):
    """`x` in a form DLPack can export (anything else passes through: the native call rejects it
    and named_argument_error names it). numpy float8 arrays cannot be exported: the one fp8
    argument (q, float8_e4m3fn) travels as a uint8 view of the same bytes; any other
    float8 (another fp8 format, or fp8 where the op wants something else) is a dtype error. A JAX
    output is refused here: DLPack would let the kernel write into an immutable array."""
    if output and framework(x) == "jax":
        raise TypeError(f"{name} is a JAX array, which is immutable: call the allocating entry point "
                        "(ffi_dsa.topk_indexer, ffi_dsa.prefill_topk_indexer: it returns a new JAX array) instead "
                        "of writing into one")
    if isinstance(x, np.ndarray) and x.dtype.name.startswith("float8"):
        if fp8_ok and x.dtype.name == "float8_e4m3fn":
            return x.view(np.uint8)
        expected = "float8_e4m3fn (or a uint8/int8 view of the same bytes)" if fp8_ok else "not a float8 type"
        raise TypeError(f"{name} must be {expected}, got numpy {x.dtype.name}")
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        # DLPack (as numpy exports it) cannot mark a buffer read-only, so numpy refuses to export one.
        if output:
            raise ValueError(f"{name} is a read-only numpy array; the op writes into it")
        return x.copy()  # inputs only: a host copy, on the CPU development path
    return x


# Array types DLPack exports as they are, which as_dlpack_ready passes through (torch tensors), learned
# on first sight: a call whose arguments are all of these skips the per-argument checks.
_AS_THEY_ARE: set[type] = set()


def all_dlpack_ready(args, names, fp8_args) -> list:
    """as_dlpack_ready on every argument of an op (`names`, in order; `fp8_args`: the positions that
    may be fp8; the last one is the output)."""
    if _AS_THEY_ARE.issuperset(map(type, args)):
        return args
    last = len(args) - 1
    ready = [as_dlpack_ready(x, names[i], fp8_ok=i in fp8_args, output=i == last) for i, x in enumerate(args)]
    _AS_THEY_ARE.update(type(x) for x in args if type(x).__module__.startswith("torch") and hasattr(x, "__dlpack__"))
    return ready


def to_numpy(x) -> np.ndarray:
    """A host copy (or view) of any supported array; fp8 comes back as raw uint8 bytes."""
    fw = framework(x)
    if fw == "torch":
        import torch

        t = x.detach()
        if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            t = t.view(torch.uint8)
        return t.cpu().numpy()
    arr = np.asarray(x) if fw != "dlpack" else np.from_dlpack(x)
    if arr.dtype.name.startswith("float8"):
        arr = arr.view(np.uint8)
    return arr


def empty_like_framework(x, shape: tuple[int, ...], dtype: str = "int32"):
    """Allocate an output of `shape` in the framework and on the device of `x`."""
    fw = framework(x)
    if fw == "torch":
        import torch

        return torch.empty(shape, dtype=getattr(torch, dtype), device=x.device)
    if fw == "numpy":
        return np.empty(shape, dtype=dtype)
    if fw == "jax":
        raise TypeError("JAX arrays are immutable: use the allocating entry points (ffi_dsa.topk_indexer, "
                        "ffi_dsa.prefill_topk_indexer), which return a new one")
    raise TypeError(f"cannot allocate an output for {type(x).__name__}; use the DPS entry point "
                    "(ffi_dsa.call, ffi_dsa.prefill_call) with your own buffer")
