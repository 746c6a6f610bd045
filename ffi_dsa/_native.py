"""Typed stubs of the native modules' exports: what each function of cuda/csrc/cpu_binding.cc and
cuda/csrc/cuda_binding.cu takes and returns, so that a reader (or a type checker) can follow a call
from ``ffi_dsa.call`` to the C++ it lands in. ``_ffi_api.cpu()`` / ``_ffi_api.cuda()`` return these
tables, bound to the loaded module once.

Every export also carries its type schema (tvm-ffi function metadata: the bindings define
TVM_FFI_DLL_EXPORT_INCLUDE_METADATA); ``SCHEMAS`` states it here and tests/test_native_stubs.py
checks each against the module, so a stub cannot drift from its binding.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Sequence

# tvm-ffi converts any DLPack tensor (torch, numpy, JAX, CuPy) at the call; the binding sees a TensorView.
Tensor = Any
DType = Any  # a tvm_ffi.dtype

_INDEXER = "Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, bool], None]"


class CpuFunctions(NamedTuple):
    """cuda/csrc/cpu_binding.cc."""

    # (q, k_cache, weights, seq_lens, block_table, topk_indices, sorted): docs/contract.md
    topk_indexer: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, bool], None]
    # validate.h's checks on (shape, dtype) pairs of the six arguments, for JAX's trace time
    check_shapes: Callable[..., None]
    contract_constants: Callable[[], Mapping[str, int]]
    set_cpu_kernel: Callable[[str], str]
    cpu_kernel: Callable[[], str]
    cpu_kernels: Callable[[], Sequence[str]]
    set_cpu_threads: Callable[[int], None]
    # (query rows B * N, max_pages) -> bytes of scratch a CUDA call may take (workspace_bytes.h)
    workspace_bytes: Callable[[int, int], int]
    # (q, k, k_scale, weights, ks, ke, topk_indices, sorted, absolute_ids): docs/contract.md §8
    prefill_topk_indexer: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, bool, bool], None]
    # validate_prefill.h's checks on (shape, dtype) pairs of the seven arguments, for JAX's trace time
    prefill_check_shapes: Callable[..., None]


class CudaFunctions(NamedTuple):
    """cuda/csrc/cuda_binding.cu."""

    topk_indexer: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, bool], None]
    # (q, k, k_scale, weights, ks, ke, topk_indices, sorted, absolute_ids): the CPU export's form
    prefill_topk_indexer: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, bool, bool], None]
    # (fused, pdl, max_select_cluster), -1 = unchanged -> the previous settings (launch/tuning.h)
    set_cuda_options: Callable[[int, int, int], Mapping[str, int]]
    cuda_options: Callable[[], Mapping[str, int]]


SCHEMAS = {
    CpuFunctions: {
        "topk_indexer": _INDEXER,
        "check_shapes": "Callable[[" + ", ".join(["Array[int], dtype"] * 6) + "], None]",
        "contract_constants": "Callable[[], Map[str, int]]",
        "set_cpu_kernel": "Callable[[str], str]",
        "cpu_kernel": "Callable[[], str]",
        "cpu_kernels": "Callable[[], Array[str]]",
        "set_cpu_threads": "Callable[[int], None]",
        "workspace_bytes": "Callable[[int, int], int]",
        "prefill_topk_indexer": "Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, bool, bool], None]",
        "prefill_check_shapes": "Callable[[" + ", ".join(["Array[int], dtype"] * 7) + "], None]",
    },
    CudaFunctions: {
        "topk_indexer": _INDEXER,
        "prefill_topk_indexer": "Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, bool, bool], None]",
        "set_cuda_options": "Callable[[int, int, int], Map[str, int]]",
        "cuda_options": "Callable[[], Map[str, int]]",
    },
}


def bind(module, table: type[NamedTuple]):
    """`table` with each field the module's function of that name, looked up once."""
    return table(*(module[name] for name in table._fields))
