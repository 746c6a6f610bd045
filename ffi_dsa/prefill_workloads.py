"""Prefill chunks for the tests, the fuzz script and the benchmarks (docs/contract.md, prefill).

A chunk holds the query tokens of several requests: request r owns keys ``[o_r, o_r + L_r)`` of one
contiguous buffer, and its query rows are its last ``Q_r`` tokens, token p (0-based in the request)
seeing keys ``[o_r, o_r + p + 1)`` (causal), as vLLM and SGLang lay out a chunked prefill.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .contract import HEAD_DIM, NUM_HEADS

FP8 = ml_dtypes.float8_e4m3fn


@dataclass
class PrefillBatch:
    q: np.ndarray        # [M, H, 128] uint8 (fp8 bytes)
    k: np.ndarray        # [N, 128] uint8 (fp8 bytes)
    k_scale: np.ndarray  # [N] float32
    weights: np.ndarray  # [M, H] float32
    ks: np.ndarray       # [M] int32
    ke: np.ndarray       # [M] int32

    def args(self):
        return self.q, self.k, self.k_scale, self.weights, self.ks, self.ke

    def to_torch(self, device="cpu"):
        """The same chunk as torch tensors (q and k as float8_e4m3fn) on `device`."""
        import torch

        return (
            torch.from_numpy(self.q).view(torch.float8_e4m3fn).to(device),
            torch.from_numpy(self.k).view(torch.float8_e4m3fn).to(device),
            *(torch.from_numpy(a).to(device) for a in (self.k_scale, self.weights, self.ks, self.ke)),
        )

    @property
    def rows(self) -> int:
        return self.q.shape[0]


def causal_ranges(request_lens, queries=None) -> tuple[np.ndarray, np.ndarray]:
    """(ks, ke) int32 of the query rows of requests of `request_lens` keys laid out back to back,
    each with its last `queries[r]` tokens as query rows (all of them by default)."""
    request_lens = np.asarray(request_lens, np.int64)
    queries = request_lens if queries is None else np.minimum(np.broadcast_to(queries, request_lens.shape),
                                                              request_lens)
    starts = np.concatenate([[0], np.cumsum(request_lens)[:-1]]).astype(np.int64)
    ks, ke = [], []
    for start, length, count in zip(starts, request_lens, queries):
        ends = start + np.arange(length - count, length) + 1
        ks.append(np.full(len(ends), start))
        ke.append(ends)
    cat = (lambda parts: np.concatenate(parts).astype(np.int32)) if ks else (lambda _: np.zeros(0, np.int32))
    return cat(ks), cat(ke)


def make_prefill_batch(request_lens, *, queries=None, seed: int = 0, heads: int = NUM_HEADS, spare_keys: int = 0,
                       scale_range=(0.5, 1.5)) -> PrefillBatch:
    """Random normal q and keys cast to FP8, random per-key scales and weights, causal rows
    (causal_ranges); `spare_keys` more keys at the end of k that no row sees."""
    rng = np.random.default_rng(seed)
    ks, ke = causal_ranges(request_lens, queries)
    num_keys = int(np.sum(request_lens)) + spare_keys
    q = rng.standard_normal((len(ks), heads, HEAD_DIM), dtype=np.float32).astype(FP8).view(np.uint8)
    k = rng.standard_normal((num_keys, HEAD_DIM), dtype=np.float32).astype(FP8).view(np.uint8)
    k_scale = rng.uniform(*scale_range, size=num_keys).astype(np.float32)
    weights = rng.standard_normal((len(ks), heads), dtype=np.float32)
    return PrefillBatch(q, k, k_scale, weights, ks, ke)


def make_exact_prefill_batch(request_lens, *, queries=None, seed: int = 0, heads: int = NUM_HEADS,
                             spare_keys: int = 0, q_values=(-2, -1, 0, 1, 2), k_values=(-2, -1, 0, 1, 2),
                             w_values=(-2, -1, 1, 2), active_dims: int = HEAD_DIM) -> PrefillBatch:
    """A chunk whose scores are exact in float32 in any order of addition (small integers in q, k
    and weights, unit scales; the bound of tests/conftest.py make_exact_batch), so ties and zero
    plateaus can be checked byte for byte."""
    batch = make_prefill_batch(request_lens, queries=queries, seed=seed, heads=heads, spare_keys=spare_keys)
    rng = np.random.default_rng(seed + 1_000_003)
    pick = lambda values, shape: rng.choice(np.asarray(values, np.float32), size=shape)  # noqa: E731
    q = pick(q_values, batch.q.shape)
    q[..., active_dims:] = 0
    k = pick(k_values, batch.k.shape)
    k[..., active_dims:] = 0
    batch.q[...] = q.astype(FP8).view(np.uint8)
    batch.k[...] = k.astype(FP8).view(np.uint8)
    batch.weights[...] = pick(w_values, batch.weights.shape)
    batch.k_scale[...] = 1.0
    return batch


__all__ = ["PrefillBatch", "causal_ranges", "make_prefill_batch", "make_exact_prefill_batch"]
