"""MXFP4 decode batches for the tests and the benchmarks (docs/contract.md §9), laid out as
workloads.py's FP8 batches are: random normal keys and queries quantized to MXFP4 (a UE8M0 scale
per 32 values, as DeepSeek-V4's writer makes them), random weights, each row's pages a random
permutation of the pool."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .contract import HEAD_DIM, NUM_HEADS, PAGE_TOKENS
from .decode import output_shape
from .mxfp4_cache import pack_mxfp4_k_cache, quantize_mxfp4_q
from .workloads import batch_layout, context_tokens, rows_of_pool


@dataclass
class Mxfp4Batch:
    q: np.ndarray            # [B, H, 64] uint8 (E2M1 pairs), or [B, N, H, 64]
    q_scale: np.ndarray      # [B, H] int32 (four UE8M0 bytes), or [B, N, H]
    k_cache: np.ndarray      # [num_pages, 64, 1, 68] uint8
    weights: np.ndarray      # [B, H] float32, or [B, N, H]
    seq_lens: np.ndarray     # [B] int32, or [B, N]
    block_table: np.ndarray  # [B, max_pages] int32

    def args(self):
        return self.q, self.q_scale, self.k_cache, self.weights, self.seq_lens, self.block_table

    def to_torch(self, device="cpu"):
        import torch

        return tuple(torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in self.args())

    def output_shape(self, topk: int) -> tuple[int, ...]:
        return output_shape(self.q.shape, topk)

    @property
    def tokens(self) -> int:
        return context_tokens(self.seq_lens)


def make_mxfp4_batch(seq_lens, *, seed: int = 0, spare_pages: int = 0, max_pages: int | None = None,
                     queries: int | None = None, heads: int = NUM_HEADS) -> Mxfp4Batch:
    """A batch with the given row lengths (``[B]``, or ``[B, N]`` with ``queries=N``), as
    ffi_dsa.workloads.make_batch makes FP8 ones."""
    rng = np.random.default_rng(seed)
    seq_lens, pages_per_row, max_pages, num_pages, query_dims = batch_layout(seq_lens, queries, spare_pages, max_pages)
    k_cache = pack_mxfp4_k_cache(rng.standard_normal((num_pages, PAGE_TOKENS, HEAD_DIM), dtype=np.float32))
    q, q_scale = quantize_mxfp4_q(rng.standard_normal((*query_dims, heads, HEAD_DIM), dtype=np.float32))
    weights = rng.standard_normal((*query_dims, heads), dtype=np.float32)
    block_table = rows_of_pool(pages_per_row, max_pages, rng.permutation(num_pages).astype(np.int32))
    return Mxfp4Batch(q, q_scale, k_cache, weights, seq_lens, block_table)


__all__ = ["Mxfp4Batch", "make_mxfp4_batch"]
