"""Randomized check of the operator against the float64 reference (docs/contract.md), many calls.

Every call draws a new shape and data: B (0 .. 8, sometimes 131-133 or a few hundred), N query tokens
per row (1 .. 4; N = 1 as a rank-3 or a rank-4 q), H (64 or 32 heads), row lengths (0, 1, 63, 64, 65,
K-1, K, K+1, 2047-2049, random, sometimes long), seq_lens [B] (causal offsets) or [B, N] (a length per
query: near the row's, random, edge values, 0, negative or past the table), weights [B * N, H] or
[B, N, H], the output [B * N, K] or [B, N, K], K (1, 17, 512, 1000, 2047, 2048 or random), the order
(position or score), the ids (global slots or positions in the row), a max_seq_len (none, 0, below the
longest row, equal, above: never a different answer), a block table sometimes far wider than the rows with random page ids (valid or
not) past each row's longest prefix, invalid page ids inside rows, NaN and infinite scales, NaN
weights, and about half the calls use data whose scores are exact in any order of addition (small
integers: exact ties and relu's 0.0 plateaus), where the output must equal the reference's choice
byte for byte; elsewhere `check_topk`'s tolerance applies. Outputs are poisoned before each call and
must be fully written; every call is repeated (on CUDA on a second stream) and must give the same
bytes.

Pages come from two fixed pools (random FP8 keys with random scales, and small-integer keys with
unit scales), decoded once, so a call costs only its own tokens' reference scores (a row's keys are
gathered once for all its queries). The summary counts tokens scored: each query row's visible
prefix.

    python benchmarks/fuzz.py --device cuda --calls 10000

``--prefill`` fuzzes the prefill op instead (docs/contract.md, prefill; CPU or CUDA): a
chunk of 0-4 requests of random and edge lengths, each with some of its last tokens as causal query
rows, keys gathered back to back with spare keys after them, H 64 or 32, K, order and ids
("relative"/"absolute") drawn per call, ks/ke entries the kernel must clamp (ks < 0, ke > N, ks >= ke),
special scales and NaN weights, exact data about half the time, as above.

    python benchmarks/fuzz.py --device cuda --prefill --calls 2000

``--mxfp4`` fuzzes the MXFP4 op instead (docs/contract.md §9; CPU only: it has no CUDA kernel yet):
decode's draws (B, N, H, lengths, tables with invalid pages, seq_lens forms, K, order, ids,
max_seq_len) over two MXFP4 pools: quantized random keys sprinkled with NaN (255), 0, 1, 227 and
far-off scale bytes, and small E2M1 values with scale bytes 126-128 (exact scores: the output must be
the reference's choice byte for byte); random queries sometimes with a NaN scale byte.

    python benchmarks/fuzz.py --device cpu --mxfp4 --calls 2000
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

# One BLAS thread per checking process: the checks run in as many processes as there are cores,
# and numpy's threads on top of them oversubscribed the device host (~10 calls/s over 16 cores).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

import ffi_dsa  # noqa: E402
from ffi_dsa.contract import HEAD_DIM, MAX_QUERIES, PAGE_FP8_BYTES, PAGE_TOKENS, SUPPORTED_HEADS  # noqa: E402
from ffi_dsa.kv_cache import pack_k_cache, unpack_k_cache  # noqa: E402
from ffi_dsa.decode_reference import RowScores, row_scores, select_rows, visible_lengths  # noqa: E402
from ffi_dsa.mxfp4_cache import (dequantize, pack_nibbles, pages_of, quantize_mxfp4,  # noqa: E402
                                 quantize_mxfp4_q, q_scale_bytes, unpack_nibbles)
from ffi_dsa.workloads import MODEL_TABLE_PAGES  # noqa: E402

POOL_PAGES = 4096  # 262K tokens per pool: rows draw distinct pages from it
EDGE_LENGTHS = [0, 1, 2, 63, 64, 65, 127, 2047, 2048, 2049, 4095, 4097]
TOPKS = [1, 17, 512, 1000, 2047, 2048]


class Pool:
    """A packed page pool and its decoded float64 key values and scales."""

    def __init__(self, rng: np.random.Generator, exact: bool):
        import ml_dtypes

        if exact:
            keys = rng.choice(np.array([-1.0, 0.0, 0.0, 1.0, 2.0], np.float32), size=(POOL_PAGES, PAGE_TOKENS, HEAD_DIM))
            keys[..., 4:] = 0.0  # few active dims: exact integer sums, many ties and zero plateaus
        else:
            keys = rng.standard_normal((POOL_PAGES, PAGE_TOKENS, HEAD_DIM), dtype=np.float32)
        self.k_cache = pack_k_cache(keys)
        raw = self.k_cache.view(np.uint8).reshape(POOL_PAGES, -1)
        scales = raw[:, PAGE_FP8_BYTES:].view("<f4")
        if exact:
            scales[:] = 1.0
            fp8 = keys.astype(ml_dtypes.float8_e4m3fn)
            raw[:, : PAGE_FP8_BYTES] = fp8.view(np.uint8).reshape(POOL_PAGES, -1)
        else:
            scales[:] = rng.uniform(0.5, 1.5, size=scales.shape).astype(np.float32)
            # Scales the kernels may not factor out of the relu (docs/contract.md: only a number in
            # [0, 2^64) is), scattered so that a quad or warp mixes both forms: NaN, +-inf,
            # negative, +-0.0 and beyond 2^64; and whole pages of negative or zero scales.
            special = rng.choice(scales.size, size=96, replace=False)
            flat = scales.reshape(-1)
            flat[special[:20]] = np.nan
            flat[special[20:32]] = np.inf
            flat[special[32:40]] = -np.inf
            flat[special[40:56]] = -rng.uniform(1e-3, 1.5, size=16).astype(np.float32)
            flat[special[56:68]] = 0.0
            flat[special[68:76]] = -0.0
            flat[special[76:96]] = np.float32(3e19)
            whole = rng.choice(POOL_PAGES, size=6, replace=False)
            scales[whole[:4]] = -rng.uniform(0.5, 1.5, size=(4, scales.shape[1])).astype(np.float32)
            scales[whole[4:]] = 0.0
        fp8v, scale = unpack_k_cache(self.k_cache)
        self.keys = fp8v.reshape(POOL_PAGES * PAGE_TOKENS, HEAD_DIM)
        self.scales = scale.reshape(POOL_PAGES * PAGE_TOKENS)
        self.exact = exact


def draw_lengths(rng, batch: int, topk: int) -> np.ndarray:
    lens = np.empty(batch, np.int64)
    for b in range(batch):
        kind = rng.random()
        if kind < 0.35:
            lens[b] = rng.choice(EDGE_LENGTHS + [topk - 1, topk, topk + 1])
        elif kind < 0.94:
            lens[b] = rng.integers(0, 4000)
        elif kind < 0.995:
            lens[b] = rng.integers(4000, 24000)
        else:
            lens[b] = rng.integers(24000, 100000)
    return np.clip(lens, 0, None)


def draw_query_lengths(rng, row_lens: np.ndarray, queries: int, topk: int) -> np.ndarray:
    """seq_lens [B, N]: per query, the row's length less a little (as causal queries see), a random
    prefix, an edge length or 0; none longer than its row, so the row's pages cover every query."""
    lens = np.empty((len(row_lens), queries), np.int64)
    for b, n in enumerate(row_lens):
        for j in range(queries):
            kind = rng.random()
            if kind < 0.5:
                lens[b, j] = n - rng.integers(0, 3) * (queries - 1 - j)
            elif kind < 0.8:
                lens[b, j] = rng.integers(0, n + 1)
            elif kind < 0.95:
                lens[b, j] = rng.choice(EDGE_LENGTHS + [topk - 1, topk, topk + 1])
            else:
                lens[b, j] = 0
    return np.clip(np.minimum(lens, row_lens[:, None]), 0, None)


