"""Timing: the jitted call with the batch split over N devices against the whole batch on one.

    python -m ffi_dsa.integration.bench_sharded_jax --platform gpu --devices 2 --batch 128 --context 8192
    XLA_FLAGS=--xla_force_host_platform_device_count=2 python -m ffi_dsa.integration.bench_sharded_jax

Each layout runs ``--calls`` calls in one jitted loop (each call's weights depend on the previous
call's ids, row by row, so XLA can neither hoist nor merge them, and host dispatch is paid once per
loop, not per call), repeated ``--repeats`` times; the median per-call time is reported with the
rows per second and the compiled HLO's collectives (there should be none). The cache is replicated on every device
(the data-parallel layout) and the batch is one ``--context`` long row per request; the rows'
bytes are random fp8 values (no NaN encodings) with unit scales: the data does not change the
kernel's work, only the lengths do. With rows that are bandwidth-bound on each device, N devices
should give close to N times the rows per second.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ffi_dsa.contract import DEFAULT_TOPK
from ffi_dsa.integration.jax_ffi import topk_indexer
from ffi_dsa.workloads import make_batch
COLLECTIVE = re.compile(r"\b(all-gather|all-to-all|collective-permute|all-reduce|reduce-scatter)\b")


def decode_batch(batch: int, context: int, seed: int = 0):
    """`batch` rows of `context` tokens (ffi_dsa.workloads.make_batch), as JAX arrays."""
    b = make_batch(np.full(batch, context), seed=seed)
    return (jnp.asarray(b.q).view(jnp.float8_e4m3fn), jnp.asarray(b.k_cache), jnp.asarray(b.weights),
            jnp.asarray(b.seq_lens), jnp.asarray(b.block_table))


def time_layout(devices, args, topk: int, calls: int, repeats: int) -> tuple[float, list[str]]:
    """Median seconds per call with the batch split over `devices`, and the HLO's collectives."""
    mesh = Mesh(np.array(devices), ("dp",))
    specs = [P("dp"), P(), P("dp"), P("dp"), P("dp")]
    placed = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, specs)]

    @jax.jit
    def loop(q, k_cache, weights, seq_lens, block_table):
        def body(_, ids):  # a row's weights change only if its first id is -7 (never): same work
            w = weights + (ids[:, :1] == -7).astype(weights.dtype)
            return topk_indexer(q, k_cache, w, seq_lens, block_table, topk=topk)
        return jax.lax.fori_loop(0, calls, body, jnp.zeros((q.shape[0], topk), jnp.int32))

    found = COLLECTIVE.findall(loop.lower(*placed).compile().as_text())
    loop(*placed).block_until_ready()
    per_call = []
    for _ in range(repeats):
        start = time.perf_counter()
        loop(*placed).block_until_ready()
        per_call.append((time.perf_counter() - start) / calls)
    return statistics.median(per_call), found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", default=None, help="cpu or gpu (default: JAX's default backend)")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8, help="rows; must divide by --devices")
    parser.add_argument("--context", type=int, default=2048, help="tokens per row")
    parser.add_argument("--topk", type=int, default=DEFAULT_TOPK)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    devices = jax.devices(args.platform)
    if len(devices) < args.devices or args.batch % args.devices:
        parser.error(f"need {args.devices} devices (found {len(devices)}) and a batch that divides by them")
    batch = decode_batch(args.batch, args.context)
    one, found_one = time_layout(devices[:1], batch, args.topk, args.calls, args.repeats)
    many, found_many = time_layout(devices[:args.devices], batch, args.topk, args.calls, args.repeats)
    kind = devices[0].device_kind
    print(f"B={args.batch} x {args.context} tokens, K={args.topk}, {kind}")
    for n, sec, found in ((1, one, found_one), (args.devices, many, found_many)):
        print(f"  {n} device(s): {sec * 1e6:9.1f} us per call, {args.batch / sec:10.0f} rows/s, "
              f"collectives: {found or 'none'}")
    print(f"  speed-up x{one / many:.2f} on {args.devices} devices")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
