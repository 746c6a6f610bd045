"""Making MXFP4 inputs (docs/contract.md §9), beside kv_cache.py's FP8 packing: quantize float
values to E2M1 with a UE8M0 scale per 32 (as DeepSeek-V4's and vLLM's writers do), pack keys into
68-byte-per-token pages, and unpack pages or queries back to their codes and scale bytes.

Each block of 32 values gets the scale ``2 ** ceil(log2(amax / 6))`` (6 is E2M1's largest value),
its byte clamped to [1, 254] as vLLM and DeepGEMM clamp it; each value is rounded to the nearest
E2M1 value of ``x / scale``, ties to the even code (``cvt.rn``), and its sign kept (a negative value
that rounds to 0 is -0, code 8).
"""

from __future__ import annotations

import numpy as np

from .contract import (E2M1_MAGNITUDES, HEAD_DIM, MXFP4_BLOCK, MXFP4_BLOCKS, MXFP4_HEAD_BYTES, MXFP4_PAGE_BYTES,
                       MXFP4_PAGE_VALUE_BYTES, MXFP4_TOKEN_BYTES, PAGE_TOKENS, UE8M0_BIAS, UE8M0_NAN)

E2M1_VALUES = np.array(E2M1_MAGNITUDES)  # by magnitude code 0..7
E2M1_MAX = float(E2M1_VALUES[-1])
_MIDPOINTS = (E2M1_VALUES[1:] + E2M1_VALUES[:-1]) / 2
_MIN_BYTE, _MAX_BYTE = 1, UE8M0_NAN - 1


def e2m1_values(codes) -> np.ndarray:
    """float64 values of E2M1 codes (uint8 0..15: sign bit 3, magnitude bits 2..0)."""
    codes = np.asarray(codes, dtype=np.uint8)
    magnitude = E2M1_VALUES[codes & 0x7]
    return np.where(codes & 0x8, -magnitude, magnitude)


def ue8m0_values(scale_bytes) -> np.ndarray:
    """float64 ``2 ** (byte - 127)`` of UE8M0 bytes, NaN for 255."""
    b = np.asarray(scale_bytes, dtype=np.int64)
    return np.where(b == UE8M0_NAN, np.nan, np.ldexp(1.0, b - UE8M0_BIAS))


def quantize_mxfp4(x) -> tuple[np.ndarray, np.ndarray]:
    """float values ``[..., 128]`` -> (E2M1 codes uint8 ``[..., 128]``, UE8M0 scale bytes uint8
    ``[..., 4]``), one scale per 32 values."""
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1:] != (HEAD_DIM,):
        raise ValueError(f"quantize_mxfp4 expects values of shape [..., {HEAD_DIM}], got {list(x.shape)}")
    blocks = x.reshape(*x.shape[:-1], MXFP4_BLOCKS, MXFP4_BLOCK)
    amax = np.abs(blocks).max(axis=-1).astype(np.float64)
    with np.errstate(divide="ignore"):
        exponent = np.ceil(np.log2(np.maximum(amax, 1e-300) / E2M1_MAX))
    scale_bytes = np.clip(exponent + UE8M0_BIAS, _MIN_BYTE, _MAX_BYTE).astype(np.uint8)
    scaled = np.abs(blocks) / ue8m0_values(scale_bytes)[..., None]
    code = np.searchsorted(_MIDPOINTS, scaled, side="left")  # a value on a midpoint gets the lower code ...
    on_midpoint = (code < len(_MIDPOINTS)) & (scaled == _MIDPOINTS[np.minimum(code, len(_MIDPOINTS) - 1)])
    code = np.where(on_midpoint & (code % 2 == 1), code + 1, code)  # ... unless the upper one is even
    codes = (code.astype(np.uint8) | np.where(np.signbit(blocks), 0x8, 0).astype(np.uint8)).reshape(x.shape)
    return codes, scale_bytes


