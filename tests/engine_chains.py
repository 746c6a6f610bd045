"""The chain a serving engine runs for the decode indexer, in plain torch, for the wiring tests.

DeepGEMM's ``fp8_paged_mqa_logits`` (scores of every token slot of a row's pages, ``[B * next_n,
max_len]``) followed by a per-row top-k and the engine's id convention:

* ``paged_mqa_logits``: the scores in float64 (as written in docs/contract.md §2, from the engine's
  tensors: q ``[B, next_n, H, 128]`` fp8, the packed ``[pages, 64, 1, 132]`` cache, weights
  ``[B * next_n, H]``, context lengths ``[B]`` (DeepGEMM's causal rule for the next_n queries) or
  ``[B, next_n]``), and each query row's visible length;
* ``topk_positions``: the top-k of each row under the contract's order (larger score first, the
  smaller position among equal scores, NaN below every number), returned in ascending position
  (ffi_dsa's default order; the engines' own top-k kernels leave the order unspecified);
* ``slots``: SGLang's convention (``page_table_1[b, t] = page * 64 + t % 64``); vLLM keeps positions.
"""

from __future__ import annotations

import torch

from ffi_dsa.contract import HEAD_DIM, PAGE_FP8_BYTES, PAGE_TOKENS

from conftest import page_bytes


def paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, max_len: int):
    """(float64 scores ``[B * next_n, max_len]``, visible lengths ``[B * next_n]``) on the CPU; the
    scores past a row's length are whatever the pages hold there (the top-k must not look)."""
    q, kv_cache, weights, context_lens, block_table = (t.cpu() for t in (q, kv_cache, weights, context_lens,
                                                                            block_table))
    batch, next_n, heads = q.shape[:3]
    raw = kv_cache.reshape(kv_cache.shape[0], -1).view(torch.uint8)
    keys = raw[:, :PAGE_FP8_BYTES].contiguous().view(torch.float8_e4m3fn).to(torch.float64)
    keys = keys.reshape(-1, PAGE_TOKENS, HEAD_DIM)
    scales = raw[:, PAGE_FP8_BYTES:].contiguous().view(torch.float32).to(torch.float64).reshape(-1, PAGE_TOKENS)
    # a table holds anything past a row's pages: gather from a valid page, the length masks it
    pages = block_table[:, : max_len // PAGE_TOKENS].long().clamp(0, keys.shape[0] - 1)
    k = keys[pages].reshape(batch, max_len, HEAD_DIM)
    s = scales[pages].reshape(batch, max_len)
    logits = torch.einsum("bjhd,btd->bjht", q.to(torch.float64), k) * s[:, None, None, :]
    relu = torch.where(logits < 0, torch.zeros_like(logits), logits)  # keeps NaN, as torch.relu does
    scores = torch.einsum("bjht,bjh->bjt", relu, weights.reshape(batch, next_n, heads).to(torch.float64))
    lens = context_lens.long()
    if lens.dim() == 1:
        lens = lens[:, None] - (next_n - 1 - torch.arange(next_n))[None, :]
    return scores.reshape(batch * next_n, max_len), lens.clamp(0, max_len).reshape(-1)


def topk_positions(scores, lengths, k: int):
    """int64 ``[rows, k]``: each row's best ``min(k, length)`` positions in ascending order, -1 after."""
    rows, width = scores.shape
    position = torch.arange(width)
    nan = torch.isnan(scores)
    outside = position[None, :] >= lengths[:, None]
    # stable sorts, least significant key first (the initial order is the position)
    order = torch.argsort(-torch.where(nan, float("-inf"), scores), dim=1, stable=True)
    for key in (nan, outside):
        order = torch.gather(order, 1, torch.argsort(torch.gather(key, 1, order).to(torch.int8), dim=1, stable=True))
    out = torch.full((rows, k), -1, dtype=torch.int64)
    for r in range(rows):
        n = min(k, int(lengths[r]))
        out[r, :n] = torch.sort(order[r, :n]).values
    return out


def slots(positions, block_table, next_n: int):
    """SGLang's ids of positions: ``block_table[row's request, t // 64] * 64 + t % 64``, -1 kept."""
    table = block_table.cpu().long().repeat_interleave(next_n, dim=0)
    t = positions.clamp(min=0)
    page = torch.gather(table, 1, t // PAGE_TOKENS)
    return torch.where(positions >= 0, page * PAGE_TOKENS + t % PAGE_TOKENS, -1).to(torch.int32)


def duplicate_neighbours(batch, seed: int, per_row: int = 48) -> None:
    """Random data with exact ties: copy some tokens' keys and scales onto their row's next token."""
    import numpy as np

    rng = np.random.default_rng(seed)
    pages = page_bytes(batch)
    lens = np.asarray(batch.seq_lens).reshape(len(batch.seq_lens), -1).max(axis=1)
    for b, n in enumerate(lens):
        for t in rng.integers(0, int(n) - 1, size=per_row) if n > 1 else ():
            (p, s), (pd, sd) = ((int(batch.block_table[b, x // PAGE_TOKENS]), x % PAGE_TOKENS) for x in (t, t + 1))
            pages[pd, sd * HEAD_DIM:(sd + 1) * HEAD_DIM] = pages[p, s * HEAD_DIM:(s + 1) * HEAD_DIM]
            pages[pd, PAGE_FP8_BYTES + 4 * sd:PAGE_FP8_BYTES + 4 * sd + 4] = \
                pages[p, PAGE_FP8_BYTES + 4 * s:PAGE_FP8_BYTES + 4 * s + 4]
