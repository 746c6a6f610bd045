"""The operator's layout constants, read from the C++ contract (cuda/include/ffi_dsa/contract.h)
through the CPU module, so Python never writes them down a second time. docs/contract.md says what
they mean."""

from __future__ import annotations

from ._ffi_api import cpu

_CONSTANTS = {str(k): int(v) for k, v in cpu().contract_constants().items()}

NUM_HEADS: int = _CONSTANTS["num_heads"]            # H: index heads per query token (the reference op's)
NUM_HEADS_NARROW: int = _CONSTANTS["num_heads_narrow"]  # the other H the op accepts
SUPPORTED_HEADS: tuple[int, ...] = (NUM_HEADS_NARROW, NUM_HEADS)
MAX_QUERIES: int = _CONSTANTS["max_queries"]        # N: query tokens per row (MTP), 1..MAX_QUERIES
HEAD_DIM: int = _CONSTANTS["head_dim"]              # D: fp8 values per head and per key token
PAGE_TOKENS: int = _CONSTANTS["page_tokens"]        # tokens per cache page
TOKEN_BYTES: int = _CONSTANTS["token_bytes"]        # a token's share of a page: D fp8 bytes + a float32 scale
PAGE_FP8_BYTES: int = _CONSTANTS["page_fp8_bytes"]  # a page's fp8 rows come first ...
PAGE_BYTES: int = _CONSTANTS["page_bytes"]          # ... then its PAGE_TOKENS float32 scales
MAX_TOPK: int = _CONSTANTS["max_topk"]              # the largest K (output width) any path accepts
DEFAULT_TOPK: int = MAX_TOPK                        # the K of the reference op (DeepSeek's 2048)

# The MXFP4 page format (docs/contract.md §9): E2M1 values two a byte, a UE8M0 byte per block.
MXFP4_BLOCK: int = _CONSTANTS["mxfp4_block"]                # elements sharing one scale byte (32)
MXFP4_BLOCKS: int = _CONSTANTS["mxfp4_blocks"]              # scale bytes per head / per token (4)
MXFP4_HEAD_BYTES: int = _CONSTANTS["mxfp4_head_bytes"]      # a head's (a token's) value bytes (64)
MXFP4_TOKEN_BYTES: int = _CONSTANTS["mxfp4_token_bytes"]    # a token's share of a page (68)
MXFP4_PAGE_VALUE_BYTES: int = _CONSTANTS["mxfp4_page_value_bytes"]  # a page's value rows come first ...
MXFP4_PAGE_BYTES: int = _CONSTANTS["mxfp4_page_bytes"]      # ... then 64 tokens x 4 scale bytes
UE8M0_BIAS: int = _CONSTANTS["ue8m0_bias"]                  # byte b scales by 2 ** (b - UE8M0_BIAS) ...
UE8M0_NAN: int = _CONSTANTS["ue8m0_nan"]                    # ... except this byte, NaN
# E2M1's magnitudes by code 0..7 (a nibble's bits 2..0; bit 3 is the sign): 0, 0.5, 1, 1.5, 2, 3, 4, 6
E2M1_MAGNITUDES: tuple[float, ...] = tuple(float(v) for v in cpu().contract_e2m1_magnitudes())

# Each op's `ids` values, the default first (contract.h: kDecodeIds, kPrefillIds).
_IDS = {str(op): tuple(str(name) for name in names) for op, names in cpu().contract_ids().items()}
DECODE_IDS: tuple[str, ...] = _IDS["topk_indexer"]           # ("slots", "positions")
PREFILL_IDS: tuple[str, ...] = _IDS["prefill_topk_indexer"]  # ("relative", "absolute")
MXFP4_IDS: tuple[str, ...] = _IDS["mxfp4_topk_indexer"]      # decode's

__all__ = ["NUM_HEADS", "NUM_HEADS_NARROW", "SUPPORTED_HEADS", "MAX_QUERIES", "HEAD_DIM", "PAGE_TOKENS", "TOKEN_BYTES", "PAGE_FP8_BYTES", "PAGE_BYTES", "MAX_TOPK",
           "DEFAULT_TOPK", "DECODE_IDS", "PREFILL_IDS", "MXFP4_IDS", "MXFP4_BLOCK", "MXFP4_BLOCKS", "MXFP4_HEAD_BYTES",
           "MXFP4_TOKEN_BYTES", "MXFP4_PAGE_VALUE_BYTES", "MXFP4_PAGE_BYTES", "UE8M0_BIAS", "UE8M0_NAN",
           "E2M1_MAGNITUDES"]
