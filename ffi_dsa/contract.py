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

# Each op's `ids` values, the default first (contract.h: kDecodeIds, kPrefillIds).
_IDS = {str(op): tuple(str(name) for name in names) for op, names in cpu().contract_ids().items()}
DECODE_IDS: tuple[str, ...] = _IDS["topk_indexer"]           # ("slots", "positions")
PREFILL_IDS: tuple[str, ...] = _IDS["prefill_topk_indexer"]  # ("relative", "absolute")

__all__ = ["NUM_HEADS", "NUM_HEADS_NARROW", "SUPPORTED_HEADS", "MAX_QUERIES", "HEAD_DIM", "PAGE_TOKENS", "TOKEN_BYTES", "PAGE_FP8_BYTES", "PAGE_BYTES", "MAX_TOPK",
           "DEFAULT_TOPK", "DECODE_IDS", "PREFILL_IDS"]