def draw_table(rng, longest: np.ndarray) -> np.ndarray:
    """A block table holding each row's pages for its longest prefix: distinct random pool pages,
    sometimes invalid ids among them, and random ids (valid or not) past them, in a table sometimes
    far wider than the rows."""
    pages = (longest + PAGE_TOKENS - 1) // PAGE_TOKENS
    width = int(max(1, pages.max(initial=0)))
    if rng.random() < 0.2 and width < MODEL_TABLE_PAGES:
        width = int(rng.integers(width, MODEL_TABLE_PAGES + 1))  # a table sized for the model's longest row
    table = rng.integers(-3, POOL_PAGES + 3, size=(len(longest), width)).astype(np.int32)  # garbage past lengths
    for b in range(len(longest)):
        table[b, : pages[b]] = rng.choice(POOL_PAGES, size=pages[b], replace=False)
        if pages[b] and rng.random() < 0.1:  # invalid pages inside the row
            bad = rng.choice(pages[b], size=min(pages[b], int(rng.integers(1, 4))), replace=False)
            table[b, bad] = rng.choice(np.array([-1, -7, POOL_PAGES, POOL_PAGES + 100], np.int32), size=len(bad))
    return table


def draw_queries(rng, exact: bool, batch: int, queries: int, heads: int):
    """q [B, N, H, 128] as fp8 bytes and weights [B, N, H] for exact data or random data."""
    import ml_dtypes

    shape = (batch, queries, heads)
    if exact:
        q = rng.choice(np.array([0.0, 1.0, 2.0], np.float32), size=(*shape, HEAD_DIM))
        q[..., 4:] = 0.0
        weights = rng.choice(np.array([-1.0, 1.0, 2.0], np.float32), size=shape)
    else:
        q = rng.standard_normal((*shape, HEAD_DIM), dtype=np.float32)
        weights = rng.standard_normal(shape, dtype=np.float32)
        if batch and rng.random() < 0.05:
            weights[rng.integers(0, batch), rng.integers(0, queries), rng.integers(0, heads)] = np.nan
    return q.astype(ml_dtypes.float8_e4m3fn).view(np.uint8), weights


