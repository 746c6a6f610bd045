"""torch on several devices: one call per rank with ``torch.distributed``, each rank on its own device.

    python benchmarks/torch_ranks.py [--world-size 2] [--device cpu|cuda] [--batch-sizes 8,7,1]
                                     [--queries N] [--heads 64|32]

Data-parallel attention: every rank owns a contiguous slice of the decode batch (its rows' q,
weights, seq_lens and block table) and reads the paged cache its block table points into, on its
own device (``cuda:<rank>``, or the CPU) and its current stream. The op needs nothing from the
other ranks: each rank makes one ``torch.ops.dsa.topk_indexer`` call on its rows, of any count
(a B that does not divide by the world size gives ranks one row more or less; a rank with no rows
makes a call with B = 0). Rows are independent, so the ranks' results, put back in row order, are
the single-process call's bytes on the same device type. With N query tokens per row (q
``[B, N, H, 128]``, docs/contract.md §7) a rank's rows carry their N queries: the split stays over B.

Here every rank builds the same pool and takes its rows out of it; the all-gather to rank 0 exists
only to check the result against the single-process call (a serving engine keeps each rank's ids
on that rank, for its sparse attention). Backends: gloo on the CPU, NCCL on CUDA. The rows per
second of this layout over 1, 2, 4 GPUs: benchmarks/bench_torch_ranks.py.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import ffi_dsa

import ffi_dsa.torch_ops  # noqa: F401  (registers torch.ops.dsa.*)
from ffi_dsa.contract import DEFAULT_TOPK, NUM_HEADS
from ffi_dsa.workloads import make_batch


def rank_rows(batch_size: int, rank: int, world: int) -> slice:
    """Rank `rank`'s contiguous rows, sizes as ``torch.tensor_split`` gives them."""
    base, extra = divmod(batch_size, world)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


def batch_lens(batch_size: int, seed: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(0, 3000, size=batch_size)]


def rank_batch(batch_size: int, seed: int, queries: int | None = None, heads: int = NUM_HEADS):
    """The batch every rank (and the single-process check) builds for one batch size; ``queries=N``
    gives q ``[B, N, H, 128]`` and weights ``[B, N, H]``, whose row slices are a rank's rows."""
    return make_batch(batch_lens(batch_size, seed), seed=seed, spare_pages=3, queries=queries, heads=heads)


BACKENDS = {"cpu": "gloo", "cuda": "nccl"}


def start_rank(rank: int, world: int, init_file: str, device_type: str) -> torch.device:
    """Join the process group (gloo on the CPU, NCCL on CUDA) and take this rank's device."""
    dist.init_process_group(BACKENDS[device_type], init_method=f"file://{init_file}", rank=rank, world_size=world)
    return rank_device(rank, device_type)


def barrier(device: torch.device) -> None:
    """Every rank gets here before any goes on, with its device idle: a phase timed next then
    starts on every GPU at once, so concurrent GPUs are measured concurrently."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        dist.barrier(device_ids=[device.index])
        torch.cuda.synchronize(device)
    else:
        dist.barrier()


def spawn_ranks(fn, world: int, *args) -> None:
    """``fn(rank, world, init_file, *args)`` in `world` processes (a rank's exception is raised here)."""
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(fn, args=(world, str(Path(tmp) / "init"), *args), nprocs=world, join=True)


def rank_device(rank: int, device_type: str) -> torch.device:
    if device_type == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def local_topk(batch, rows: slice, device, topk: int) -> torch.Tensor:
    """This rank's one call: its rows, the pool, on its device."""
    q, k_cache, weights, seq_lens, block_table = batch.to_torch(device)
    return torch.ops.dsa.topk_indexer(q[rows], k_cache, weights[rows], seq_lens[rows], block_table[rows],
                                      topk=topk)


def gather_rows(local: torch.Tensor, batch_size: int, world: int) -> torch.Tensor:
    """Every rank's rows back in row order (ranks hold different row counts: padded to the
    largest for the all-gather, then trimmed)."""
    most = rank_rows(batch_size, 0, world).stop
    padded = torch.full((most, *local.shape[1:]), -1, dtype=local.dtype, device=local.device)
    padded[:local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    sizes = [len(range(batch_size)[rank_rows(batch_size, r, world)]) for r in range(world)]
    return torch.cat([p[:n] for p, n in zip(parts, sizes)])


def run_rank(rank: int, world: int, init_file: str, device_type: str, batch_sizes, seed: int, topk: int,
             out_path: str | None, queries: int | None = None, heads: int = NUM_HEADS) -> None:
    device = start_rank(rank, world, init_file, device_type)
    try:
        results = {}
        for i, batch_size in enumerate(batch_sizes):
            batch = rank_batch(batch_size, seed + i, queries, heads)
            local = local_topk(batch, rank_rows(batch_size, rank, world), device, topk)
            results[f"batch{i}"] = gather_rows(local, batch_size, world).cpu().numpy()
        if rank == 0 and out_path:
            np.savez(out_path, **results)
    finally:
        dist.destroy_process_group()


def single_process(batch_size: int, seed: int, topk: int, device="cpu", queries: int | None = None,
                   heads: int = NUM_HEADS) -> np.ndarray:
    """The same batch in one call on one device (what the ranks must reproduce)."""
    batch = rank_batch(batch_size, seed, queries, heads)
    return torch.ops.dsa.topk_indexer(*batch.to_torch(device), topk=topk).cpu().numpy()


def run(world: int, device_type: str, batch_sizes, seed: int, topk: int, out_path: str,
        queries: int | None = None, heads: int = NUM_HEADS) -> None:
    """Spawn `world` ranks; rank 0 writes every batch size's gathered ids to `out_path` (.npz)."""
    spawn_ranks(run_rank, world, device_type, tuple(batch_sizes), seed, topk, out_path, queries, heads)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--batch-sizes", default="8,7,1", help="comma-separated; each is one call per rank")
    parser.add_argument("--topk", type=int, default=DEFAULT_TOPK)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--queries", type=int, help="N query tokens per row: q [B, N, H, 128] "
                                                    "(default: q [B, H, 128])")
    parser.add_argument("--heads", type=int, default=NUM_HEADS, help="H, index heads")
    parser.add_argument("--out", help="also keep the gathered ids here (.npz: batch0, batch1, ... "
                                      "in --batch-sizes order)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and torch.cuda.device_count() < args.world_size:
        parser.error(f"--device cuda needs {args.world_size} GPUs, found {torch.cuda.device_count()}")
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or str(Path(tmp) / "ids.npz")
        run(args.world_size, args.device, sizes, args.seed, args.topk, out, args.queries, args.heads)
        got = np.load(out)
        ok = True
        for i, batch_size in enumerate(sizes):
            same = np.array_equal(got[f"batch{i}"], single_process(batch_size, args.seed + i, args.topk,
                                                                       args.device, args.queries, args.heads))
            ok &= same
            print(f"B={batch_size} over {args.world_size} ranks ({args.device}): "
                  f"{'same bytes as one process' if same else 'DIFFERENT from one process'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
