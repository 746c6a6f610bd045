"""What the serving-engine wirings (sglang_indexer.py, vllm_indexer.py) share: an engine's tensors
viewed as the op's arguments, and the op's argument errors told in the engine's names.

Every view here is free (no copy, no kernel, no host sync), so a wiring stays capturable in the
engine's CUDA graphs; anything that would need a copy is refused with a ValueError naming the
engine's argument instead.
"""

from __future__ import annotations

import re

import torch

import ffi_dsa.torch_ops  # noqa: F401  (registers torch.ops.dsa.*)
from ffi_dsa import decode
from ffi_dsa._op import checked_topk
from ffi_dsa.contract import PAGE_BYTES, PAGE_TOKENS, TOKEN_BYTES

# the op's own names, as its messages start (the parameter names of ffi_dsa.call)
OP_ARGS = decode.OP.params


def paged_cache(cache: torch.Tensor, name: str) -> torch.Tensor:
    """An engine's index-key cache as the op's ``[num_pages, 64, 1, 132]``: the DeepGEMM view itself,
    or the same bytes as ``[num_pages, 64 * 132]`` (SGLang's buffer) or ``[num_pages, 64, 132]``
    (vLLM's allocation)."""
    shape = tuple(cache.shape)
    accepted = {(PAGE_BYTES,), (PAGE_TOKENS, TOKEN_BYTES), (PAGE_TOKENS, 1, TOKEN_BYTES)}
    if cache.dim() < 2 or shape[1:] not in accepted:
        raise ValueError(f"{name} must be [num_pages, {PAGE_BYTES}], [num_pages, {PAGE_TOKENS}, {TOKEN_BYTES}] or "
                         f"[num_pages, {PAGE_TOKENS}, 1, {TOKEN_BYTES}] (pages of {PAGE_TOKENS} tokens, "
                         f"{TOKEN_BYTES} bytes each), got {list(shape)}")
    if not cache.is_contiguous():
        raise ValueError(f"{name} must be contiguous (a page is {PAGE_BYTES} consecutive bytes)")
    return cache.view(shape[0], PAGE_TOKENS, 1, TOKEN_BYTES)


def head_weights(weights: torch.Tensor, rows: int, name: str) -> torch.Tensor:
    """Per-query head weights ``[rows, H]`` from ``[>= rows, H]`` (an engine's buffer padded to its
    CUDA-graph size: the first `rows` are used) or ``[>= rows, H, 1]``."""
    if weights.dim() == 3 and weights.shape[2] == 1:
        weights = weights.squeeze(2)
    if weights.dim() != 2 or weights.shape[0] < rows:
        raise ValueError(f"{name} must be [num_tokens, H] or [num_tokens, H, 1] with num_tokens >= {rows} "
                         f"(one row per query token), got {list(weights.shape)}")
    return weights[:rows]


def checked_k(k, name: str) -> int:
    """The output width K as an int in [0, MAX_TOPK], or the op's error naming the engine's `name`."""
    try:
        return checked_topk(k)
    except (TypeError, ValueError) as err:
        raise type(err)(str(err).replace("topk", name, 1)) from None


def renamed(err: Exception, engine_names: tuple[str, ...]) -> Exception:
    """`err` from the op, its leading argument name replaced by the engine's name for it
    (``engine_names`` in the order of ``OP_ARGS``); other errors unchanged."""
    text = str(err)
    for ours, theirs in zip(OP_ARGS, engine_names):
        match = re.match(rf"{ours}\b(?: \([a-z0-9_]+\))?", text)
        if match:
            return type(err)(f"{theirs} (ffi_dsa's {ours}){text[match.end():]}")
    return err


__all__ = ["paged_cache", "head_weights", "checked_k", "renamed", "OP_ARGS"]