def draw_seq_lens(rng, row_lens: np.ndarray, queries: int, topk: int, per_query: bool, capacity: int):
    """seq_lens [B] (the rows' lengths) or [B, N]; sometimes a negative entry, or in the [B, N] form
    one past the table's capacity (both are clamped by the op). Only a row whose pages fill the table
    gets one past it: elsewhere the query would see the random ids past the row's pages, which may
    repeat the row's own pages."""
    seq_lens = draw_query_lengths(rng, row_lens, queries, topk) if per_query else row_lens.copy()
    seq_lens = seq_lens.astype(np.int32)
    flat = seq_lens.reshape(-1)
    if flat.size and rng.random() < 0.05:
        flat[rng.integers(0, flat.size)] = -5  # counts as 0
    full = np.nonzero(row_lens > capacity - PAGE_TOKENS)[0]
    if per_query and full.size and rng.random() < 0.05:
        seq_lens[rng.choice(full), rng.integers(0, queries)] = capacity + int(rng.integers(1, 100))
    return seq_lens


def draw_call(rng, pools):
    pool = pools[rng.random() < 0.5]
    topk = int(rng.choice(TOPKS)) if rng.random() < 0.8 else int(rng.integers(1, 2049))
    r = rng.random()
    batch = int(rng.integers(0, 9)) if r < 0.96 else (int(rng.integers(131, 134)) if r < 0.99 else int(rng.integers(200, 400)))
    queries = int(rng.integers(1, MAX_QUERIES + 1))
    heads = int(rng.choice(SUPPORTED_HEADS))
    row_lens = draw_lengths(rng, batch, topk)
    if batch > 100:
        row_lens = np.minimum(row_lens, 1200 // queries)  # keep the reference's work per call bounded
    table = draw_table(rng, row_lens)
    seq_lens = draw_seq_lens(rng, row_lens, queries, topk, bool(rng.random() < 0.5), table.shape[1] * PAGE_TOKENS)
    q8, weights = draw_queries(rng, pool.exact, batch, queries, heads)
    if queries == 1 and rng.random() < 0.5:
        q8 = q8[:, 0]  # the rank-3 form
    if rng.random() < 0.5:
        weights = weights.reshape(batch * queries, heads)
    out_shape = (batch * queries, topk) if rng.random() < 0.5 else (batch, queries, topk)
    sorted_ = bool(rng.random() < 0.4)
    return pool, (q8, pool.k_cache, weights, seq_lens, table), topk, sorted_, out_shape, draw_options(rng, row_lens)


def draw_options(rng, row_lens: np.ndarray) -> dict:
    """ids (positions half the time) and a max_seq_len: none, 0, or below / at / above the longest row."""
    longest = int(row_lens.max(initial=0))
    r = rng.random()
    bound = (None if r < 0.4 else 0 if r < 0.5 else int(rng.integers(1, longest + 1)) if r < 0.75 and longest
             else longest if r < 0.85 else longest + int(rng.integers(1, 100_000)))
    return {"ids": "positions" if rng.random() < 0.5 else "slots", "max_seq_len": bound}


def reference_rows(pool: Pool, args) -> list[RowScores]:
    """reference_scores for the pool's pages, from the pool's decoded keys: one RowScores per query
    row, each row's keys gathered once for its longest prefix."""
    import ml_dtypes

    q8, _, weights, seq_lens, table = args
    qf = q8.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    batch, queries, heads = qf.shape[0], (qf.shape[1] if qf.ndim == 4 else 1), qf.shape[-2]
    qf = qf.reshape(batch, queries, heads, HEAD_DIM)
    w = weights.astype(np.float64).reshape(batch, queries, heads)
    visible = visible_lengths(seq_lens, queries, table.shape[1]).reshape(batch, queries)
    rows = []
    for b in range(batch):
        t = np.arange(visible[b].max(initial=0))
        page = table[b, t // PAGE_TOKENS].astype(np.int64)
        valid = (page >= 0) & (page < POOL_PAGES)
        t, page = t[valid], page[valid]
        ids = page * PAGE_TOKENS + t % PAGE_TOKENS
        keys, scales = pool.keys[ids], pool.scales[ids]
        for j in range(queries):
            m = int(np.searchsorted(t, visible[b, j]))  # the candidates query j sees
            rows.append(row_scores(keys[:m], qf[b, j], w[b, j], t[:m], ids[:m], scales=scales[:m]))
    return rows


class Runner:
    """One call into a poisoned output, and its repeat (on CUDA on a second stream)."""

    SENTINEL = 0x7EEEEEEE

    def __init__(self, device: str):
        self.device = device
        if device == "cuda":
            import torch

            self.torch = torch
            self.side = torch.cuda.Stream()
            self.caches = {}  # the pools' packed pages, copied to the device once

    def run(self, args, out_shape, sorted_: bool, options: dict) -> tuple[np.ndarray, np.ndarray]:
        if self.device == "cpu":
            outs = []
            for _ in range(2):
                out = np.full(out_shape, self.SENTINEL, np.int32)
                ffi_dsa.call(*args, out, sorted=sorted_, **options)
                outs.append(out)
            return outs[0], outs[1]
        torch = self.torch
        t = [None if k == 1 else torch.from_numpy(np.ascontiguousarray(a)).cuda() for k, a in enumerate(args)]
        t[0] = t[0].view(torch.float8_e4m3fn)
        if id(args[1]) not in self.caches:
            self.caches[id(args[1])] = torch.from_numpy(args[1]).cuda()
        t[1] = self.caches[id(args[1])]
        first = torch.full(out_shape, self.SENTINEL, dtype=torch.int32, device="cuda")
        second = first.clone()
        ffi_dsa.call(*t, first, sorted=sorted_, **options)
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            ffi_dsa.call(*t, second, sorted=sorted_, **options)
        torch.cuda.synchronize()
        return first.cpu().numpy(), second.cpu().numpy()


_POOLS: tuple[Pool, Pool] | None = None  # set before the checking processes fork: they share it


def verdict(task) -> list[str]:
    """The problems of one call's outputs (runs in a checking process)."""
    exact, args, topk, sorted_, ids, got, again = task
    pool = _POOLS[exact]
    args = (args[0], pool.k_cache, *args[2:])  # the task left the shared cache out (35 MB to pickle)
    return output_problems(pool, got, again, reference_rows(pool, args), topk, sorted_, ids,
                           lambda rows: ffi_dsa.check_topk(got, *args, sorted=sorted_, ids=ids, rows=rows))


def output_problems(pool, got, again, rows, topk, sorted_, ids, check) -> list[str]:
    """What is wrong with one call's output `got` (and its repeat `again`) against the reference's
    rows: unwritten elements, bytes that differ between the runs, and on exact data any row other
    than the reference's choice, else what `check(rows)` (the op's tolerance check) finds."""
    problems = []
    if np.any(got == Runner.SENTINEL):
        problems.append("output not fully written")
    if not np.array_equal(got, again):
        problems.append("a repeated call gave other bytes")
    if pool.exact:
        want = select_rows(rows, topk, sorted_, ids=ids)
        bad = np.nonzero(np.any(got.reshape(want.shape) != want, axis=1))[0]
        if bad.size:
            problems.append(f"exact data: rows {bad[:5].tolist()} differ from the reference's choice")
    else:
        problems += check(rows)
    return problems


def calls_and_outputs(rng, runner: Runner, count: int, deadline: float):
    """(description, task) of each call, run on the device as the checks consume them."""
    for i in range(count):
        if deadline and time.perf_counter() > deadline:
            return
        pool, args, topk, sorted_, out_shape, options = draw_call(rng, _POOLS)
        got, again = runner.run(args, out_shape, sorted_, options)
        q8, _, weights, lens, table = args
        queries = q8.shape[1] if q8.ndim == 4 else 1
        seen = int(visible_lengths(lens, queries, table.shape[1]).sum())
        about = (f"call {i}: B={len(lens)} q={list(q8.shape[:-1])} weights={list(weights.shape)} "
                 f"out={list(out_shape)} K={topk} sorted={sorted_} {options} exact={pool.exact} width={table.shape[1]} "
                 f"lens={lens[:8].tolist()}", seen)
        yield about, (pool.exact, (args[0], None, *args[2:]), topk, sorted_, options["ids"], got, again)


# ----------------------------------------------------------------------------------------------
# MXFP4 pages (--mxfp4): decode's draws, MXFP4 keys and queries.
# ----------------------------------------------------------------------------------------------

class Mxfp4Pool:
    """A pool of MXFP4 pages and each token's E2M1 codes and scale bytes, by global id."""

    def __init__(self, rng: np.random.Generator, exact: bool):
        shape = (POOL_PAGES, PAGE_TOKENS, HEAD_DIM)
        if exact:
            values = rng.choice(np.array([-1.0, 0.0, 0.0, 1.0, 2.0]), size=shape)
            values[..., 4:] = 0.0  # few active values: exact sums, ties and zero plateaus
            codes = _exact_codes(values)
            scale_bytes = rng.integers(126, 129, size=(POOL_PAGES, PAGE_TOKENS, 4)).astype(np.uint8)
        else:
            codes, scale_bytes = quantize_mxfp4(rng.standard_normal(shape, dtype=np.float32))
            flat = scale_bytes.reshape(-1)
            special = rng.choice(flat.size, size=120, replace=False)
            flat[special[:30]] = 255  # NaN
            flat[special[30:50]] = 0
            flat[special[50:70]] = 1
            # large bytes, but no score beyond float32's range (2^100 x a block sum x 64 heads stays
            # below 2^128): past it float32 has no number to give, and the float64 reference does
            flat[special[70:90]] = 227
            flat[special[90:]] = rng.integers(40, 210, size=30)
            whole = rng.choice(POOL_PAGES, size=4, replace=False)
            scale_bytes[whole] = rng.integers(100, 150, size=(4, PAGE_TOKENS, 4))
        self.k_cache = pages_of(codes, scale_bytes)
        self.codes = codes.reshape(POOL_PAGES * PAGE_TOKENS, HEAD_DIM)
        self.scale_bytes = scale_bytes.reshape(POOL_PAGES * PAGE_TOKENS, 4)
        self.exact = exact


def _exact_codes(values: np.ndarray) -> np.ndarray:
    """E2M1 codes of values in {-1, 0, 1, 2} (magnitude codes 0, 2, 4; sign bit 3)."""
    magnitude = np.select([np.abs(values) == 1.0, np.abs(values) == 2.0], [2, 4], 0).astype(np.uint8)
    return magnitude | np.where(values < 0, 8, 0).astype(np.uint8)


def draw_mxfp4_queries(rng, exact: bool, batch: int, queries: int, heads: int):
    """q [B, N, H, 64] uint8, q_scale [B, N, H] int32 and weights [B, N, H], exact or random."""
    shape = (batch, queries, heads)
    if exact:
        values = rng.choice(np.array([0.0, 1.0, 2.0]), size=(*shape, HEAD_DIM))
        values[..., 4:] = 0.0
        q = pack_nibbles(_exact_codes(values))
        q_scale = rng.integers(126, 129, size=(*shape, 4)).astype(np.uint8).view("<i4")[..., 0].copy()
        weights = rng.choice(np.array([-1.0, 1.0, 2.0], np.float32), size=shape)
    else:
        q, q_scale = quantize_mxfp4_q(rng.standard_normal((*shape, HEAD_DIM), dtype=np.float32))
        weights = rng.standard_normal(shape, dtype=np.float32)
        if batch and rng.random() < 0.05:
            weights[rng.integers(0, batch), rng.integers(0, queries), rng.integers(0, heads)] = np.nan
        if batch and rng.random() < 0.05:  # a NaN scale byte in one head: that query row scores NaN
            raw = q_scale.view(np.uint8).reshape(*shape, 4)
            raw[rng.integers(0, batch), rng.integers(0, queries), rng.integers(0, heads), rng.integers(0, 4)] = 255
    return q, q_scale, weights


def draw_mxfp4_call(rng, pools):
    """decode's draw (draw_call), with MXFP4 queries over an MXFP4 pool."""
    pool = pools[rng.random() < 0.5]
    topk = int(rng.choice(TOPKS)) if rng.random() < 0.8 else int(rng.integers(1, 2049))
    batch = int(rng.integers(0, 9)) if rng.random() < 0.97 else int(rng.integers(100, 140))
    queries = int(rng.integers(1, MAX_QUERIES + 1))
    heads = int(rng.choice(SUPPORTED_HEADS))
    row_lens = draw_lengths(rng, batch, topk)
    if batch > 50:
        row_lens = np.minimum(row_lens, 1200 // queries)
    table = draw_table(rng, row_lens)
    seq_lens = draw_seq_lens(rng, row_lens, queries, topk, bool(rng.random() < 0.5), table.shape[1] * PAGE_TOKENS)
    q, q_scale, weights = draw_mxfp4_queries(rng, pool.exact, batch, queries, heads)
    if queries == 1 and rng.random() < 0.5:
        q, q_scale, weights = q[:, 0], q_scale[:, 0], weights[:, 0]  # the rank-3 form
    elif rng.random() < 0.5:
        q_scale, weights = q_scale.reshape(batch * queries, heads), weights.reshape(batch * queries, heads)
    out_shape = (batch * queries, topk) if rng.random() < 0.5 else (batch, queries, topk)
    args = (q, q_scale, pool.k_cache, weights, seq_lens, table)
    return pool, args, topk, bool(rng.random() < 0.4), out_shape, draw_options(rng, row_lens)


def mxfp4_reference_rows(pool: Mxfp4Pool, args) -> list[RowScores]:
    """reference_mxfp4_scores from the pool's codes and scale bytes: a row's keys dequantized once
    for all its queries."""
    q, q_scale, _, weights, seq_lens, table = args
    batch, heads = q.shape[0], q.shape[-2]
    queries = q.shape[1] if q.ndim == 4 else 1
    qf = dequantize(unpack_nibbles(q), q_scale_bytes(q_scale).reshape(*q.shape[:-1], 4))
    qf = qf.reshape(batch, queries, heads, HEAD_DIM)
    w = weights.astype(np.float64).reshape(batch, queries, heads)
    visible = visible_lengths(seq_lens, queries, table.shape[1]).reshape(batch, queries)
    rows = []
    for b in range(batch):
        t = np.arange(visible[b].max(initial=0))
        page = table[b, t // PAGE_TOKENS].astype(np.int64)
        valid = (page >= 0) & (page < POOL_PAGES)
        t, page = t[valid], page[valid]
        ids = page * PAGE_TOKENS + t % PAGE_TOKENS
        keys = dequantize(pool.codes[ids], pool.scale_bytes[ids])
        for j in range(queries):
            m = int(np.searchsorted(t, visible[b, j]))
            rows.append(row_scores(keys[:m], qf[b, j], w[b, j], t[:m], ids[:m]))
    return rows


def mxfp4_verdict(task) -> list[str]:
    """The problems of one MXFP4 call's outputs (runs in a checking process)."""
    exact, args, topk, sorted_, ids, got, again = task
    pool = _POOLS[exact]
    args = (*args[:2], pool.k_cache, *args[3:])
    return output_problems(pool, got, again, mxfp4_reference_rows(pool, args), topk, sorted_, ids,
                           lambda rows: ffi_dsa.check_mxfp4_topk(got, *args, sorted=sorted_, ids=ids, rows=rows))


def mxfp4_calls_and_outputs(rng, count: int, deadline: float):
    """(description, task) of each MXFP4 call, run twice on the CPU into poisoned outputs."""
    for i in range(count):
        if deadline and time.perf_counter() > deadline:
            return
        pool, args, topk, sorted_, out_shape, options = draw_mxfp4_call(rng, _POOLS)
        outs = []
        for _ in range(2):
            out = np.full(out_shape, Runner.SENTINEL, np.int32)
            ffi_dsa.mxfp4_call(*args, out, sorted=sorted_, **options)
            outs.append(out)
        q, lens, table = args[0], args[4], args[5]
        queries = q.shape[1] if q.ndim == 4 else 1
        seen = int(visible_lengths(lens, queries, table.shape[1]).sum())
        about = (f"mxfp4 call {i}: B={len(lens)} q={list(q.shape[:-1])} q_scale={list(args[1].shape)} "
                 f"out={list(out_shape)} K={topk} sorted={sorted_} {options} exact={pool.exact} "
                 f"width={table.shape[1]} lens={lens[:8].tolist()}", seen)
        yield about, (pool.exact, (*args[:2], None, *args[3:]), topk, sorted_, options["ids"], *outs)


# ----------------------------------------------------------------------------------------------
# Prefill (--prefill): each call draws its own chunk, small enough for the float64 reference.
# ----------------------------------------------------------------------------------------------

PREFILL_ROW_KEYS = 400_000  # keys scored over a call's rows, at most: bounds the reference's work


def draw_chunk_lengths(rng, topk: int) -> tuple[np.ndarray, np.ndarray]:
    """(keys, query rows) of each request of a chunk: random and edge lengths, a few of each
    request's last tokens (a later chunk), all of them, or none."""
    requests = int(rng.integers(0, 5))
    lens = np.array([rng.choice(EDGE_LENGTHS + [topk - 1, topk, topk + 1]) if rng.random() < 0.4
                     else rng.integers(0, 3000) for _ in range(requests)], np.int64)
    lens = np.clip(lens, 0, None)
    queries = np.array([n if rng.random() < 0.3 and n <= 300 else rng.integers(0, min(n, 64) + 1) for n in lens],
                       np.int64)
    while (queries * lens).sum() > PREFILL_ROW_KEYS:  # keep the reference's work per call bounded
        queries //= 2
    return lens, queries


def draw_prefill_keys(rng, num_keys: int, exact: bool):
    """k [N, 128] fp8 bytes and k_scale [N]: small integers and unit scales (exact), or random keys
    with random scales sprinkled with NaN, +-inf, negatives, +-0 and values beyond 2^64."""
    import ml_dtypes

    if exact:
        k = rng.choice(np.array([-1.0, 0.0, 0.0, 1.0, 2.0], np.float32), size=(num_keys, HEAD_DIM))
        k[:, 4:] = 0.0
        return k.astype(ml_dtypes.float8_e4m3fn).view(np.uint8), np.ones(num_keys, np.float32)
    k = rng.standard_normal((num_keys, HEAD_DIM), dtype=np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    scale = rng.uniform(0.5, 1.5, size=num_keys).astype(np.float32)
    if num_keys and rng.random() < 0.3:
        special = np.array([np.nan, np.inf, -np.inf, -0.7, 0.0, -0.0, 3e19], np.float32)
        where = rng.integers(0, num_keys, size=min(num_keys, 8))
        scale[where] = rng.choice(special, size=len(where))
    return k, scale


def draw_prefill_ranges(rng, lens: np.ndarray, queries: np.ndarray, num_keys: int):
    """Causal ks/ke of the chunk's rows, with now and then an entry the kernel clamps."""
    from ffi_dsa.prefill_workloads import causal_ranges

    ks, ke = causal_ranges(lens, queries)
    if ks.size and rng.random() < 0.15:
        i = rng.integers(0, ks.size, size=3)
        ks[i[0]] = -int(rng.integers(1, 50))                         # counts as 0
        ke[i[1]] = num_keys + int(rng.integers(1, 50))               # cut to N
        ks[i[2]], ke[i[2]] = ke[i[2]], ks[i[2]]                      # ks >= ke: empty
    return ks, ke


def draw_prefill_call(rng):
    exact = bool(rng.random() < 0.5)
    topk = int(rng.choice(TOPKS)) if rng.random() < 0.8 else int(rng.integers(1, 2049))
    heads = int(rng.choice(SUPPORTED_HEADS))
    lens, queries = draw_chunk_lengths(rng, topk)
    num_keys = int(lens.sum()) + int(rng.choice([0, 0, 1, 63, 200]))  # spare keys no row sees
    k, k_scale = draw_prefill_keys(rng, num_keys, exact)
    ks, ke = draw_prefill_ranges(rng, lens, queries, num_keys)
    q8, weights = draw_queries(rng, exact, len(ks), 1, heads)
    args = (q8[:, 0], k, k_scale, weights[:, 0], ks, ke)
    ids = "absolute" if rng.random() < 0.5 else "relative"
    return exact, args, topk, bool(rng.random() < 0.4), ids


def prefill_verdict(task) -> list[str]:
    """The problems of one prefill call's outputs (runs in a checking process)."""
    exact, args, topk, sorted_, ids, got, again = task
    problems = []
    if np.any(got == Runner.SENTINEL):
        problems.append("output not fully written")
    if not np.array_equal(got, again):
        problems.append("a repeated call gave other bytes")
    rows = ffi_dsa.reference_prefill_scores(*args, ids=ids)
    if exact:
        bad = np.nonzero(np.any(got != select_rows(rows, topk, sorted_), axis=1))[0]
        if bad.size:
            problems.append(f"exact data: rows {bad[:5].tolist()} differ from the reference's choice")
    else:
        problems += ffi_dsa.check_prefill_topk(got, *args, sorted=sorted_, ids=ids, rows=rows)
    return problems


def run_prefill_call(device: str, args, topk: int, sorted_: bool, ids: str) -> np.ndarray:
    """One call on `device` into a poisoned output; host int32 [M, topk]."""
    out = np.full((len(args[0]), topk), Runner.SENTINEL, np.int32)
    if device == "cpu":
        ffi_dsa.prefill_call(*args, out, sorted=sorted_, ids=ids)
        return out
    import torch

    on_device = [torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in args]
    result = torch.from_numpy(out).to(device)
    ffi_dsa.prefill_call(*on_device, result, sorted=sorted_, ids=ids)
    return result.cpu().numpy()


def prefill_calls_and_outputs(rng, device: str, count: int, deadline: float):
    """(description, task) of each prefill call, run on `device` twice into poisoned outputs."""
    for i in range(count):
        if deadline and time.perf_counter() > deadline:
            return
        exact, args, topk, sorted_, ids = draw_prefill_call(rng)
        outs = [run_prefill_call(device, args, topk, sorted_, ids) for _ in range(2)]
        ks, ke = args[4], args[5]
        seen = int(np.clip(np.minimum(ke, len(args[1])) - np.maximum(ks, 0), 0, None).sum())
        about = (f"prefill call {i}: M={len(ks)} N={len(args[1])} H={args[0].shape[1]} K={topk} sorted={sorted_} "
                 f"ids={ids} exact={exact} ks={ks[:6].tolist()} ke={ke[:6].tolist()}", seen)
        yield about, (exact, args, topk, sorted_, ids, *outs)


def main(argv=None) -> int:
    import multiprocessing

    global _POOLS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--minutes", type=float, default=0.0, help="stop after this long (0: no limit)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes checking outputs")
    parser.add_argument("--prefill", action="store_true", help="fuzz the prefill op instead of decode")
    parser.add_argument("--mxfp4", action="store_true", help="fuzz the MXFP4 op (CPU) instead of decode")
    a = parser.parse_args(argv)
    if a.mxfp4 and (a.prefill or a.device != "cpu"):
        parser.error("--mxfp4 fuzzes the MXFP4 op on the CPU (it has no CUDA kernel yet): --device cpu, no --prefill")
    rng = np.random.default_rng(a.seed)
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # inf - inf in the checks of inf scores
    start = time.perf_counter()
    if a.mxfp4:
        _POOLS = (Mxfp4Pool(rng, exact=False), Mxfp4Pool(rng, exact=True))
    elif not a.prefill:
        _POOLS = (Pool(rng, exact=False), Pool(rng, exact=True))
    # The checking processes fork before the device is touched, sharing the decoded pools.
    workers = multiprocessing.get_context("fork").Pool(max(1, a.workers))
    deadline = start + 60 * a.minutes if a.minutes else 0.0
    failures = calls = tokens = 0
    if a.mxfp4:
        stream, check = mxfp4_calls_and_outputs(rng, a.calls, deadline), mxfp4_verdict
    elif a.prefill:
        stream, check = prefill_calls_and_outputs(rng, a.device, a.calls, deadline), prefill_verdict
    else:
        stream, check = calls_and_outputs(rng, Runner(a.device), a.calls, deadline), verdict
    abouts = []

    def tasks():
        for about, task in stream:
            abouts.append(about)
            yield task

    for problems in workers.imap(check, tasks(), chunksize=4):
        about, n_tokens = abouts[calls]
        calls += 1
        tokens += n_tokens
        if problems:
            failures += 1
            print(f"FAIL {about}: {problems[:3]}", flush=True)
        if calls % 500 == 0:
            print(f"fuzz: {calls} calls, {failures} failing, {time.perf_counter() - start:.0f} s", flush=True)
    workers.close()
    op = "prefill, " if a.prefill else "mxfp4, " if a.mxfp4 else ""
    print(f"fuzz ({op}{a.device}, seed {a.seed}): {calls} calls, {tokens} tokens, {failures} failing, "
          f"{time.perf_counter() - start:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
