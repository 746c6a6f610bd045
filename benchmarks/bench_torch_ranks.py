"""Timing: one process per GPU (NCCL), each rank calling torch.ops.dsa.topk_indexer on its own rows.

    python benchmarks/bench_torch_ranks.py [--world-sizes 1,2,4] [--rows-per-rank 128]
        [--context 8192] [--queries 1,2] [--layers 61] [--fixed-batch 128] [--json PATH]
    python benchmarks/bench_torch_ranks.py --device cpu --world-sizes 1,2 --rows-per-rank 2 \\
        --context 512 --layers 2          # plumbing check on gloo ranks, no GPU

The data-parallel decode of benchmarks/torch_ranks.py: every rank owns its rows and their K cache
on ``cuda:<rank>`` and makes its calls with nothing from the other ranks. Each row is `--context`
tokens; ``--queries 1`` is the single-query op (q ``[B, H, 128]``), ``--queries 2`` two query
tokens per row (q ``[B, 2, H, 128]``). A decode step is `--layers` calls (61: DeepSeek-V3.2's
layers), each on its own input set (bench_gpu.rotating_sets, >= `--rotate-mb` of K cache per rank)
so that L2 is cold, as in a model whose layers each have their own cache. It is timed three ways:

  graph device   the step captured in one CUDA graph; CUDA events around each replay, enqueued
                 ahead of the GPU (bench_gpu.time_graph_replays): device time only
  graph step     host time from a replay to its torch.cuda.synchronize (graph launch included)
  eager step     the step's calls from Python, one torch.cuda.synchronize per step: a serving
                 loop without graphs, host time (the CPU has only this one)

A per-call figure is the median step over `--steps` divided by `--layers`; a world size's is its
slowest rank's. rows/s = the ranks' rows together / that per-call time; the speed-up is against
one rank with the same rows per rank (the bar: >= 0.9 x ranks). Every rank enters each timed
phase at a barrier, so concurrent GPUs are timed concurrently; `overlap` is the share of a
phase's span (first rank's start to last rank's end) in which every rank was timing.

``--fixed-batch B``: one batch of B rows split over the ranks (torch_ranks.rank_rows), beside one
GPU alone running the largest share (the op's own time at B / ranks rows) and one GPU with all B.

Each rank checks its first call against the float64 reference (ffi_dsa.check_topk, a few rows)
before timing it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import ffi_dsa  # noqa: F401

from bench_gpu import MB, Clock, capture_graphs, check_result, check_rows, rotating_sets, time_graph_replays
from ffi_dsa.contract import DEFAULT_TOPK, NUM_HEADS
from torch_ranks import barrier, rank_rows, spawn_ranks, start_rank

# timed phases, in the order every rank runs them; the CPU has no graphs
PHASES = {"graph_device": "graph device", "graph_step": "graph step", "eager_step": "eager step"}
BAR = 0.9  # of linear: the speed-up asked of N ranks is >= 0.9 x N


# --------------------------------------------------------------------------------- one rank
def step_calls(rot, layers: int, topk: int, step: int) -> list:
    """The calls of decode step `step`: layer l reads input set (step * layers + l) % sets."""
    def call(i):
        args = rot.set_args(i % rot.sets)
        return lambda: torch.ops.dsa.topk_indexer(*args, topk=topk)
    return [call(step * layers + layer) for layer in range(layers)]


def run_step(calls) -> list:
    return [call() for call in calls]


def check_first_call(rot, rows: int, o: dict, rank: int) -> None:
    """Timings of a wrong result are worthless: the first call, on a few rows, against the reference."""
    out = torch.ops.dsa.topk_indexer(*rot.set_args(0), topk=o["topk"])
    picked = check_rows(np.full(rows, o["context"]), o["check_tokens"])
    problems = check_result(out, rot.mega.rows(0, rows), picked)
    if problems:
        raise RuntimeError(f"rank {rank}: the op's result fails ffi_dsa.check_topk: " + "; ".join(problems[:3]))


def phase_result(step_seconds: list[float], layers: int, start: float, end: float) -> dict:
    return {"per_call_us": statistics.median(step_seconds) / layers * 1e6, "start": start, "end": end}


def time_graph(device, rot, o: dict) -> dict:
    """graph device and graph step (see the module docstring). Enough graphs to hold every input
    set once (one when the sets are fewer than the layers), replayed in turn."""
    layers, steps, warmup = o["layers"], o["steps"], o["warmup"]
    groups = math.ceil(rot.sets / layers)
    graphs = capture_graphs(lambda g: (lambda: run_step(step_calls(rot, layers, o["topk"], g))), groups,
                            pool=torch.cuda.graph_pool_handle())
    out = {}
    barrier(device)
    start = time.monotonic()
    seconds = time_graph_replays(Clock("cuda"), graphs, steps, warmup)
    out["graph_device"] = phase_result(seconds, layers, start, time.monotonic())
    barrier(device)
    start, seconds = time.monotonic(), []
    for i in range(steps):
        t0 = time.perf_counter()
        graphs[i % groups].replay()
        torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - t0)
    out["graph_step"] = phase_result(seconds, layers, start, time.monotonic())
    del graphs
    return out


def time_eager(device, rot, o: dict) -> dict:
    """eager step (see the module docstring): the calls are made before timing starts, so only
    the op calls and the synchronize are timed."""
    layers, steps, cuda = o["layers"], o["steps"], device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    for s in range(o["warmup"]):
        run_step(step_calls(rot, layers, o["topk"], s))
    sync()
    plan = [step_calls(rot, layers, o["topk"], s) for s in range(steps)]
    barrier(device)
    start, seconds = time.monotonic(), []
    for calls in plan:
        t0 = time.perf_counter()
        run_step(calls)
        sync()
        seconds.append(time.perf_counter() - t0)
    return {"eager_step": phase_result(seconds, layers, start, time.monotonic())}


def time_case(device, rank: int, world: int, queries: int, total_rows: int, o: dict) -> dict:
    """This rank's share of `total_rows` rows with `queries` queries each, timed every way its device has."""
    part = rank_rows(total_rows, rank, world)
    rows = part.stop - part.start
    rot = rotating_sets(np.full(rows, o["context"]), device, o["rotate_bytes"], seed=o["seed"] + 1009 * rank,
                        max_sets=o["max_sets"], queries=None if queries == 1 else queries, heads=o["heads"])
    check_first_call(rot, rows, o, rank)
    phases = time_graph(device, rot, o) if device.type == "cuda" else {}
    phases.update(time_eager(device, rot, o))
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    result = {"rank": rank, "world": world, "queries": queries, "rows_total": total_rows, "rows": rows,
              "sets": rot.sets, "rotation_mb": rot.cache_bytes / MB, "card": card, "phases": phases}
    del rot
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def bench_rank(rank: int, world: int, init_file: str, device_type: str, cases, o: dict, out_path: str) -> None:
    device = start_rank(rank, world, init_file, device_type)
    try:
        if device_type == "cpu":  # the ranks share the host's cores: one share each, not all each
            ffi_dsa.set_cpu_threads(max(1, (os.cpu_count() or 1) // world))
        results = [time_case(device, rank, world, queries, total, o) for queries, total in cases]
        gathered = [None] * world
        dist.all_gather_object(gathered, results)
        if rank == 0:
            Path(out_path).write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------ the tables
def plan_cases(worlds, queries, rows_per_rank: int, fixed_batch: int | None) -> dict[int, list]:
    """{world size: [(queries, total rows)]}: every world with `rows_per_rank` per rank and, with
    a fixed batch, its split; the one-rank world also runs the fixed batch whole and each split's
    largest share alone."""
    plan = {w: [] for w in worlds}

    def add(world, n, total):
        if (n, total) not in plan[world]:
            plan[world].append((n, total))

    for n in queries:
        for w in worlds:
            add(w, n, rows_per_rank * w)
        if fixed_batch:
            add(1, n, fixed_batch)
            for w in worlds:
                if w > 1:
                    add(w, n, fixed_batch)
                    add(1, n, math.ceil(fixed_batch / w))
    return plan


def summarize(ranks: list[dict]) -> dict:
    """One case over its ranks: the slowest rank's per-call time and the overlap, per phase."""
    phases = {}
    for name in ranks[0]["phases"]:
        each = [r["phases"][name] for r in ranks]
        span = max(p["end"] for p in each) - min(p["start"] for p in each)
        common = min(p["end"] for p in each) - max(p["start"] for p in each)
        phases[name] = {"per_call_us": max(p["per_call_us"] for p in each),
                        "per_call_us_ranks": [p["per_call_us"] for p in each],
                        "overlap": max(0.0, common) / span if span > 0 else 1.0}
    return {"ranks": len(ranks), "queries": ranks[0]["queries"], "rows_total": sum(r["rows"] for r in ranks),
            "rows_per_rank": max(r["rows"] for r in ranks), "phases": phases}


def scaling_rows(cases: dict, worlds, queries, rows_per_rank: int) -> list[dict]:
    """Rows/s and speed-up over world sizes, `rows_per_rank` rows on every rank; `cases` maps
    (world, queries, total rows) to summarize()'s result."""
    out = []
    for n in queries:
        base = cases[(1, n, rows_per_rank)]
        for w in worlds:
            s = cases[(w, n, rows_per_rank * w)]
            for name, phase in s["phases"].items():
                us, base_us = phase["per_call_us"], base["phases"][name]["per_call_us"]
                rows_per_s = s["rows_total"] / (us * 1e-6)
                speedup = rows_per_s / (base["rows_total"] / (base_us * 1e-6))
                out.append({"queries": n, "ranks": w, "rows_per_rank": rows_per_rank, "rows_total": s["rows_total"],
                            "metric": name, "per_call_us": us, "per_call_us_ranks": phase["per_call_us_ranks"],
                            "rows_per_s": rows_per_s, "speedup": speedup, "meets_bar": speedup >= BAR * w,
                            "overlap": phase["overlap"]})
    return out


def fixed_rows(cases: dict, worlds, queries, fixed_batch: int) -> list[dict]:
    """The fixed batch split over each world size beside one GPU running the largest share alone
    (`alone_us`) and one GPU running the whole batch (`whole_us`)."""
    out = []
    for n in queries:
        whole = cases[(1, n, fixed_batch)]
        for w in (w for w in worlds if w > 1):
            split, share = cases[(w, n, fixed_batch)], math.ceil(fixed_batch / w)
            alone = cases[(1, n, share)]
            for name, phase in split["phases"].items():
                us = phase["per_call_us"]
                alone_us, whole_us = alone["phases"][name]["per_call_us"], whole["phases"][name]["per_call_us"]
                out.append({"queries": n, "ranks": w, "rows_total": fixed_batch, "rows_per_rank": share,
                            "metric": name, "split_us": us, "per_call_us_ranks": phase["per_call_us_ranks"],
                            "alone_us": alone_us, "split_over_alone": us / alone_us, "whole_us": whole_us,
                            "speedup": whole_us / us, "overlap": phase["overlap"]})
    return out


def print_scaling(rows: list[dict]) -> None:
    print(f"\n{'N':>2} {'ranks':>5} {'rows/rank':>9} {'rows':>5}  {'timed':<12} {'us/call':>9} {'rows/s':>10} "
          f"{'speed-up':>8}  {'bar':<5} {'overlap':>7}")
    for r in rows:
        bar = "-" if r["ranks"] == 1 else ("ok" if r["meets_bar"] else "BELOW")
        print(f"{r['queries']:>2} {r['ranks']:>5} {r['rows_per_rank']:>9} {r['rows_total']:>5}  "
              f"{PHASES[r['metric']]:<12} {r['per_call_us']:9.1f} {r['rows_per_s']:10.0f} "
              f"{r['speedup']:7.2f}x  {bar:<5} {r['overlap']:7.2f}")


def print_fixed(rows: list[dict], fixed_batch: int) -> None:
    print(f"\nB = {fixed_batch} rows split over the ranks (us per call, slowest rank), beside one rank "
          f"alone at the largest share and one rank with all {fixed_batch} rows")
    print(f"{'N':>2} {'ranks':>5} {'rows/rank':>9}  {'timed':<12} {'split':>9} {'alone':>9} {'split/alone':>11} "
          f"{'1 rank, B':>9} {'speed-up':>8} {'overlap':>7}")
    for r in rows:
        print(f"{r['queries']:>2} {r['ranks']:>5} {r['rows_per_rank']:>9}  {PHASES[r['metric']]:<12} "
              f"{r['split_us']:9.1f} {r['alone_us']:9.1f} {r['split_over_alone']:11.2f} {r['whole_us']:9.1f} "
              f"{r['speedup']:7.2f}x {r['overlap']:7.2f}")


def runnable_worlds(requested, device_type: str, available: int) -> tuple[list[int], list[int]]:
    """(world sizes to run, those skipped: more ranks than GPUs). One rank always runs: it is the
    speed-ups' baseline."""
    worlds = sorted(set(requested) | {1})
    if device_type == "cpu":
        return worlds, []
    return [w for w in worlds if w <= available], [w for w in worlds if w > available]


def positive_list(parser, name: str, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        parser.error(f"{name} takes comma-separated integers, got {text!r}")
    if not values or min(values) < 1:
        parser.error(f"{name} takes integers >= 1, got {text!r}")
    return values


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cuda: NCCL, cpu: gloo")
    p.add_argument("--world-sizes", default="1,2,4", help="ranks per run, comma-separated (1 always runs)")
    p.add_argument("--rows-per-rank", type=int, default=128)
    p.add_argument("--context", type=int, default=8192, help="tokens per row")
    p.add_argument("--queries", default="1", help="query tokens per row, comma-separated (1: q [B, H, 128])")
    p.add_argument("--heads", type=int, default=NUM_HEADS, help="H, index heads")
    p.add_argument("--topk", type=int, default=DEFAULT_TOPK)
    p.add_argument("--layers", type=int, default=61, help="calls per decode step")
    p.add_argument("--steps", type=int, default=30, help="timed steps per phase")
    p.add_argument("--warmup", type=int, default=3, help="steps before each phase")
    p.add_argument("--fixed-batch", type=int, help="also split one batch of this many rows over the ranks")
    p.add_argument("--rotate-mb", type=int, help="K cache each rank's layers rotate over (default: 256 on "
                                                 "cuda, none on cpu)")
    p.add_argument("--max-sets", type=int, default=1024, help="cap on input sets per rank")
    p.add_argument("--check-tokens", type=int, default=16384, help="context tokens checked per rank and case")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="write the tables (and every rank's figures) here")
    a = p.parse_args(argv)
    a.world_sizes = positive_list(p, "--world-sizes", a.world_sizes)
    a.queries = positive_list(p, "--queries", a.queries)
    for name in ("rows_per_rank", "context", "layers", "steps", "max_sets"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.fixed_batch is not None and a.fixed_batch < max(a.world_sizes):
        p.error(f"--fixed-batch {a.fixed_batch} leaves a rank of --world-sizes {max(a.world_sizes)} without rows")
    if a.device == "cuda" and torch.cuda.device_count() == 0:
        p.error("--device cuda: torch sees no GPU (torch.cuda.device_count() is 0); --device cpu runs gloo ranks")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    available = torch.cuda.device_count() if a.device == "cuda" else 0
    worlds, skipped = runnable_worlds(a.world_sizes, a.device, available)
    for w in skipped:
        print(f"skipping {w} ranks: {available} GPU(s) here, one per rank needed", flush=True)
    rotate_mb = a.rotate_mb if a.rotate_mb is not None else (256 if a.device == "cuda" else 0)
    o = {"context": a.context, "layers": a.layers, "steps": a.steps, "warmup": a.warmup, "topk": a.topk,
         "heads": a.heads, "rotate_bytes": rotate_mb * MB, "max_sets": a.max_sets, "seed": a.seed,
         "check_tokens": a.check_tokens}
    plan = plan_cases(worlds, a.queries, a.rows_per_rank, a.fixed_batch)
    raw, cases = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for w in worlds:
            out = Path(tmp) / f"world{w}.json"
            print(f"{w} rank(s): {len(plan[w])} case(s) (N, rows over the ranks): {plan[w]}", flush=True)
            spawn_ranks(bench_rank, w, a.device, plan[w], o, str(out))
            raw[w] = json.loads(out.read_text())  # [rank][case]
            for i, (n, total) in enumerate(plan[w]):
                cases[(w, n, total)] = summarize([rank[i] for rank in raw[w]])
    first = raw[1][0][0]
    card = first["card"] + (f", {available} visible" if a.device == "cuda" else "")
    print(f"\n{card}: {a.context} tokens per row, K={a.topk}, H={a.heads}, {a.layers} calls per step, "
          f"median of {a.steps} steps; each rank's layers rotate over {first['sets']} input set(s), "
          f"{first['rotation_mb']:.0f} MB of K cache (at {first['rows']} rows)")
    scaling = scaling_rows(cases, worlds, a.queries, a.rows_per_rank)
    print_scaling(scaling)
    fixed = fixed_rows(cases, worlds, a.queries, a.fixed_batch) if a.fixed_batch else []
    if fixed:
        print_fixed(fixed, a.fixed_batch)
    if a.json:
        a.json.write_text(json.dumps({
            "card": first["card"], "device": a.device, "gpus_visible": available, "skipped_world_sizes": skipped,
            # the options that shape the measurement; not where this machine wrote its output
            "config": {k: v for k, v in vars(a).items() if k != "json"},
            "scaling": scaling, "fixed": fixed, "ranks": {str(w): r for w, r in raw.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
