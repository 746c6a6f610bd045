"""JAX with one process per device: ``jax.distributed`` (multi-controller JAX), each process its own rows.

Multi-host JAX, and single-host servers that run one process per GPU (sglang-jax style), start every
process with ``jax.distributed.initialize``: the processes then share one global device list, a
``Mesh`` spans all of them, and a ``jax.jit`` over that mesh runs on every process, each executing
its own devices' part. The op needs no collective for that: rows are independent, so a
data-parallel layout is one local call per device on the rows and page pool that device holds.

    from ffi_dsa.integration import jax_distributed as jd

    jd.initialize(process_id, num_processes, "localhost:1234", platform="gpu")   # before any JAX op
    mesh = jd.global_mesh()                                   # every process's devices, axis "dp"
    step = jd.data_parallel_topk(mesh, topk=2048)             # jit of shard_map over the mesh
    ids = step(*jd.global_arrays(mesh, (q, k_cache, weights, seq_lens, block_table)))
    mine = jd.local_rows(ids)                                 # numpy: this process's rows

``global_arrays`` takes this process's arrays (its rows, and its own pool in ``k_cache``, which its
``block_table`` indexes) and makes global arrays sharded over "dp": each process contributes its
part, nothing is copied between processes. Every process must contribute the same shapes (same row
count, same pool size, same table width), which a server gets anyway from its fixed-size pools and
batch buckets; ``jax_sharding.pad_rows`` pads rows with empty ones (their output rows are all -1).
The ids returned are local to each process's pool (``local page * 64 + slot``), what that process's
sparse attention reads.

The other layout, one pool replicated on every process (``shared_pool=True``), is the plain
``jax.jit`` of ``jax_ffi.topk_indexer`` with batch-sharded rows: the op's partitioning rule keeps the
rows where they are, one local call per device, and the pool must then be the same on every process.

``python -m ffi_dsa.integration.jax_processes`` launches the check below in N processes from a shell
(``--platform gpu``: one GPU each); ``bench_jax_processes`` times it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

AXIS = "dp"


def initialize(process_id: int, num_processes: int, coordinator: str, platform: str = "cpu") -> None:
    """``jax.distributed.initialize`` for one process of `num_processes` on this host or others
    (`coordinator`: "host:port" of process 0), before any other JAX call. ``platform="gpu"`` gives
    process i the local GPU i (``local_device_ids``); ``"cpu"`` one CPU device per process."""
    import jax

    if platform not in ("cpu", "gpu"):
        raise ValueError(f"platform must be 'cpu' or 'gpu', got {platform!r}")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process_id must be in [0, {num_processes}), got {process_id}")
    # on GPUs the CPU backend stays too (the op registers its CPU target whatever the platform)
    jax.config.update("jax_platforms", "cuda,cpu" if platform == "gpu" else "cpu")
    if platform == "cpu":  # collectives between CPU processes (barriers, a user's psum) need gloo
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id,
                               local_device_ids=[process_id] if platform == "gpu" else None)


def global_mesh():
    """A one-axis mesh ("dp") over every process's devices, in process order."""
    import jax
    from jax.sharding import Mesh

    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return Mesh(np.array(devices), (AXIS,))


