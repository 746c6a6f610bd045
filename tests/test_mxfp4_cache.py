"""The MXFP4 packer and unpacker (ffi_dsa.pack_mxfp4_k_cache, unpack_mxfp4_k_cache,
quantize_mxfp4_q) against docs/contract.md §9's layout, byte by byte, and the quantizer's rules:
a UE8M0 scale per 32 values of 2^ceil(log2(amax / 6)) clamped to bytes [1, 254], values rounded to
the nearest E2M1 value with ties to the even code, signs kept (-0)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ffi_dsa
from ffi_dsa.contract import MXFP4_PAGE_BYTES, MXFP4_PAGE_VALUE_BYTES, MXFP4_TOKEN_BYTES, PAGE_TOKENS
from ffi_dsa.mxfp4_cache import dequantize, e2m1_values, q_scale_bytes, quantize_mxfp4, ue8m0_values


def test_the_page_layout_byte_by_byte():
    """Token s's value j sits in byte 64 * s + j // 2 (low nibble for even j), its block c's scale
    byte at 4096 + 4 * s + c."""
    rng = np.random.default_rng(0)
    keys = rng.standard_normal((3, PAGE_TOKENS, 128)).astype(np.float32)
    pages = ffi_dsa.pack_mxfp4_k_cache(keys)
    assert pages.shape == (3, PAGE_TOKENS, 1, MXFP4_TOKEN_BYTES) and pages.dtype == np.uint8
    raw = pages.reshape(3, MXFP4_PAGE_BYTES)
    codes, scales = quantize_mxfp4(keys)
    for p, s, j in [(0, 0, 0), (0, 0, 1), (1, 17, 64), (2, 63, 127), (2, 40, 33)]:
        byte = raw[p, 64 * s + j // 2]
        assert (byte >> (4 * (j % 2))) & 0xF == codes[p, s, j]
        for c in range(4):
            assert raw[p, MXFP4_PAGE_VALUE_BYTES + 4 * s + c] == scales[p, s, c]
    back_codes, back_scales = ffi_dsa.unpack_mxfp4_k_cache(pages)
    np.testing.assert_array_equal(back_codes, codes)
    np.testing.assert_array_equal(back_scales, scales)
    torch_codes, _ = ffi_dsa.unpack_mxfp4_k_cache(torch.from_numpy(pages.view(np.int8)))  # int8, torch
    np.testing.assert_array_equal(torch_codes, codes)


def test_e2m1_values_are_representable_exactly():
    """Keys whose blocks are E2M1 values times a power of two pack losslessly."""
    rng = np.random.default_rng(1)
    values = e2m1_values(rng.integers(0, 16, size=(2, PAGE_TOKENS, 128)))
    values[..., ::32] = 6.0  # each block's largest magnitude is 6: scale byte 127
    exponents = rng.integers(-20, 20, size=(2, PAGE_TOKENS, 4))
    keys = (values.reshape(2, PAGE_TOKENS, 4, 32) * np.ldexp(1.0, exponents)[..., None]).reshape(values.shape)
    codes, scale_bytes = ffi_dsa.unpack_mxfp4_k_cache(ffi_dsa.pack_mxfp4_k_cache(keys))
    np.testing.assert_array_equal(scale_bytes, exponents + 127)
    np.testing.assert_array_equal(dequantize(codes, scale_bytes), np.where(keys == 0, 0.0, keys))


@pytest.mark.parametrize("x,code", [(0.25, 0), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6),
                                    (0.26, 1), (5.1, 7), (-0.1, 8), (-2.5, 12), (-5.0, 14)])
def test_rounding_is_to_nearest_ties_to_even(x, code):
    block = np.zeros(128, np.float32)
    block[0], block[1] = 6.0, x  # amax 6: scale byte 127 (1.0)
    codes, scale = quantize_mxfp4(block)
    assert scale[0] == 127 and codes[1] == code


def test_scale_bytes_are_clamped():
    block = np.zeros(128, np.float32)
    block[32:64] = 1e-45  # below 6 * 2^-126: byte 1
    block[64:96] = 3e38   # float32's range ends below 6 * 2^127: at most byte 253 (2^126)
    _, scale = quantize_mxfp4(block)
    assert scale.tolist() == [1, 1, 253, 1]  # an all-zero block gets the smallest byte too


def test_ue8m0_values():
    assert ue8m0_values([127, 128, 0, 254]).tolist() == [1.0, 2.0, 2.0**-127, 2.0**127]
    assert np.isnan(ue8m0_values(255))


def test_query_scales_are_little_endian_int32():
    """q_scale's byte c (from its low byte) scales block c of its head."""
    rng = np.random.default_rng(2)
    q = rng.standard_normal((3, 2, 64, 128)).astype(np.float32)
    q[..., 32:64] *= 1024.0  # block 1's byte is 10 above block 0's, or so
    packed, q_scale = ffi_dsa.quantize_mxfp4_q(q)
    assert packed.shape == (3, 2, 64, 64) and packed.dtype == np.uint8
    assert q_scale.shape == (3, 2, 64) and q_scale.dtype == np.int32
    _, expected = quantize_mxfp4(q)
    np.testing.assert_array_equal(q_scale_bytes(q_scale), expected)
    np.testing.assert_array_equal(q_scale & 0xFF, expected[..., 0])
    np.testing.assert_array_equal((q_scale >> 8) & 0xFF, expected[..., 1])
    assert ((q_scale_bytes(q_scale)[..., 1].astype(int) - q_scale_bytes(q_scale)[..., 0]) >= 8).mean() > 0.9


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match=r"pack_mxfp4_k_cache expects keys of shape \[num_pages, 64, 128\]"):
        ffi_dsa.pack_mxfp4_k_cache(np.zeros((2, 64, 64)))
    with pytest.raises(ValueError, match=r"quantize_mxfp4 expects values of shape \[\.\.\., 128\]"):
        ffi_dsa.quantize_mxfp4_q(np.zeros((2, 64, 100)))
