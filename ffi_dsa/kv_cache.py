"""Making real inputs: pack a float key cache into DeepGEMM's paged FP8 + scale layout."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .contract import HEAD_DIM, PAGE_BYTES, PAGE_FP8_BYTES, PAGE_TOKENS, TOKEN_BYTES

FP8_MAX = 448.0  # largest finite float8_e4m3fn


def pack_k_cache(k):
    """Float/bf16 keys ``[num_pages, 64, 128]`` -> packed int8 ``[num_pages, 64, 1, 132]``.

    Each token is scaled by ``amax / 448`` (its largest magnitude maps to the largest FP8 value),
    cast to float8_e4m3fn, and stored as DeepGEMM stores it: a page holds the 64 token rows of
    128 FP8 bytes first, then the 64 float32 scales. Works on numpy arrays and on torch tensors
    (the result stays on the tensor's device).
    """
    if type(k).__module__.startswith("torch"):
        return _pack_torch(k)
    k = np.asarray(k, dtype=np.float32)
    _check_shape(k.shape)
    num_pages = k.shape[0]
    amax = np.abs(k).max(axis=-1)
    scale = np.where(amax > 0, amax / FP8_MAX, 1.0).astype(np.float32)
    fp8 = (k / scale[..., None]).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    page = np.empty((num_pages, PAGE_BYTES), dtype=np.uint8)
    page[:, : PAGE_FP8_BYTES] = fp8.reshape(num_pages, -1)
    page[:, PAGE_FP8_BYTES :] = scale.astype("<f4").view(np.uint8).reshape(num_pages, -1)
    return page.view(np.int8).reshape(num_pages, PAGE_TOKENS, 1, TOKEN_BYTES)


def _pack_torch(k):
    import torch

    _check_shape(tuple(k.shape))
    k = k.float()
    num_pages = k.shape[0]
    amax = k.abs().amax(dim=-1)
    # tensor / tensor: torch divides by a Python scalar through its reciprocal on CUDA, which
    # can land one ulp away from numpy's quotient (seen on an H100)
    scale = torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax))
    fp8 = (k / scale[..., None]).to(torch.float8_e4m3fn).view(torch.uint8)
    page = torch.empty((num_pages, PAGE_BYTES), dtype=torch.uint8, device=k.device)
    page[:, : PAGE_FP8_BYTES] = fp8.reshape(num_pages, -1)
    page[:, PAGE_FP8_BYTES :] = scale.contiguous().view(torch.uint8).reshape(num_pages, -1)
    return page.view(torch.int8).reshape(num_pages, PAGE_TOKENS, 1, TOKEN_BYTES)


def _check_shape(shape) -> None:
    if len(shape) != 3 or shape[1] != PAGE_TOKENS or shape[2] != HEAD_DIM:
        raise ValueError(f"pack_k_cache expects keys of shape [num_pages, {PAGE_TOKENS}, {HEAD_DIM}], "
                         f"got {list(shape)}")


def unpack_k_cache(k_cache) -> tuple[np.ndarray, np.ndarray]:
    """Packed cache -> (fp8 values as float64 ``[num_pages, 64, 128]``, scales ``[num_pages, 64]``)."""
    from ._arrays import to_numpy

    raw = np.ascontiguousarray(to_numpy(k_cache)).view(np.uint8).reshape(-1, PAGE_BYTES)
    num_pages = raw.shape[0]
    fp8 = raw[:, : PAGE_FP8_BYTES].view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    scale = raw[:, PAGE_FP8_BYTES :].copy().view("<f4").astype(np.float64)
    return fp8.reshape(num_pages, PAGE_TOKENS, HEAD_DIM), scale.reshape(num_pages, PAGE_TOKENS)
