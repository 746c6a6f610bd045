"""Timing: data-parallel decode steps with JAX, one process per GPU under ``jax.distributed``.

    python benchmarks/bench_jax_processes.py --platform gpu --processes 1,2
    python benchmarks/bench_jax_processes.py --platform cpu --processes 1,2 --rows 2 \\
        --context 512 --layers 2 --steps 3 --trace-steps 0        # plumbing check, no GPU

The step of ``bench_sharded_jax`` (``--layers`` calls in one jit, layers rotating over page pools of
>= 256 MB per GPU so every layer reads its cache from HBM, run once per step and waited for), but the
mesh spans N processes (``jax_distributed.global_mesh``), each holding one GPU, its ``--rows`` rows
(default 128 x ``--context`` 8192 tokens) and its own pools. For each N this launches N processes
(``jax_processes.launch``); each checks its first step's ids against the float64 reference (a few
rows), waits for the others at a barrier, then times its steps. Per call: the step's wall time /
layers ("end to end") and, from a profiler trace, the device's time and the op's kernels (as in
bench_sharded_jax); a process count's figure is its slowest process's. rows/s = all processes' rows
/ that time; "vs 1" is against one process (ideal: x N). Compare with the one-process mesh of
``bench_sharded_jax --devices 1,2`` on the same machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax_processes

SCRIPT = str(Path(__file__).resolve())  # what each launched process runs: this file
# what a worker prints before its JSON line, so the parent finds the line among JAX's output
RESULT_PREFIX = "bench_jax_processes result: "


def worker(args) -> int:
    """One process: set up, check, wait for the others, time; prints its result line."""
    import ml_dtypes

    from ffi_dsa import jax_distributed as jd

    jd.initialize(args.process_id, args.processes, args.coordinator, args.platform)
    import jax
    from jax.experimental import multihost_utils

    import ffi_dsa

    from bench_sharded_jax import device_pools, device_time, pools_for_cold_l2, step_fn, wall_per_step

    mesh = jd.global_mesh()
    count = args.pools or pools_for_cold_l2(args.rows, args.context, args.layers)
    pools = device_pools(args.rows, args.context, args.queries, 1, count, seed=args.seed + 1000 * args.process_id)
    arrays = []
    for q, *rest in pools:
        arrays += jd.global_arrays(mesh, (q.view(ml_dtypes.float8_e4m3fn), *rest))
    fn = step_fn(mesh, args.layers, count, args.topk)
    ids = jd.local_rows(fn(*arrays))
    q, k_cache, weights, seq_lens, block_table = pools[(args.layers - 1) % count]  # the step's last layer
    few = slice(0, min(4, args.rows))
    problems = ffi_dsa.check_topk(ids[few], q[few], k_cache, weights[few], seq_lens[few], block_table[few])
    if problems:
        print(f"process {args.process_id}: wrong ids, not timed: {problems[:3]}", flush=True)
        return 1
    multihost_utils.sync_global_devices("bench_jax_processes: timed steps")
    step = wall_per_step(fn, arrays, args.steps)
    dev = device_time(fn, arrays, args.trace_steps, args.layers) if args.trace_steps else None
    result = {"process": args.process_id, "processes": args.processes, "rows": args.rows,
              "card": jax.local_devices()[0].device_kind, "e2e_us": step / args.layers * 1e6}
    if dev is not None:
        result["device_us"], result["op_us"] = (t / args.layers * 1e6 for t in dev)
    multihost_utils.sync_global_devices("bench_jax_processes: done")
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    jax.distributed.shutdown()
    return 0


def summarize(processes: int, results: list[dict]) -> dict:
    """A process count's row: its slowest process's times, all processes' rows per second."""
    slowest = max(results, key=lambda r: r["e2e_us"])
    row = {"processes": processes, "rows_per_process": slowest["rows"], "rows": sum(r["rows"] for r in results),
           "card": slowest["card"], "e2e_us": slowest["e2e_us"]}
    for key in ("device_us", "op_us"):
        if all(key in r for r in results):
            row[key] = max(r[key] for r in results)
    row["rows_per_s"] = row["rows"] / (row["e2e_us"] * 1e-6)
    return row


HEADER = f"  {'procs':>5} {'rows/':>5} {'rows':>5} {'e2e us':>9} {'dev us':>8} {'op us':>8} {'rows/s':>12} {'vs 1':>7}"


def fmt(r: dict, base: dict | None) -> str:
    dev = " ".join(f"{r[k]:8.1f}" if k in r else f"{'-':>8}" for k in ("device_us", "op_us"))
    speed = f"x{r['rows_per_s'] / base['rows_per_s']:.2f}" if base else ""
    return (f"  {r['processes']:>5} {r['rows_per_process']:>5} {r['rows']:>5} {r['e2e_us']:9.1f} {dev} "
            f"{r['rows_per_s']:12.0f} {speed:>7}")


def parent(args, passthrough: list[str]) -> int:
    table = []
    print(f"{args.context} tokens per row, {args.rows} rows per process, N = {args.queries} queries, "
          f"K = {args.topk}, {args.layers} calls per step, one {args.platform} device per process, per call:")
    print(HEADER, flush=True)
    for n in (int(c) for c in args.processes.split(",")):
        finished = jax_processes.launch(n, SCRIPT, passthrough, args.platform, args.timeout, echo=args.verbose)
        bad = jax_processes.failures(finished)
        if bad:
            for f in finished:
                print("\n".join(f"  [{f.process_id}] {line}" for line in f.lines[-15:]))
            print(f"  {n} processes failed: {'; '.join(bad)}")
            return 1
        results = [json.loads(line[len(RESULT_PREFIX):]) for f in finished for line in f.lines
                   if line.startswith(RESULT_PREFIX)]
        table.append(summarize(n, results))
        print(fmt(table[-1], table[0] if len(table) > 1 else None), flush=True)
    if table:
        print(f"  ({table[0]['card']})")
    if args.json:
        with open(args.json, "w") as f:
            options = {k: v for k, v in vars(args).items() if k not in ("process_id", "coordinator")}
            json.dump({"args": options, "table": table}, f, indent=1)
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", default="1,2", help="process counts, comma-separated (parent)")
    parser.add_argument("--platform", default="gpu", choices=("cpu", "gpu"))
    parser.add_argument("--rows", type=int, default=128, help="rows per process")
    parser.add_argument("--context", type=int, default=8192, help="tokens per row")
    parser.add_argument("--queries", type=int, default=1, help="query tokens per row (N)")
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=61, help="calls per step (DeepSeek-V3.2 has 61 layers)")
    parser.add_argument("--pools", type=int, default=0, help="page pools per process (0: enough for 256 MB)")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--trace-steps", type=int, default=3, help="profiled steps for device time (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for each launch")
    parser.add_argument("--json", default=None, help="write the table here (parent)")
    parser.add_argument("--verbose", action="store_true", help="echo the processes' output (parent)")
    # set by jax_processes.launch for each process
    parser.add_argument("--process-id", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--coordinator", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.process_id is not None:
        args.processes = int(args.processes)
        return worker(args)
    # what every process needs of the command line (launch adds --process-id, --processes,
    # --coordinator and --platform)
    passthrough = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
                   ("rows", "context", "queries", "topk", "layers", "pools", "steps", "trace_steps", "seed")]
    start = time.perf_counter()
    rc = parent(args, passthrough)
    print(f"  ({time.perf_counter() - start:.0f} s)")
    return rc


if __name__ == "__main__":
    sys.exit(main())