def pack_nibbles(codes) -> np.ndarray:
    """E2M1 codes ``[..., 2n]`` -> bytes ``[..., n]``: element 2j in the low nibble of byte j."""
    codes = np.asarray(codes, dtype=np.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_nibbles(packed) -> np.ndarray:
    """bytes ``[..., n]`` -> E2M1 codes ``[..., 2n]`` (the inverse of pack_nibbles)."""
    packed = np.asarray(packed, dtype=np.uint8)
    codes = np.empty((*packed.shape[:-1], 2 * packed.shape[-1]), dtype=np.uint8)
    codes[..., 0::2], codes[..., 1::2] = packed & 0xF, packed >> 4
    return codes


def quantize_mxfp4_q(q) -> tuple[np.ndarray, np.ndarray]:
    """Float queries ``[..., H, 128]`` -> the op's (q uint8 ``[..., H, 64]``, q_scale int32 ``[..., H]``:
    the head's four scale bytes, little-endian)."""
    codes, scale_bytes = quantize_mxfp4(q)
    return pack_nibbles(codes), np.ascontiguousarray(scale_bytes).view("<i4")[..., 0].astype(np.int32)


def q_scale_bytes(q_scale) -> np.ndarray:
    """q_scale int32 ``[..., H]`` -> its scale bytes uint8 ``[..., H, 4]`` (byte c scales block c)."""
    from ._arrays import to_numpy

    s = to_numpy(q_scale).astype(np.int64) & 0xFFFFFFFF
    return np.stack([(s >> (8 * c)) & 0xFF for c in range(MXFP4_BLOCKS)], axis=-1).astype(np.uint8)


def pack_mxfp4_k_cache(k) -> np.ndarray:
    """Float keys ``[num_pages, 64, 128]`` -> MXFP4 pages uint8 ``[num_pages, 64, 1, 68]``: per page,
    the 64 tokens' 64 value bytes, then the 64 tokens' 4 scale bytes (token s, block c at
    ``4096 + 4 * s + c``), as vLLM's and SGLang's ``[pages, 64, 1, 68]`` pool holds them."""
    k = np.asarray(k, dtype=np.float32)
    if k.ndim != 3 or k.shape[1:] != (PAGE_TOKENS, HEAD_DIM):
        raise ValueError(f"pack_mxfp4_k_cache expects keys of shape [num_pages, {PAGE_TOKENS}, {HEAD_DIM}], "
                         f"got {list(k.shape)}")
    codes, scale_bytes = quantize_mxfp4(k)
    return pages_of(codes, scale_bytes)


def pages_of(codes, scale_bytes) -> np.ndarray:
    """E2M1 codes ``[num_pages, 64, 128]`` and scale bytes ``[num_pages, 64, 4]`` -> the pages."""
    num_pages = codes.shape[0]
    page = np.empty((num_pages, MXFP4_PAGE_BYTES), dtype=np.uint8)
    page[:, :MXFP4_PAGE_VALUE_BYTES] = pack_nibbles(codes).reshape(num_pages, -1)
    page[:, MXFP4_PAGE_VALUE_BYTES:] = np.asarray(scale_bytes, dtype=np.uint8).reshape(num_pages, -1)
    return page.reshape(num_pages, PAGE_TOKENS, 1, MXFP4_TOKEN_BYTES)


def unpack_mxfp4_k_cache(k_cache) -> tuple[np.ndarray, np.ndarray]:
    """MXFP4 pages (any array) -> (E2M1 codes uint8 ``[num_pages, 64, 128]``, scale bytes uint8
    ``[num_pages, 64, 4]``); ``e2m1_values`` and ``ue8m0_values`` give their numbers."""
    from ._arrays import to_numpy

    raw = np.ascontiguousarray(to_numpy(k_cache)).view(np.uint8).reshape(-1, MXFP4_PAGE_BYTES)
    num_pages = raw.shape[0]
    codes = unpack_nibbles(raw[:, :MXFP4_PAGE_VALUE_BYTES].reshape(num_pages, PAGE_TOKENS, MXFP4_HEAD_BYTES))
    return codes, raw[:, MXFP4_PAGE_VALUE_BYTES:].reshape(num_pages, PAGE_TOKENS, MXFP4_BLOCKS).copy()


def dequantize(codes, scale_bytes) -> np.ndarray:
    """float64 values ``[..., 128]`` of E2M1 codes ``[..., 128]`` and their scale bytes ``[..., 4]``
    (a NaN byte makes its whole block NaN)."""
    values = e2m1_values(codes).reshape(*np.shape(codes)[:-1], MXFP4_BLOCKS, MXFP4_BLOCK)
    return (values * ue8m0_values(scale_bytes)[..., None]).reshape(np.shape(codes))


__all__ = ["quantize_mxfp4", "quantize_mxfp4_q", "pack_mxfp4_k_cache", "unpack_mxfp4_k_cache", "pages_of",
           "pack_nibbles", "unpack_nibbles", "q_scale_bytes", "e2m1_values", "ue8m0_values", "dequantize"]
