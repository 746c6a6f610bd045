"""ffi_dsa: the DeepSeek sparse-attention (DSA) indexer top-k as TVM-FFI DPS ops.

Decode: for each row b, score every cached token t with 64 (or 32) FP8 index heads,

    score[t] = sum_h weights[b, h] * relu(sum_d q[b, h, d] * k[t, d] * scale[t])

and return the ids of the K best tokens, -1 padded: their global slots (page * 64 + slot) or, with
ids="positions", their positions in the row (N query tokens per row, q [B, N, H, 128], each get
their own top-K). Prefill: the same over a chunk of query rows and a
contiguous key buffer (ragged, causal). The contract (layouts, ties, NaN, bad input, precision,
entry points) is docs/contract.md of the repository; an installed package carries it as
ffi_dsa/docs/contract.md.

Importing the package loads nothing native: each name below loads its module on first use (the
native module, through tvm_ffi, which imports torch when it is installed). The framework entry
points are modules of their own: ``import ffi_dsa.torch_ops`` registers ``torch.ops.dsa.*``, which
``import ffi_dsa`` does itself when torch is already imported (registering loads nothing native
either); the allocating entry points take JAX arrays to ``ffi_dsa.jax_ops`` (XLA FFI calls, under
``jax.jit`` too); ``ffi_dsa.tvm_relax`` holds the TVM globals.
"""

from __future__ import annotations

import sys as _sys
from importlib import import_module as _import_module
from typing import TYPE_CHECKING

from ._build import NativeBuildError

# The public API, by the module that defines it.
_API_MODULES = {
    "decode": ("call", "topk_indexer", "validate_pages"),
    "prefill": ("prefill_call", "prefill_topk_indexer", "validate_prefill"),
    "mxfp4": ("mxfp4_call", "mxfp4_topk_indexer"),
    "cpu_options": ("cpu_kernel", "cpu_kernels", "set_cpu_kernel", "set_cpu_threads"),
    "kv_cache": ("pack_k_cache", "unpack_k_cache"),
    "mxfp4_cache": ("pack_mxfp4_k_cache", "unpack_mxfp4_k_cache", "quantize_mxfp4_q"),
    "decode_reference": ("check_topk", "reference", "reference_scores"),
    "prefill_reference": ("check_prefill_topk", "reference_prefill", "reference_prefill_scores"),
    "mxfp4_reference": ("check_mxfp4_topk", "reference_mxfp4", "reference_mxfp4_scores"),
}
_API = {name: module for module, names in _API_MODULES.items() for name in names}
# Names an earlier main had, and what took their place (CHANGELOG.md).
_RENAMED = {"prefill_topk": "ffi_dsa.prefill_topk_indexer, which allocates and returns the output (the DPS form "
                            "is ffi_dsa.prefill_call)"}

if TYPE_CHECKING:  # what type checkers and import graphs see; at run time __getattr__ loads these
    from .cpu_options import cpu_kernel, cpu_kernels, set_cpu_kernel, set_cpu_threads
    from .decode import call, topk_indexer, validate_pages
    from .kv_cache import pack_k_cache, unpack_k_cache
    from .mxfp4 import mxfp4_call, mxfp4_topk_indexer
    from .mxfp4_cache import pack_mxfp4_k_cache, quantize_mxfp4_q, unpack_mxfp4_k_cache
    from .mxfp4_reference import check_mxfp4_topk, reference_mxfp4, reference_mxfp4_scores
    from .prefill import prefill_call, prefill_topk_indexer, validate_prefill
    from .decode_reference import check_topk, reference, reference_scores
    from .prefill_reference import check_prefill_topk, reference_prefill, reference_prefill_scores


def __getattr__(name: str):
    """A public name, loaded with its module on first use (PEP 562)."""
    if name not in _API:
        if name in _RENAMED:
            raise AttributeError(f"ffi_dsa.{name} was renamed: use {_RENAMED[name]} (CHANGELOG.md)")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_import_module(f".{_API[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})


__version__ = "0.1.0"
__all__ = ["NativeBuildError", *_API]

# A program that imported torch expects torch.ops.dsa.* after `import ffi_dsa`, as with other torch
# extension libraries; one that did not pays nothing for torch here (`import ffi_dsa.torch_ops`
# registers them later, in any order).
if "torch" in _sys.modules:
    _import_module(".torch_ops", __name__)
