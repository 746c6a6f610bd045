"""Decode batches generated with torch directly on the target device (GPU or CPU).

Same layout and distributions as ``ffi_dsa.workloads.make_batch`` (random normal keys packed to
FP8 with a per-token amax scale, then the scales respread U(0.5, 1.5); q random normal cast to
FP8; random weights; every row's pages drawn without replacement from a permuted pool), but not
the same random numbers. numpy's make_batch spends ~7 µs per token on the host (0.9 s for
16 x 8K tokens on the 2-core CPU machine), so a 128-row x 8K batch rotated over 256 MB of caches
would take tens of seconds; this one runs at device speed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ffi_dsa.decode import output_shape
from ffi_dsa.contract import HEAD_DIM, NUM_HEADS, PAGE_BYTES, PAGE_FP8_BYTES, PAGE_TOKENS, TOKEN_BYTES
from ffi_dsa.kv_cache import pack_k_cache
from ffi_dsa.workloads import page_layout


@dataclass
class TorchBatch:
    q: torch.Tensor            # [B, H, 128] float8_e4m3fn, or [B, N, H, 128]
    k_cache: torch.Tensor      # [num_pages, 64, 1, 132] int8
    weights: torch.Tensor      # [B, H] float32, or [B, N, H]
    seq_lens: torch.Tensor     # [B] int32
    block_table: torch.Tensor  # [B, max_pages] int32

    def args(self):
        return self.q, self.k_cache, self.weights, self.seq_lens, self.block_table

    def output_shape(self, topk: int) -> tuple[int, ...]:
        """[B, K], or [B, N, K] for a rank-4 q (ffi_dsa._arrays.output_shape)."""
        return output_shape(tuple(self.q.shape), topk)

    @property
    def tokens(self) -> int:
        return int(self.seq_lens.clamp(min=0).sum().item())

    def rows(self, start: int, stop: int) -> "TorchBatch":
        """Rows [start, stop) over the same (shared) cache."""
        return TorchBatch(self.q[start:stop], self.k_cache, self.weights[start:stop],
                          self.seq_lens[start:stop], self.block_table[start:stop])

    def compact(self, rows) -> tuple["TorchBatch", np.ndarray]:
        """A small copy holding only `rows` and the pages they use, for a cheap host-side check.

        Returns the batch and ``page_map`` (old page id -> new page id, -1 where unused), so the
        ids an op returned on the big batch translate with :func:`remap_ids`.
        """
        rows = torch.as_tensor(list(rows), dtype=torch.long, device=self.q.device)
        lens = self.seq_lens[rows].clamp(min=0)
        table = self.block_table[rows]
        num_pages = self.k_cache.shape[0]
        used_cols = (lens + PAGE_TOKENS - 1) // PAGE_TOKENS
        col = torch.arange(table.shape[1], device=table.device)
        in_use = (col[None] < used_cols[:, None]) & (table >= 0) & (table < num_pages)
        used = torch.unique(table[in_use])
        page_map = torch.full((num_pages,), -1, dtype=torch.int32, device=table.device)
        page_map[used] = torch.arange(used.numel(), dtype=torch.int32, device=table.device)
        new_table = torch.where(in_use, page_map[table.clamp(0, max(num_pages - 1, 0)).long()],
                                torch.full_like(table, -1))
        sub = TorchBatch(self.q[rows].contiguous(), self.k_cache[used].contiguous(),
                         self.weights[rows].contiguous(), self.seq_lens[rows].contiguous(),
                         new_table.contiguous())
        return sub, page_map.cpu().numpy()


def remap_ids(ids: np.ndarray, page_map: np.ndarray) -> np.ndarray:
    """Translate global token ids (page * 64 + slot) through `page_map`; -1 stays -1, ids on
    unmapped pages become -2 (so the check reports them as not belonging to the row)."""
    ids = np.asarray(ids, dtype=np.int64)
    out = np.full(ids.shape, -1, dtype=np.int64)
    valid = ids >= 0
    page = ids[valid] // PAGE_TOKENS
    inside = page < page_map.shape[0]
    new_page = np.full(page.shape, -1, dtype=np.int64)
    new_page[inside] = page_map[page[inside]]
    out[valid] = np.where(new_page >= 0, new_page * PAGE_TOKENS + ids[valid] % PAGE_TOKENS, -2)
    return out.astype(np.int32)


CHUNK_PAGES = 4096  # pages generated per step: bounds the float32 temporaries


def make_batch_torch(seq_lens, *, seed: int = 0, device="cuda", max_pages: int | None = None,
                     queries: int | None = None, heads: int = NUM_HEADS) -> TorchBatch:
    """A batch with the given row lengths, generated on `device` (see the module docstring); the
    block table is `max_pages` wide when given (else the longest row's pages), -1 past each row.
    ``queries=N`` gives q ``[B, N, H, 128]`` and weights ``[B, N, H]`` (seq_lens stay ``[B]``:
    causal offsets, docs/contract.md §7); ``heads`` is H."""
    device = torch.device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    lens = np.asarray(seq_lens, dtype=np.int64)
    pages_per_row, max_pages, num_pages = page_layout(lens, max_pages=max_pages)
    batch = len(lens)

    k_cache = torch.empty((num_pages, PAGE_TOKENS, 1, TOKEN_BYTES), dtype=torch.int8, device=device)
    flat = k_cache.view(torch.uint8).view(num_pages, PAGE_BYTES)
    for start in range(0, num_pages, CHUNK_PAGES):
        n = min(CHUNK_PAGES, num_pages - start)
        keys = torch.randn((n, PAGE_TOKENS, HEAD_DIM), generator=gen, device=device)
        flat[start:start + n] = pack_k_cache(keys).view(torch.uint8).view(n, PAGE_BYTES)
    scales = flat[:, PAGE_FP8_BYTES:].view(torch.float32)  # [num_pages, 64], a view
    scales.uniform_(0.5, 1.5, generator=gen)  # make_batch's default scale_range

    rows = (batch,) if queries is None else (batch, queries)
    q = torch.randn((*rows, heads, HEAD_DIM), generator=gen, device=device).to(torch.float8_e4m3fn)
    weights = torch.randn((*rows, heads), generator=gen, device=device)

    pool = torch.randperm(num_pages, generator=gen, device=device).to(torch.int32)
    starts = torch.as_tensor(np.concatenate([[0], np.cumsum(pages_per_row)[:-1]]) if batch else
                             np.zeros(0, np.int64), device=device)
    counts = torch.as_tensor(pages_per_row, device=device)
    col = torch.arange(max_pages, device=device)
    take = col[None] < counts[:, None]
    idx = (starts[:, None] + col[None]).clamp(max=num_pages - 1)
    block_table = torch.where(take, pool[idx], torch.full((), -1, dtype=torch.int32, device=device))
    seq = torch.as_tensor(lens.astype(np.int32), device=device)
    return TorchBatch(q, k_cache, weights, seq, block_table)