def global_arrays(mesh, arrays, replicated=()):
    """This process's arrays as global arrays over `mesh`: dim 0 sharded over "dp" (each process
    contributes its part), except positions in `replicated`, whose whole value every process holds.
    An fp8 q given as uint8/int8 bytes stays bytes (the op accepts either)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    out = []
    for i, a in enumerate(arrays):
        spec = P() if i in replicated else P(AXIS)
        out.append(jax.make_array_from_process_local_data(NamedSharding(mesh, spec), np.asarray(a)))
    return out


def data_parallel_topk(mesh, topk: int, sorted: bool = False, shared_pool: bool = False):
    """The jitted call over `mesh` for arguments made by ``global_arrays``: with a pool per process
    (default) a ``shard_map`` in which every device runs the op on its rows and its pool; with
    ``shared_pool`` the plain jit, the pool replicated (``global_arrays(..., replicated=(1,))``)."""
    import jax
    from jax.sharding import PartitionSpec as P

    from .jax_ffi import topk_indexer

    def local(q, k_cache, weights, seq_lens, block_table):
        return topk_indexer(q, k_cache, weights, seq_lens, block_table, topk=topk, sorted=sorted)

    if shared_pool:
        return jax.jit(local)
    row = P(AXIS)
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(row,) * 5, out_specs=row))


def local_rows(array) -> np.ndarray:
    """The rows of a dim-0-sharded global array that this process holds, in order, as numpy."""
    shards = sorted(array.addressable_shards, key=lambda s: s.index[0].start or 0)
    return np.concatenate([np.asarray(s.data) for s in shards])


# ---- the check one process runs (launched by jax_processes) --------------------------------------

# Every length the contract singles out, and rows longer than K, on each process.
CHECK_LENGTHS = (0, 1, 100, 2047, 2048, 2049, 3000, 4100)


def _with_ties(batch, seed: int):
    """Copy some tokens' keys and scales onto their row's next token: equal scores, so the smaller
    position must win, on both sides of the K-th place of the long rows."""
    from ..contract import PAGE_BYTES, PAGE_FP8_BYTES, PAGE_TOKENS, HEAD_DIM

    rng = np.random.default_rng(seed)
    pages = batch.k_cache.view(np.uint8).reshape(-1, PAGE_BYTES)
    lens = np.asarray(batch.seq_lens).reshape(len(batch.seq_lens), -1).max(axis=1)
    for b, n in enumerate(lens):
        for t in rng.integers(0, max(int(n) - 1, 1), size=min(int(n) // 2, 64)):
            src, dst = int(t), int(t) + 1
            ps, ss = int(batch.block_table[b, src // PAGE_TOKENS]), src % PAGE_TOKENS
            pd, sd = int(batch.block_table[b, dst // PAGE_TOKENS]), dst % PAGE_TOKENS
            pages[pd, sd * HEAD_DIM:(sd + 1) * HEAD_DIM] = pages[ps, ss * HEAD_DIM:(ss + 1) * HEAD_DIM]
            off_s, off_d = PAGE_FP8_BYTES + 4 * ss, PAGE_FP8_BYTES + 4 * sd
            pages[pd, off_d:off_d + 4] = pages[ps, off_s:off_s + 4]
    return batch


def check_batches(process_id: int, num_processes: int, seed: int):
    """What process `process_id` checks: (layout, shared_pool, its arguments), the arguments being
    numpy ``(q bytes, k_cache, weights, seq_lens, block_table)`` of its rows; ``k_cache`` is its own
    pool, or with ``shared_pool`` the pool every process holds. Deterministic: a caller can rebuild
    them to check the ids independently."""
    from ..workloads import make_batch

    lens = np.array(CHECK_LENGTHS)
    own = _with_ties(make_batch(lens, seed=seed + 7919 * (process_id + 1)), seed + process_id)
    rng = np.random.default_rng(seed + 31 * process_id)
    mtp_lens = np.stack([lens, np.maximum(lens - rng.integers(0, 3, size=len(lens)), 0)], axis=1)
    mtp = make_batch(mtp_lens, queries=2, heads=32, seed=seed + 7919 * (process_id + 1) + 1)
    shared = _with_ties(make_batch(np.tile(lens, num_processes), seed=seed + 1), seed + 1)  # same everywhere
    rows = slice(process_id * len(lens), (process_id + 1) * len(lens))
    mine = (shared.q[rows], shared.k_cache, shared.weights[rows], shared.seq_lens[rows], shared.block_table[rows])
    return [("pool_per_process", False, own.args()), ("pool_per_process_mtp", False, mtp.args()),
            ("shared_pool", True, mine)]


def _expected_bytes(args, topk: int) -> np.ndarray:
    """The single-process call on this process's device: the bytes the distributed call must give."""
    import jax
    import jax.numpy as jnp

    from .jax_ffi import topk_indexer

    device = jax.local_devices()[0]
    q, *rest = args
    placed = [jax.device_put(jnp.asarray(q).view(jnp.float8_e4m3fn), device)] + \
             [jax.device_put(jnp.asarray(a), device) for a in rest]
    return np.asarray(topk_indexer(*placed, topk=topk))


def run_check(process_id: int, num_processes: int, topk: int, seed: int) -> tuple[dict, dict]:
    """Every layout on this process's rows, checked against the float64 reference (SPEC tolerance)
    and byte for byte against the single-device call on the same rows: (report, the ids of each
    layout)."""
    import jax.numpy as jnp

    import ffi_dsa

    mesh = global_mesh()
    report = {"process": process_id, "processes": num_processes, "devices": len(mesh.devices),
              "rows": {}, "problems": []}
    outputs = {}
    for name, shared_pool, args in check_batches(process_id, num_processes, seed):
        q = jnp.asarray(args[0]).view(jnp.float8_e4m3fn)
        step = data_parallel_topk(mesh, topk, shared_pool=shared_pool)
        arrays = global_arrays(mesh, (q, *args[1:]), replicated=(1,) if shared_pool else ())
        mine = local_rows(step(*arrays))
        outputs[name] = mine
        report["rows"][name] = int(mine.shape[0])
        report["problems"] += [f"{name}: {p}" for p in ffi_dsa.check_topk(mine, *args)]
        if not np.array_equal(mine, _expected_bytes(args, topk)):
            report["problems"].append(f"{name}: differs from the single-device call on the same rows")
    return report, outputs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="One process of a jax.distributed check of ffi_dsa "
                                     "(launch N of them with python -m ffi_dsa.integration.jax_processes)")
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--coordinator", required=True, help="host:port of process 0")
    parser.add_argument("--platform", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="a folder: write this process's ids there "
                        "(process<i>.npz, one array per layout) for a caller to check independently")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    initialize(args.process_id, args.processes, args.coordinator, args.platform)
    report, outputs = run_check(args.process_id, args.processes, args.topk, args.seed)
    report["seconds"] = round(time.perf_counter() - start, 2)
    if args.out:
        np.savez(f"{args.out}/process{args.process_id}.npz", **outputs)
    print(json.dumps(report), flush=True)
    import jax

    jax.distributed.shutdown()
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
