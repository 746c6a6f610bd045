"""The operator's layout constants and each op's ``ids`` names, read from the C++ contract
(cuda/include/ffi_dsa/contract.h, shipped with the package's sources) so Python never writes them
down a second time. The header is read as text, not asked of the compiled module: importing this
(and ffi_dsa.torch_ops, whose schemas need the defaults) then loads nothing native.
tests/test_package.py checks that the compiled CPU module says the same. docs/contract.md says what
they mean."""

from __future__ import annotations

import re

from ._build import native_dir


def _read_header() -> tuple[dict[str, int], dict[str, tuple[str, ...]]]:
    """contract.h's ``constexpr int kName = ...;`` values (a literal, or a product of names defined
    above it) and its ``constexpr const char* kNameIds[2] = {"...", "..."};`` lists, by C++ name."""
    text = (native_dir() / "include" / "ffi_dsa" / "contract.h").read_text()
    ints: dict[str, int] = {}
    for name, expression in re.findall(r"^constexpr int (k\w+) = ([^;]+);", text, flags=re.M):
        value = 1
        for factor in (f.strip() for f in expression.split("*")):
            value *= ints[factor] if factor in ints else int(factor)
        ints[name] = value
    names = {name: tuple(re.findall(r'"([^"]*)"', values))
             for name, values in re.findall(r"constexpr const char\* (k\w+Ids)\[\d+\] = \{([^}]*)\};", text)}
    return ints, names


_INTS, _NAMES = _read_header()

NUM_HEADS: int = _INTS["kNumHeads"]                     # H: index heads per query token (the reference op's)
NUM_HEADS_NARROW: int = _INTS["kNumHeadsNarrow"]        # the other H the op accepts
SUPPORTED_HEADS: tuple[int, ...] = (NUM_HEADS_NARROW, NUM_HEADS)
MAX_QUERIES: int = _INTS["kMaxQueries"]                 # N: query tokens per row (MTP), 1..MAX_QUERIES
HEAD_DIM: int = _INTS["kHeadDim"]                       # D: fp8 values per head and per key token
PAGE_TOKENS: int = _INTS["kPageTokens"]                 # tokens per cache page
TOKEN_BYTES: int = _INTS["kTokenBytes"]                 # a token's share of a page: D fp8 bytes + a float32 scale
PAGE_FP8_BYTES: int = _INTS["kPageFp8Bytes"]            # a page's fp8 rows come first ...
PAGE_BYTES: int = _INTS["kPageBytes"]                   # ... then its PAGE_TOKENS float32 scales
MAX_TOPK: int = _INTS["kMaxTopK"]                       # the largest K (output width) any path accepts
DEFAULT_TOPK: int = MAX_TOPK                            # the K of the reference op (DeepSeek's 2048)

# Each op's `ids` values, the default first (contract.h: kDecodeIds, kPrefillIds).
DECODE_IDS: tuple[str, ...] = _NAMES["kDecodeIds"]      # ("slots", "positions")
PREFILL_IDS: tuple[str, ...] = _NAMES["kPrefillIds"]    # ("relative", "absolute")

__all__ = ["NUM_HEADS", "NUM_HEADS_NARROW", "SUPPORTED_HEADS", "MAX_QUERIES", "HEAD_DIM", "PAGE_TOKENS", "TOKEN_BYTES",
           "PAGE_FP8_BYTES", "PAGE_BYTES", "MAX_TOPK", "DEFAULT_TOPK", "DECODE_IDS", "PREFILL_IDS"]
