"""The obvious vectorized PyTorch version of the op: the baseline every benchmark prints.

gather the row's pages, dequantize FP8 x scale to float32, one batched matmul against q,
relu, weighted head sum, mask the padding, torch.topk. Scores stay float32 (a bf16 version
picks wrong tokens on half the rows). The output follows the contract (global ids, -1 tail) but
orders by score, as torch.topk does, and breaks ties however torch.topk does.
"""

from __future__ import annotations

import torch

from ffi_dsa.contract import DEFAULT_TOPK, HEAD_DIM, PAGE_FP8_BYTES, PAGE_TOKENS
from ffi_dsa.decode_reference import visible_lengths


def naive_topk_indexer(q, k_cache, weights, seq_lens, block_table, topk: int = DEFAULT_TOPK):
    if q.dim() == 4:  # N queries per row: one row per query, each with the row's pages and its own length
        batch, queries = q.shape[:2]
        lens = torch.from_numpy(visible_lengths(seq_lens.cpu().numpy(), queries, block_table.shape[1]))
        return naive_topk_indexer(q.reshape(batch * queries, *q.shape[2:]), k_cache,
                                  weights.reshape(batch * queries, -1), lens.to(q.device),
                                  block_table.repeat_interleave(queries, 0), topk)
    batch, max_pages = block_table.shape
    num_pages = k_cache.shape[0]
    pages = k_cache.view(torch.uint8).reshape(num_pages, -1)
    fp8 = pages[:, : PAGE_FP8_BYTES].view(torch.float8_e4m3fn).reshape(num_pages, PAGE_TOKENS, HEAD_DIM)
    scale = pages[:, PAGE_FP8_BYTES :].contiguous().view(torch.float32)          # [P, 64]
    table = block_table.long().clamp(0, max(num_pages - 1, 0))
    keys = fp8[table].float() * scale[table][..., None]                                  # [B, M, 64, 128]
    keys = keys.reshape(batch, max_pages * PAGE_TOKENS, HEAD_DIM)
    logits = torch.bmm(q.float(), keys.transpose(1, 2))                                  # [B, 64, n]
    scores = (torch.relu(logits) * weights[..., None]).sum(dim=1)                        # [B, n]
    positions = torch.arange(max_pages * PAGE_TOKENS, device=q.device)
    valid = (positions[None] < seq_lens[:, None]) & (block_table.repeat_interleave(PAGE_TOKENS, 1) >= 0)
    valid &= block_table.repeat_interleave(PAGE_TOKENS, 1) < num_pages
    scores = scores.masked_fill(~valid, float("-inf"))
    k = min(topk, scores.shape[1])
    best_scores, best = scores.topk(k, dim=1)
    ids = table.gather(1, best // PAGE_TOKENS) * PAGE_TOKENS + best % PAGE_TOKENS
    ids = torch.where(torch.isfinite(best_scores) | (best_scores > 0), ids, -1).int()
    out = torch.full((batch, topk), -1, dtype=torch.int32, device=q.device)
    out[:, :k] = ids
    return out
