"""Realistic decode batches for the demo, the tests and the benchmarks.

q and keys are random normal values cast to FP8 (keys through pack_k_cache, so per-token scales
are real), weights are random, and every row's pages are a random permutation of the pool, as a
paged cache looks after many allocations and frees.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .decode import output_shape
from .contract import HEAD_DIM, NUM_HEADS, PAGE_FP8_BYTES, PAGE_TOKENS
from .kv_cache import pack_k_cache


# Block-table width serving engines allocate for the model's longest context (163840 tokens): the
# benchmarks' and the fuzz script's wide tables.
MODEL_TABLE_PAGES = 163840 // PAGE_TOKENS


@dataclass
class Batch:
    q: np.ndarray            # [B, H, 128] uint8 (fp8 bytes), or [B, N, H, 128] with queries per row
    k_cache: np.ndarray      # [num_pages, 64, 1, 132] int8
    weights: np.ndarray      # [B, H] float32, or [B, N, H]
    seq_lens: np.ndarray     # [B] int32 (with N queries: the row's length), or [B, N]
    block_table: np.ndarray  # [B, max_pages] int32

    def args(self):
        return self.q, self.k_cache, self.weights, self.seq_lens, self.block_table

    def to_torch(self, device="cpu"):
        """The same batch as torch tensors (q as float8_e4m3fn) on `device`."""
        import torch

        return (
            torch.from_numpy(self.q).view(torch.float8_e4m3fn).to(device),
            torch.from_numpy(self.k_cache).to(device),
            torch.from_numpy(self.weights).to(device),
            torch.from_numpy(self.seq_lens).to(device),
            torch.from_numpy(self.block_table).to(device),
        )

    @property
    def tokens(self) -> int:
        """Context tokens of the batch's rows (a row's N queries share its tokens)."""
        return context_tokens(self.seq_lens)

    def output_shape(self, topk: int) -> tuple[int, ...]:
        """[B, K], or [B, N, K] for a rank-4 q (ffi_dsa.decode.output_shape)."""
        return output_shape(self.q.shape, topk)


def page_layout(seq_lens, spare_pages: int = 0, max_pages: int | None = None) -> tuple[np.ndarray, int, int]:
    """(pages per row, block-table width, pool size) of a batch with these lengths: the width is the
    longest row's page count unless given, the pool every row's pages plus `spare_pages`."""
    pages_per_row = (np.clip(np.asarray(seq_lens, dtype=np.int64), 0, None) + PAGE_TOKENS - 1) // PAGE_TOKENS
    max_pages = int(max(1, pages_per_row.max(initial=0))) if max_pages is None else int(max_pages)
    num_pages = max(1, int(pages_per_row.sum()) + spare_pages)
    return pages_per_row, max_pages, num_pages


def context_tokens(seq_lens) -> int:
    """Context tokens of a batch with these lengths ([B], or [B, N]: a row's queries share its tokens)."""
    lens = np.clip(np.asarray(seq_lens), 0, None)
    return int((lens.max(axis=1) if lens.ndim == 2 else lens).sum())


def batch_layout(seq_lens, queries: int | None, spare_pages: int, max_pages: int | None):
    """(seq_lens as int32, pages per row, block-table width, pool size, the dims before q's heads) of a
    batch with these lengths: ``[B]``, or ``[B, N]`` with ``queries=N`` (the row gets pages for its
    longest query)."""
    seq_lens = np.asarray(seq_lens, dtype=np.int32)
    if seq_lens.ndim == 2 and queries is None:
        raise ValueError("seq_lens [B, N] needs queries=N")
    row_lens = seq_lens.max(axis=1, initial=0) if seq_lens.ndim == 2 else seq_lens
    pages_per_row, max_pages, num_pages = page_layout(row_lens, spare_pages, max_pages)
    query_dims = (len(seq_lens),) if queries is None else (len(seq_lens), queries)
    return seq_lens, pages_per_row, max_pages, num_pages, query_dims


def make_batch(seq_lens, *, seed: int = 0, spare_pages: int = 0, max_pages: int | None = None,
               scale_range=(0.5, 1.5), queries: int | None = None, heads: int = NUM_HEADS) -> Batch:
    """A batch with the given row lengths; pages are drawn without replacement from a shuffled pool.

    ``queries=N`` gives the multi-token form (docs/contract.md §7): q ``[B, N, H, 128]`` and weights
    ``[B, N, H]``. ``seq_lens`` ``[B]`` are the rows' lengths (causal offsets); ``[B, N]`` are the
    queries' own lengths (the row gets pages for the longest). ``heads`` is H (64 or 32).
    """
    rng = np.random.default_rng(seed)
    seq_lens, pages_per_row, max_pages, num_pages, query_dims = batch_layout(seq_lens, queries, spare_pages, max_pages)

    keys = rng.standard_normal((num_pages, PAGE_TOKENS, HEAD_DIM), dtype=np.float32)
    k_cache = pack_k_cache(keys)
    if scale_range is not None:  # spread the per-token scales too, not only amax/448
        scales = k_cache.view(np.uint8).reshape(num_pages, -1)[:, PAGE_FP8_BYTES:].view("<f4")
        scales[:] = rng.uniform(*scale_range, size=scales.shape).astype(np.float32)

    q = rng.standard_normal((*query_dims, heads, HEAD_DIM), dtype=np.float32)
    q = q.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    weights = rng.standard_normal((*query_dims, heads), dtype=np.float32)

    block_table = rows_of_pool(pages_per_row, max_pages, rng.permutation(num_pages).astype(np.int32))
    return Batch(q, k_cache, weights, seq_lens, block_table)


def rows_of_pool(pages_per_row, max_pages: int, pool: np.ndarray) -> np.ndarray:
    """A block table ``[B, max_pages]`` giving each row its pages from `pool` in turn, -1 past them."""
    block_table = np.full((len(pages_per_row), max_pages), -1, dtype=np.int32)
    start = 0
    for b, pages in enumerate(pages_per_row):
        block_table[b, :pages] = pool[start:start + pages]
        start += pages
    return block_table
