"""The native functions, loaded once per process.

The CPU module always loads (no CUDA runtime needed). The CUDA module is loaded only when a CUDA
tensor arrives, so the package imports and works on machines without a GPU. _build decides where
each comes from: the module installed with the package, else a JIT build.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING

from . import _build, _native

if TYPE_CHECKING:
    import tvm_ffi

_lock = threading.Lock()


@functools.cache
def module_path(kind: str) -> str:
    """The file the `kind` ('cpu' or 'cuda') module is loaded from."""
    with _lock:
        return _build.cpu_library() if kind == "cpu" else _build.cuda_library()


@functools.cache
def _load(kind: str) -> tvm_ffi.Module:
    # imported here: tvm_ffi imports torch when it is installed, and importing this module (which
    # ffi_dsa.torch_ops does to register the ops) must load nothing native
    import tvm_ffi

    return tvm_ffi.load_module(module_path(kind))


def cpu_module() -> tvm_ffi.Module:
    return _load("cpu")


def cuda_module() -> tvm_ffi.Module:
    return _load("cuda")


@functools.cache
def cpu() -> _native.CpuFunctions:
    """The CPU module's exports, typed (_native.py)."""
    return _native.bind(cpu_module(), _native.CpuFunctions)


@functools.cache
def cuda() -> _native.CudaFunctions:
    """The CUDA module's exports, typed (_native.py); loads (or builds) the module on first use."""
    return _native.bind(cuda_module(), _native.CudaFunctions)


@functools.cache
def kernel_for(op: str, device_type: str):
    """The exported DPS function of op `op` ("topk_indexer", "prefill_topk_indexer") serving tensors
    of `device_type` ('cpu' or 'cuda'), looked up once (a module lookup per call would cost every
    caller on the eager path)."""
    if device_type == "cpu":
        return getattr(cpu(), op)
    if device_type == "cuda":
        return getattr(cuda(), op)
    raise ValueError(f"ffi_dsa supports CPU and CUDA tensors, got a tensor on {device_type!r}")
