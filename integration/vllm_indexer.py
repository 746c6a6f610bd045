"""vLLM: the sparse-attention indexer's decode logits + top-k as one ffi_dsa call.

The decode branch of vLLM's ``sparse_attn_indexer`` (vllm/model_executor/layers/sparse_attn_indexer.py)
runs on CUDA:

    kv_cache = kv_cache_as_quant_view(kv_cache, head_dim, use_fp4_cache)   # [num_blocks, 64, 132] -> [.., 64, 1, 132]
    logits = fp8_fp4_paged_mqa_logits(
        (padded_q_quant_decode_tokens, None),       # [batch_size, next_n, H, 128] fp8
        kv_cache, weights[:num_padded_tokens],      # weights [num_tokens, H] float32
        seq_lens,                                   # decode_metadata.seq_lens[:batch_size]: [B, next_n] or [B, 1] int32
        decode_metadata.block_table,                # [B, max_blocks] int32
        decode_metadata.schedule_metadata,
        max_model_len=max_model_len, clean_logits=False)      # -> [B * next_n, max_model_len] float32
    topk_indices = topk_indices_buffer[:num_padded_tokens, :topk_tokens]
    torch.ops._C.persistent_topk(logits, seq_lens, topk_indices, workspace, topk_tokens,
                                 attn_metadata.max_seq_len)     # or cooperative_topk / top_k_per_row_decode

leaving in each of the ``B * next_n`` rows the positions (``0 .. len - 1``) of the row's best tokens,
``-1`` padded; the sparse-attention backend turns positions into KV slots later through the block
table. ``decode_topk`` takes the same tensors and writes the same rows with one call of the op with
``ids="positions"`` (the op's position ids for decode), without the ``[B * next_n, max_model_len]``
float32 logits and without ``schedule_metadata``. ``max_seq_len`` is the host int vLLM gives its
top-k (``attn_metadata.max_seq_len``, the batch's longest row): the op plans its select for it
instead of the block table's width, and a row longer than it (a stale bound in a replayed CUDA
graph) still gets its exact answer. docs/serving.md has the mapping and what vLLM keeps
(the ``requires_padding`` pack/unpack around this call; the logits path where decode context
parallelism merges the ranks' top-k by score).
"""

from __future__ import annotations

import torch

from engine_args import checked_k, head_weights, paged_cache, renamed
from ffi_dsa.contract import DEFAULT_TOPK
from ffi_dsa.torch_ops import topk_indexer_out

ENGINE_NAMES = ("padded_q_quant_decode_tokens", "kv_cache", "weights", "seq_lens", "block_table",
                "topk_indices_buffer")


def decode_topk(padded_q_quant_decode_tokens: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                seq_lens: torch.Tensor, block_table: torch.Tensor, topk_indices_buffer: torch.Tensor,
                topk_tokens: int = DEFAULT_TOPK, max_seq_len: int | None = None) -> torch.Tensor:
    """Write ``topk_indices_buffer[:B * next_n, :topk_tokens]`` as vLLM's decode top-k leaves it
    (positions in each row, ``-1`` padded; ascending position order) and return that view.
    ``max_seq_len``: ``attn_metadata.max_seq_len`` (None: unknown). No host sync, no copy, no
    allocation: capturable in vLLM's CUDA graphs. Bad arguments raise ValueError/TypeError naming
    vLLM's tensor (or ``max_seq_len``)."""
    topk_tokens = checked_k(topk_tokens, "topk_tokens")
    q = padded_q_quant_decode_tokens
    if q.dim() != 4:
        raise ValueError(f"padded_q_quant_decode_tokens must be [batch_size, next_n, H, 128], got {list(q.shape)}")
    batch, next_n = q.shape[0], q.shape[1]
    rows = batch * next_n
    if seq_lens.dim() == 2 and seq_lens.shape[1] == 1 and next_n > 1:
        seq_lens = seq_lens.view(-1)  # [B, 1] with next_n queries: the request's length (DeepGEMM's rule)
    buffer = topk_indices_buffer
    if buffer.dim() != 2 or buffer.shape[0] < rows or buffer.shape[1] < topk_tokens:
        raise ValueError(f"topk_indices_buffer must be [>= {rows}, >= {topk_tokens}] (a row per query token), "
                         f"got {list(buffer.shape)}")
    topk_indices = buffer[:rows, :topk_tokens]
    if not topk_indices.is_contiguous():
        raise ValueError(f"topk_indices_buffer[:{rows}, :{topk_tokens}] is not contiguous: the buffer must be "
                         f"{topk_tokens} wide, got {buffer.shape[1]}")
    try:
        topk_indexer_out(q, paged_cache(kv_cache, "kv_cache"), head_weights(weights, rows, "weights"),
                         seq_lens, block_table, topk_indices, False, "positions", max_seq_len)
    except (TypeError, ValueError) as err:
        raise renamed(err, ENGINE_NAMES) from None
    return topk_indices


__all__ = ["decode_topk"]
