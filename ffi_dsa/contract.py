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
    """contract.h's ``constexpr int kName = ...;`` values (literals and names defined above it under
    ``+``, ``-``, ``*`` and C++'s integer ``/``) and its ``constexpr const char* kNameIds[2] = {"...", "..."};`` lists, by C++ name."""
    text = (native_dir() / "include" / "ffi_dsa" / "contract.h").read_text()
    ints: dict[str, int] = {}
    for name, expression in re.findall(r"^constexpr int (k\w+) = ([^;]+);", text, flags=re.M):
        ints[name] = _integer_expression(expression, ints)
    names = {name: tuple(re.findall(r'"([^"]*)"', values))
             for name, values in re.findall(r"constexpr const char\* (k\w+Ids)\[\d+\] = \{([^}]*)\};", text)}
    return ints, names


def _integer_expression(expression: str, known: dict[str, int]) -> int:
    """A contract.h integer expression, C++ style, left to right within + - and within * /."""
    tokens = re.findall(r"k\w+|\d+|[-+*/]", expression)
    values = [known[t] if t.startswith("k") else int(t) for t in tokens[::2]]
    total, term = 0, values[0]
    for op, value in zip(tokens[1::2], values[1:]):
        if op in "*/":
            term = term * value if op == "*" else term // value
        else:
            total, term = total + term, value if op == "+" else -value
    return total + term


def _e2m1_magnitudes() -> tuple[float, ...]:
    """mxfp4_e2m1.h's kE2M1Magnitudes, E2M1's magnitudes by code 0..7."""
    text = (native_dir() / "include" / "ffi_dsa" / "mxfp4_e2m1.h").read_text()
    values = re.search(r"constexpr float kE2M1Magnitudes\[8\] = \{([^}]*)\};", text).group(1)
    return tuple(float(v.strip().rstrip("f")) for v in values.split(","))


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

# The MXFP4 page format (docs/contract.md §9): E2M1 values two a byte, a UE8M0 byte per block.
MXFP4_BLOCK: int = _INTS["kMxfp4Block"]                      # elements sharing one scale byte (32)
MXFP4_BLOCKS: int = _INTS["kMxfp4Blocks"]                    # scale bytes per head / per token (4)
MXFP4_HEAD_BYTES: int = _INTS["kMxfp4HeadBytes"]             # a head's (a token's) value bytes (64)
MXFP4_TOKEN_BYTES: int = _INTS["kMxfp4TokenBytes"]           # a token's share of a page (68)
MXFP4_PAGE_VALUE_BYTES: int = _INTS["kMxfp4PageValueBytes"]  # a page's value rows come first ...
MXFP4_PAGE_BYTES: int = _INTS["kMxfp4PageBytes"]             # ... then 64 tokens x 4 scale bytes
UE8M0_BIAS: int = _INTS["kUe8m0Bias"]                        # byte b scales by 2 ** (b - UE8M0_BIAS) ...
UE8M0_NAN: int = _INTS["kUe8m0NaN"]                          # ... except this byte, NaN
# E2M1's magnitudes by code 0..7 (a nibble's bits 2..0; bit 3 is the sign): 0, 0.5, 1, 1.5, 2, 3, 4, 6
E2M1_MAGNITUDES: tuple[float, ...] = _e2m1_magnitudes()

# Each op's `ids` values, the default first (contract.h: kDecodeIds, kPrefillIds).
DECODE_IDS: tuple[str, ...] = _NAMES["kDecodeIds"]      # ("slots", "positions")
PREFILL_IDS: tuple[str, ...] = _NAMES["kPrefillIds"]    # ("relative", "absolute")
MXFP4_IDS: tuple[str, ...] = DECODE_IDS                 # decode's selection, so decode's ids (cpu_binding.cc)

__all__ = ["NUM_HEADS", "NUM_HEADS_NARROW", "SUPPORTED_HEADS", "MAX_QUERIES", "HEAD_DIM", "PAGE_TOKENS", "TOKEN_BYTES",
           "PAGE_FP8_BYTES", "PAGE_BYTES", "MAX_TOPK", "DEFAULT_TOPK", "DECODE_IDS", "PREFILL_IDS", "MXFP4_IDS",
           "MXFP4_BLOCK", "MXFP4_BLOCKS", "MXFP4_HEAD_BYTES", "MXFP4_TOKEN_BYTES", "MXFP4_PAGE_VALUE_BYTES",
           "MXFP4_PAGE_BYTES", "UE8M0_BIAS", "UE8M0_NAN", "E2M1_MAGNITUDES"]
