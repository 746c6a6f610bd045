"""Timing: data-parallel decode steps with JAX on 1, 2, 4... devices, per call end to end and on the device.

    python benchmarks/bench_sharded_jax.py --platform gpu --devices 1,2,4
    XLA_FLAGS=--xla_force_host_platform_device_count=2 python benchmarks/bench_sharded_jax.py \\
        --platform cpu --devices 1,2 --rows 2 --context 512 --layers 2 --split-batch 4

The step is what a model's decode step does with the indexer: ``--layers`` calls in one jitted
program (straight-line, one per layer; each layer's weights depend on the previous layer's ids, so
XLA can neither merge nor reorder them), run once per step and waited for, as a serving loop waits
for its sampled tokens. Every device owns its rows and its own page pool (``jax.shard_map``, the
data-parallel layout: no collective), and the layers rotate over pools of at least 256 MB per
device in all (``--pools``), so every layer reads its cache from HBM as a model's layers do.

Two tables:
* ``--rows`` rows per device (default 128 x ``--context`` 8192 tokens) on 1, 2, 4 devices: the
  rows per second of all devices against one device's (ideal: x devices).
* ``--split-batch`` rows (default 128) split over 2, 4 devices, beside one device running only its
  share (B / devices rows): the split's overhead told apart from a smaller batch's kernel efficiency.

Per call: the step's wall time / layers ("end to end"), and from a profiler trace of some steps the
device's time ("device": first to last kernel of a step, all kernels of the step, / layers) and the
op's own kernels ("op": ffi_dsa kernels only, / layers); the slowest device of each is reported.
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ffi_dsa.contract import DEFAULT_TOPK, PAGE_BYTES, PAGE_TOKENS
from ffi_dsa import topk_indexer
from ffi_dsa.workloads import make_batch

OP_KERNELS = "ffi_dsa::"
COLD_BYTES = 256 << 20


def device_pools(rows: int, context: int, queries: int, devices: int, pools: int, seed: int = 0):
    """For each pool: (q, k_cache, weights, seq_lens, block_table) of all devices concatenated along
    dim 0, each device's part a batch of `rows` rows with page ids into its own pages."""
    out = []
    for p in range(pools):
        parts = [make_batch(np.full(rows, context), seed=seed + 97 * p + d, queries=queries if queries > 1 else None)
                 for d in range(devices)]
        out.append(tuple(np.concatenate([getattr(b, f) for b in parts])
                         for f in ("q", "k_cache", "weights", "seq_lens", "block_table")))
    return out


