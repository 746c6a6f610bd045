"""JAX with one process per device: ``jax.distributed`` (multi-controller JAX), each process its own rows.

Multi-host JAX, and single-host servers that run one process per GPU (sglang-jax style), start every
process with ``jax.distributed.initialize``: the processes then share one global device list, a
``Mesh`` spans all of them, and a ``jax.jit`` over that mesh runs on every process, each executing
its own devices' part. The op needs no collective for that: rows are independent, so a
data-parallel layout is one local call per device on the rows and page pool that device holds.

    from ffi_dsa import jax_distributed as jd

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
``jax.jit`` of ``ffi_dsa.topk_indexer`` with batch-sharded rows: the op's partitioning rule keeps the
rows where they are, one local call per device, and the pool must then be the same on every process.

``python benchmarks/jax_processes.py`` launches N processes of a program like this from a shell (by
default a check of every layout against the float64 reference; ``--platform gpu``: one GPU each), and
``benchmarks/bench_jax_processes.py`` times it.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ._arrays import _strict_bool
from .decode import OP, topk_indexer

AXIS = "dp"


def initialize(process_id: int, num_processes: int, coordinator: str, platform: str = "cpu") -> None:
    """``jax.distributed.initialize`` for one process of `num_processes` on this host or others
    (`coordinator`: "host:port" of process 0), before any other JAX call. ``platform="gpu"`` gives
    process i the local GPU i (``local_device_ids``); ``"cpu"`` one CPU device per process."""
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
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return Mesh(np.array(devices), (AXIS,))


def global_arrays(mesh, arrays, replicated=()):
    """This process's arrays as global arrays over `mesh`: dim 0 sharded over "dp" (each process
    contributes its part), except positions in `replicated`, whose whole value every process holds.
    An fp8 q given as uint8/int8 bytes stays bytes (the op accepts either)."""
    out = []
    for i, a in enumerate(arrays):
        spec = P() if i in replicated else P(AXIS)
        out.append(jax.make_array_from_process_local_data(NamedSharding(mesh, spec), np.asarray(a)))
    return out


def data_parallel_topk(mesh, topk: int, sorted: bool = False, shared_pool: bool = False, *, ids: str = "slots",
                       max_seq_len: int | None = None):
    """The jitted call over `mesh` for arguments made by ``global_arrays``: with a pool per process
    (default) a ``shard_map`` in which every device runs the op on its rows and its pool; with
    ``shared_pool`` the plain jit, the pool replicated (``global_arrays(..., replicated=(1,))``).
    ``ids`` and ``max_seq_len`` are the op's (static: a new bound is a new program)."""
    def local(q, k_cache, weights, seq_lens, block_table):
        return topk_indexer(q, k_cache, weights, seq_lens, block_table, topk=topk, sorted=sorted, ids=ids,
                            max_seq_len=max_seq_len)

    OP.attrs({"sorted": sorted, "ids": ids, "max_seq_len": max_seq_len})  # a bad value fails here, naming it
    if _strict_bool("shared_pool", shared_pool):
        return jax.jit(local)
    row = P(AXIS)
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(row,) * 5, out_specs=row))


def local_rows(array) -> np.ndarray:
    """The rows of a dim-0-sharded global array that this process holds, in order, as numpy."""
    shards = sorted(array.addressable_shards, key=lambda s: s.index[0].start or 0)
    return np.concatenate([np.asarray(s.data) for s in shards])


__all__ = ["AXIS", "initialize", "global_mesh", "global_arrays", "data_parallel_topk", "local_rows"]
