"""ffi_dsa: the DeepSeek sparse-attention (DSA) indexer top-k as one TVM-FFI DPS op.

For each decode row b, score every cached token t with 64 (or 32) FP8 index heads,

    score[t] = sum_h weights[b, h] * relu(sum_d q[b, h, d] * k[t, d] * scale[t])

and return the global ids (page * 64 + slot) of the K best tokens, -1 padded. With N query tokens
per row (q [B, N, H, 128]), each query scores the prefix of its row it sees and gets its own top-K. The contract (layouts,
ties, NaN, bad input, precision, entry points) is docs/contract.md of the repository; an installed
package carries it as ffi_dsa/docs/contract.md.
"""

from __future__ import annotations

import sys as _sys
from importlib import import_module as _import_module
from pathlib import Path as _Path

from ._build import NativeBuildError

# In a source checkout the framework integrations and the benchmarks sit in ../integration and
# ../benchmarks (a wheel carries them inside the package): let `ffi_dsa.integration` and
# `ffi_dsa.benchmarks` resolve in both layouts.
_repo = _Path(__file__).resolve().parent.parent
if not (_Path(__file__).parent / "integration").is_dir() and (_repo / "integration" / "__init__.py").is_file():
    __path__.append(str(_repo))  # type: ignore[name-defined]  # noqa: F821

# The public API, by the module that defines it.
_API_MODULES = {
    "api": ("call", "topk_indexer", "validate_pages"),
    "cpu_options": ("cpu_kernel", "cpu_kernels", "set_cpu_kernel", "set_cpu_threads"),
    "kv_cache": ("pack_k_cache", "unpack_k_cache"),
    "prefill": ("prefill_topk", "prefill_topk_indexer", "validate_prefill"),
    "reference": ("check_topk", "reference", "reference_scores"),
    "reference_prefill": ("check_prefill_topk", "reference_prefill", "reference_prefill_scores"),
}
_API = {name: module for module, names in _API_MODULES.items() for name in names}


def _started_as_command() -> bool:
    """Whether this process is the `ffi-dsa` command (or `python -m ffi_dsa`), which imports the
    package before its own code runs: `ffi-dsa --help` and `ffi-dsa info` need neither the native
    module nor torch (tvm_ffi imports torch too), whose imports are most of the time a command
    takes to start; ffi_dsa.__main__ loads what its other commands need."""
    if _Path(_sys.argv[0]).name.startswith("ffi-dsa"):
        return True
    argv = getattr(_sys, "orig_argv", [])
    return any(a == "-m" and argv[i + 1:i + 2] in (["ffi_dsa"], ["ffi_dsa.__main__"]) for i, a in enumerate(argv))


def __getattr__(name: str):
    """The API, loaded on first use where the import left it out (the command line's process)."""
    if name not in _API:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_import_module(f".{_API[name]}", __name__), name)
    globals()[name] = value
    return value


if not _started_as_command():
    from .api import call, topk_indexer, validate_pages
    from .cpu_options import cpu_kernel, cpu_kernels, set_cpu_kernel, set_cpu_threads
    from .kv_cache import pack_k_cache, unpack_k_cache
    from .prefill import prefill_topk, prefill_topk_indexer, validate_prefill
    from .reference import check_topk, reference, reference_scores
    from .reference_prefill import check_prefill_topk, reference_prefill, reference_prefill_scores

    # torch.ops.dsa.topk_indexer / topk_indexer_out (and the prefill_topk_indexer pair) exist
    # whenever torch is importable.
    try:
        import torch as _torch  # noqa: F401
    except ImportError:
        pass
    else:
        from .integration import torch_op as _torch_op  # noqa: F401
        from .integration import torch_prefill_op as _torch_prefill_op  # noqa: F401

__version__ = "0.1.0"
__all__ = [
    "call",
    "topk_indexer",
    "validate_pages",
    "pack_k_cache",
    "unpack_k_cache",
    "reference",
    "reference_scores",
    "check_topk",
    "prefill_topk_indexer",
    "prefill_topk",
    "validate_prefill",
    "reference_prefill",
    "reference_prefill_scores",
    "check_prefill_topk",
    "NativeBuildError",
    "set_cpu_kernel",
    "cpu_kernel",
    "cpu_kernels",
    "set_cpu_threads",
]