def pools_for_cold_l2(rows: int, context: int, layers: int) -> int:
    """Pools enough that a step's layers read >= 256 MB of cache per device before one repeats
    (an H200's L2 is 60 MB), at most one per layer."""
    pool_bytes = rows * -(-context // PAGE_TOKENS) * PAGE_BYTES
    return max(1, min(layers, -(-COLD_BYTES // pool_bytes)))


def step_fn(mesh, layers: int, pools: int, topk: int):
    """The jitted decode step over `mesh`: `layers` calls, layer l on pool l % pools."""
    def local_step(*flat):
        ids = None
        for layer in range(layers):
            q, k, w, s, t = flat[5 * (layer % pools):5 * (layer % pools) + 5]
            if ids is not None:  # a row's weights change only if its first id is -7 (never): same work
                w = w + (ids.reshape(ids.shape[0], -1)[:, :1] == -7).astype(w.dtype).reshape(
                    (-1,) + (1,) * (w.ndim - 1))
            ids = topk_indexer(q, k, w, s, t, topk=topk)
        return ids

    spec = P("dp")
    return jax.jit(jax.shard_map(local_step, mesh=mesh, in_specs=(spec,) * (5 * pools), out_specs=spec))


def place(mesh, pools):
    sharding = NamedSharding(mesh, P("dp"))
    flat = []
    for pool in pools:
        q, k, w, s, t = pool
        flat += [jax.device_put(jnp.asarray(q).view(jnp.float8_e4m3fn), sharding)] + \
                [jax.device_put(jnp.asarray(x), sharding) for x in (k, w, s, t)]
    return flat


def wall_per_step(fn, args, steps: int) -> float:
    fn(*args).block_until_ready()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn(*args).block_until_ready()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def traced_planes(fn, args, steps: int) -> list:
    """The planes (host and devices) of a profiler trace of `steps` steps, after one untraced step."""
    from jax.profiler import ProfileData

    fn(*args).block_until_ready()
    with tempfile.TemporaryDirectory(prefix="ffi_dsa_trace_") as folder:
        with jax.profiler.trace(folder):
            for _ in range(steps):
                fn(*args).block_until_ready()
        paths = glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)
        return list(ProfileData.from_file(paths[0]).planes) if paths else []


def device_time(fn, args, steps: int, layers: int) -> tuple[float, float] | None:
    """(device busy per step, op kernels per step) in seconds, the slowest device's median over
    `steps` traced steps; None when the trace has no device planes (the CPU platform)."""
    busy, ops = [], []
    for plane in traced_planes(fn, args, steps):
        if not plane.name.startswith("/device:GPU"):
            continue
        kernels = sorted((e.start_ns, e.duration_ns, OP_KERNELS in e.name) for line in list(plane.lines)
                         for e in line.events if not e.name.startswith("Memcpy"))
        op = [k for k in kernels if k[2]]
        if len(op) < steps * layers:
            continue
        per_step_busy, per_step_op = [], []
        for s in range(steps):  # a step is `layers` consecutive op calls and whatever lies between
            first, last = op[s * layers], op[(s + 1) * layers - 1]
            inside = [k for k in kernels if first[0] <= k[0] <= last[0]]
            per_step_busy.append((last[0] + last[1] - first[0]) * 1e-9)
            per_step_op.append(sum(k[1] for k in inside if k[2]) * 1e-9)
        busy.append(statistics.median(per_step_busy))
        ops.append(statistics.median(per_step_op))
    return (max(busy), max(ops)) if busy else None


def timeline(fn, args) -> None:
    """Where one step's time goes, from a profiler trace: per device, the wait from the step's
    dispatch to its first kernel, the gaps between kernels, the tail after the last one; and the
    host's busiest events. For finding overhead, not for the tables."""
    planes = traced_planes(fn, args, 1)
    host = [(e.start_ns, e.duration_ns, e.name, line.name) for p in planes if p.name == "/host:CPU"
            for line in p.lines for e in line.events]
    dispatch = min((h for h in host if h[2].startswith("PjitFunction")), default=None)
    t0 = dispatch[0] if dispatch else min(h[0] for h in host)
    end = dispatch[0] + dispatch[1] if dispatch else t0
    print(f"    step dispatched at 0, PjitFunction returned at {(end - t0) / 1e3:.0f} us; "
          f"'command_buffer' in the compiled HLO: {fn.lower(*args).compile().as_text().count('command_buffer')}")
    for p in planes:
        if not p.name.startswith("/device:GPU"):
            continue
        k = sorted((e.start_ns, e.duration_ns) for line in p.lines for e in line.events)
        if not k:  # a device of the machine this configuration does not use
            continue
        gaps = sorted(((b[0] - a[0] - a[1]) / 1e3, i) for i, (a, b) in enumerate(zip(k, k[1:])))
        print(f"    {p.name}: first kernel at {(k[0][0] - t0) / 1e3:.0f} us, last ends at "
              f"{(k[-1][0] + k[-1][1] - t0) / 1e3:.0f} us; {len(k)} kernels, gaps sum "
              f"{sum(g for g, _ in gaps if g > 0):.0f} us, largest {[(round(g), i) for g, i in gaps[-4:]]}")
    totals = {}
    for start, dur, name, _ in host:
        key = name.split("(")[0][:60]
        n, t = totals.get(key, (0, 0))
        totals[key] = (n + 1, t + dur / 1e3)
    for name, (n, t) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:14]:
        print(f"    host {n:5d} x {t / n:8.1f} us = {t:8.0f} us  {name}")


def measure(devices, rows: int, args) -> dict:
    """One configuration: `rows` rows on each of `devices`."""
    mesh = Mesh(np.array(devices), ("dp",))
    count = args.pools or pools_for_cold_l2(rows, args.context, args.layers)
    pools = device_pools(rows, args.context, args.queries, len(devices), count)
    placed = place(mesh, pools)
    fn = step_fn(mesh, args.layers, count, args.topk)
    step = wall_per_step(fn, placed, args.steps)
    dev = device_time(fn, placed, args.trace_steps, args.layers)
    if args.timeline:
        print(f"  timeline: {len(devices)} device(s) x {rows} rows")
        timeline(fn, placed)
    result = {"devices": len(devices), "rows_per_device": rows, "rows": rows * len(devices),
              "e2e_us": step / args.layers * 1e6}
    if dev is not None:
        result["device_us"], result["op_us"] = (t / args.layers * 1e6 for t in dev)
    result["rows_per_s"] = result["rows"] / (result["e2e_us"] * 1e-6)
    return result


def fmt(r: dict, base: dict | None) -> str:
    dev = (f"{r['device_us']:8.1f} {r['op_us']:8.1f}" if "device_us" in r else f"{'-':>8} {'-':>8}")
    speed = f"x{r['rows_per_s'] / base['rows_per_s']:.2f}" if base else ""
    return (f"  {r['devices']:>3} {r['rows_per_device']:>5} {r['rows']:>5} {r['e2e_us']:9.1f} {dev} "
            f"{r['rows_per_s']:12.0f} {speed:>7}")


HEADER = f"  {'dev':>3} {'rows/':>5} {'rows':>5} {'e2e us':>9} {'dev us':>8} {'op us':>8} {'rows/s':>12} {'vs 1':>7}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", default=None, help="cpu or gpu (default: JAX's default backend)")
    parser.add_argument("--devices", default="1,2,4", help="device counts, comma-separated (skipped if absent)")
    parser.add_argument("--rows", type=int, default=128, help="rows per device (data-parallel table)")
    parser.add_argument("--split-batch", type=int, default=128, help="rows split over the devices (0: no table)")
    parser.add_argument("--context", type=int, default=8192, help="tokens per row")
    parser.add_argument("--queries", type=int, default=1, help="query tokens per row (N)")
    parser.add_argument("--topk", type=int, default=DEFAULT_TOPK)
    parser.add_argument("--layers", type=int, default=61, help="calls per step (DeepSeek-V3.2 has 61 layers)")
    parser.add_argument("--pools", type=int, default=0,
                        help="page pools per device the layers rotate over (0: enough for 256 MB of cache)")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--trace-steps", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the tables here")
    parser.add_argument("--timeline", action="store_true", help="print where each configuration's step time goes")
    args = parser.parse_args(argv)
    available = jax.devices(args.platform)
    counts = [n for n in (int(c) for c in args.devices.split(",")) if n <= len(available)]
    print(f"{available[0].device_kind} x {len(available)}; {args.context} tokens per row, N = {args.queries}, "
          f"K = {args.topk}, {args.layers} calls per step, per call:")
    # the options that shape the measurement; not where this machine writes its output
    options = {k: v for k, v in vars(args).items() if k != "json"}
    report = {"card": available[0].device_kind, "args": options, "data_parallel": [], "split": []}
    print(f"data parallel, {args.rows} rows per device\n{HEADER}")
    for n in counts:
        r = measure(available[:n], args.rows, args)
        report["data_parallel"].append(r)
        print(fmt(r, report["data_parallel"][0]))
    if args.split_batch:
        print(f"one batch of {args.split_batch} rows split over the devices, beside one device with its share\n{HEADER}")
        for n in (c for c in counts if c > 1 and args.split_batch % c == 0):
            split = measure(available[:n], args.split_batch // n, args)
            alone = measure(available[:1], args.split_batch // n, args)
            report["split"] += [split, alone]
            print(fmt(split, None) + "  split")
            print(fmt(alone, None) + "  its share on 1 device")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
