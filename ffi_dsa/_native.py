"""Typed stubs of the native modules' exports: what each function of cuda/csrc/cpu_binding.cc and
cuda/csrc/cuda_binding.cc takes and returns, so that a reader (or a type checker) can follow a call
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

_DECODE = "Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, bool, bool, int], None]"
_PREFILL = "Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, bool, bool], None]"
_MXFP4 = "Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, bool, bool, int], None]"
_CHECK_SHAPES = "Callable[[Array[Array[int]], Array[dtype]], None]"


class CpuFunctions(NamedTuple):
    """cuda/csrc/cpu_binding.cc: each op (docs/contract.md) as a DPS function, (inputs..., output,
    attributes), and its checks on the shapes and dtypes of those arguments alone (for JAX's trace
    time); then the module's own functions."""

    # decode: (q, k_cache, weights, seq_lens, block_table, topk_indices, sorted, positions, max_seq_len)
    topk_indexer: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, bool, bool, int], None]
    topk_indexer_check_shapes: Callable[[Sequence[Sequence[int]], Sequence[DType]], None]
    # prefill: (q, k, k_scale, weights, ks, ke, topk_indices, sorted, absolute_ids)
    prefill_topk_indexer: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, bool, bool], None]
    prefill_topk_indexer_check_shapes: Callable[[Sequence[Sequence[int]], Sequence[DType]], None]
    # decode over MXFP4 pages: (q, q_scale, k_cache, weights, seq_lens, block_table, topk_indices, sorted,
    # positions, max_seq_len); no CUDA export yet (ffi_dsa/mxfp4.py refuses CUDA tensors)
    mxfp4_topk_indexer: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, bool, bool, int], None]
    mxfp4_topk_indexer_check_shapes: Callable[[Sequence[Sequence[int]], Sequence[DType]], None]
    contract_constants: Callable[[], Mapping[str, int]]
    # op -> its `ids` values, the default first
    contract_ids: Callable[[], Mapping[str, Sequence[str]]]
    # E2M1's magnitudes by code 0..7 (mxfp4_e2m1.h)
    contract_e2m1_magnitudes: Callable[[], Sequence[float]]
    # the CUDA archs the sources hold kernels for ("sm_90a"), and (arch, query rows B * N,
    # max_pages) -> bytes of scratch a CUDA decode call takes there (cuda_archs.h)
    cuda_archs: Callable[[], Sequence[str]]
    workspace_bytes: Callable[[str, int, int], int]
    set_cpu_kernel: Callable[[str], str]
    cpu_kernel: Callable[[], str]
    cpu_kernels: Callable[[], Sequence[str]]
    set_cpu_threads: Callable[[int], None]


class CudaFunctions(NamedTuple):
    """cuda/csrc/cuda_binding.cc (the ops, arch-neutral) and cuda/csrc/sm_90a/options.cc."""

    topk_indexer: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, bool, bool, int], None]
    prefill_topk_indexer: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, bool, bool], None]
    # (fused, pdl, max_select_cluster, select_floor, stamp_select, select_threads), -1 = unchanged
    # -> the previous settings (launch/tuning.h)
    set_cuda_options: Callable[[int, int, int, int, int, int], Mapping[str, int]]
    cuda_options: Callable[[], Mapping[str, int]]
    # (device, slots, clear) -> the select stamps' words (impls/sm90_select_stamps.cuh)
    select_stamps: Callable[[int, int, bool], Sequence[int]]
    # (device, ctas, clear) -> the scoring kernel's stamps' words (impls/sm90_score_stamps.cuh)
    score_stamps: Callable[[int, int, bool], Sequence[int]]


SCHEMAS = {
    CpuFunctions: {
        "topk_indexer": _DECODE,
        "topk_indexer_check_shapes": _CHECK_SHAPES,
        "prefill_topk_indexer": _PREFILL,
        "prefill_topk_indexer_check_shapes": _CHECK_SHAPES,
        "mxfp4_topk_indexer": _MXFP4,
        "mxfp4_topk_indexer_check_shapes": _CHECK_SHAPES,
        "contract_constants": "Callable[[], Map[str, int]]",
        "contract_ids": "Callable[[], Map[str, Array[str]]]",
        "contract_e2m1_magnitudes": "Callable[[], Array[float]]",
        "cuda_archs": "Callable[[], Array[str]]",
        "workspace_bytes": "Callable[[str, int, int], int]",
        "set_cpu_kernel": "Callable[[str], str]",
        "cpu_kernel": "Callable[[], str]",
        "cpu_kernels": "Callable[[], Array[str]]",
        "set_cpu_threads": "Callable[[int], None]",
    },
    CudaFunctions: {
        "topk_indexer": _DECODE,
        "prefill_topk_indexer": _PREFILL,
        "set_cuda_options": "Callable[[int, int, int, int, int, int], Map[str, int]]",
        "cuda_options": "Callable[[], Map[str, int]]",
        "select_stamps": "Callable[[int, int, bool], Array[int]]",
        "score_stamps": "Callable[[int, int, bool], Array[int]]",
    },
}


def bind(module, table: type[NamedTuple]):
    """`table` with each field the module's function of that name, looked up once."""
    return table(*(module[name] for name in table._fields))
