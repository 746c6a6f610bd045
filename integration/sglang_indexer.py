"""SGLang: the NSA indexer's paged decode top-k as one ffi_dsa call.

SGLang's ``Indexer._get_topk_paged`` (python/sglang/srt/layers/attention/nsa/nsa_indexer.py) runs,
for decode, target-verify and draft-extend batches on CUDA:

    logits = deep_gemm.fp8_paged_mqa_logits(
        q_fp8.view(batch_size, -1, num_heads, 128),       # q_fp8 [num_tokens, H, 128] fp8
        kv_cache_fp8.view(num_pages, 64, 1, 132),          # get_index_k_with_scale_buffer: [num_pages, 8448] uint8
        weights.squeeze(2),                                # [num_tokens, H, 1] float32
        seqlens_32, block_tables, schedule_metadata,       # [batch_size] int32, [batch_size, max_pages] int32
        max_seq_len=block_tables.shape[1] * 64, clean_logits=False)   # -> [num_tokens, max_seq_len] float32
    topk_result = metadata.topk_transform(logits, index_topk)

and the NSA backend's ``topk_transform`` (the fused, paged method: ``fast_topk_transform_fused``)
returns ``[num_tokens, index_topk]`` int32: for each query token the ``page_table_1`` entries of its
best tokens, ``-1`` padded, where ``page_table_1[b, t] = block_tables[b, t // 64] * 64 + t % 64`` is
the token's slot in the KV pool. Those are ffi_dsa's ids (``page * 64 + slot``), so
``topk_paged(q_fp8, kv_cache_fp8, weights, seqlens_32, block_tables, index_topk)`` replaces both
calls and the ``[num_tokens, max_seq_len]`` float32 logits between them; ``schedule_metadata`` is not
needed. docs/serving.md has the mapping and what SGLang keeps.

Several query tokens per request: ``num_tokens = batch_size * next_n`` rows of q, query j of
request b being row ``b * next_n + j``; ``seqlens_32`` ``[batch_size]`` is each request's length
(query j sees its first ``len - next_n + 1 + j`` tokens, DeepGEMM's rule) or ``[batch_size, next_n]``
each query's own. SGLang's target-verify today repeats the page table once per draft token
(``block_tables`` ``[num_tokens, max_pages]`` with ``seqlens_32`` expanded, next_n = 1): that works
as it is, but passing the table once per request reads every page once for all its queries.
"""

from __future__ import annotations

import torch

from engine_args import checked_k, head_weights, paged_cache, renamed
from ffi_dsa.contract import DEFAULT_TOPK
from ffi_dsa.torch_ops import topk_indexer_out

ENGINE_NAMES = ("q_fp8", "kv_cache_fp8", "weights", "seqlens_32", "block_tables", "out")


def topk_paged(q_fp8: torch.Tensor, kv_cache_fp8: torch.Tensor, weights: torch.Tensor, seqlens_32: torch.Tensor,
               block_tables: torch.Tensor, index_topk: int = DEFAULT_TOPK, out: torch.Tensor | None = None
               ) -> torch.Tensor:
    """What ``fp8_paged_mqa_logits`` + ``topk_transform`` (paged) return, from their own tensors:
    int32 ``[num_tokens, index_topk]`` of KV-pool slots (``page * 64 + slot``), ``-1`` padded, in
    ascending token order. ``out``: a preallocated ``[num_tokens, index_topk]`` int32 (a CUDA-graph
    buffer), written whole and returned. No host sync, no copy: capturable in SGLang's CUDA graphs
    and traceable by torch.compile. Bad arguments raise ValueError/TypeError naming SGLang's tensor."""
    index_topk = checked_k(index_topk, "index_topk")
    batch = block_tables.shape[0] if block_tables.dim() >= 1 else 0
    tokens = q_fp8.shape[0] if q_fp8.dim() == 3 else -1
    if q_fp8.dim() != 3:
        raise ValueError(f"q_fp8 must be [num_tokens, H, 128], got {list(q_fp8.shape)}")
    if batch == 0 and tokens != 0 or batch and tokens % batch:
        raise ValueError(f"q_fp8 has {tokens} tokens, which is not a whole number of query tokens for each of "
                         f"block_tables' {batch} requests")
    next_n = tokens // batch if batch else 1
    q = q_fp8 if next_n == 1 else q_fp8.view(batch, next_n, *q_fp8.shape[1:])
    if out is None:
        out = torch.empty((tokens, index_topk), dtype=torch.int32, device=q_fp8.device)
    elif tuple(out.shape) != (tokens, index_topk):
        raise ValueError(f"out must be [num_tokens, index_topk] = [{tokens}, {index_topk}], got {list(out.shape)}")
    try:
        topk_indexer_out(q, paged_cache(kv_cache_fp8, "kv_cache_fp8"), head_weights(weights, tokens, "weights"),
                         seqlens_32, block_tables, out, False)
    except (TypeError, ValueError) as err:
        raise renamed(err, ENGINE_NAMES) from None
    return out


__all__ = ["topk_paged"]
