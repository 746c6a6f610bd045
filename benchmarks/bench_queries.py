"""GPU benchmark of several query tokens per row (MTP) and of 32 index heads (docs/contract.md §7).

    python benchmarks/bench_queries.py [--workloads W1,W5] [--json PATH]

For each workload (bench_gpu's W1..W6 lengths) one set of inputs with 4 queries per row is made and
cut into the calls compared, all over the same K cache and block tables:

  N1          the row's last query alone (rank-3 q): the single-query op
  N2          the last two queries in one call (q [B, 2, 64, 128], seq_lens [B]: causal offsets)
  N1x2        the same two queries as two single-query calls, one after the other (what a caller
              without the N-query op does: the second call re-reads the pages, from L2 when they
              still fit there)
  N4          all four queries in one call
  H32         the last query's first 32 heads (q [B, 32, 128]), N = 1
  H32N2       the last two queries' first 32 heads

Every time is bench_gpu's in-graph method: 16 consecutive calls (each on its own input set, the
sets rotated over >= 256 MB of K cache, so L2-cold) captured in one CUDA graph, the median replay
divided by 16. Each variant's output is checked once with ffi_dsa.check_topk on a row subset.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import zlib
from pathlib import Path

import torch  # noqa: E402

import ffi_dsa  # noqa: E402
from bench_gpu import (  # noqa: E402
    MB, Clock, check_result, check_rows, copy_bandwidth, in_graph_us, rotating_sets, workloads)
from gpu_batches import TorchBatch  # noqa: E402
from ffi_dsa.contract import DEFAULT_TOPK as TOPK  # noqa: E402
from ffi_dsa.contract import NUM_HEADS_NARROW  # noqa: E402

MADE_QUERIES = 4
# variant -> (queries taken from the end of the row's four, heads, calls: one call of N queries or N calls of one)
VARIANTS = {
    "N1": (1, None, "one"),
    "N2": (2, None, "one"),
    "N1x2": (2, None, "each"),
    "N4": (4, None, "one"),
    "H32": (1, NUM_HEADS_NARROW, "one"),
    "H32N2": (2, NUM_HEADS_NARROW, "one"),
}


def calls_of(variant: str, batch: TorchBatch) -> list[tuple[TorchBatch, torch.Tensor]]:
    """The (inputs, poisoned output) of each call `variant` makes on `batch` (made with 4 queries)."""
    queries, heads, mode = VARIANTS[variant]
    q, k, w, lens, table = batch.args()
    heads = heads or q.shape[2]
    first = MADE_QUERIES - queries
    if mode == "one" and queries == 1:  # the rank-3 form: the row's last query sees the whole row
        parts = [(q[:, -1, :heads], w[:, -1, :heads], lens)]
    elif mode == "one":  # the row's last `queries` tokens: seq_lens [B] gives them their causal prefixes
        parts = [(q[:, first:, :heads], w[:, first:, :heads], lens)]
    else:  # one single-query call per query, each with its own prefix length
        parts = [(q[:, j, :heads], w[:, j, :heads], lens - (MADE_QUERIES - 1 - j)) for j in range(first, MADE_QUERIES)]
    out = []
    for qq, ww, ll in parts:
        sub = TorchBatch(qq.contiguous(), k, ww.contiguous(), ll.clamp(min=0).to(torch.int32).contiguous(), table)
        out.append((sub, torch.full(sub.output_shape(TOPK), -7, dtype=torch.int32, device=q.device)))
    return out


def run_workload(name: str, spec: dict, a, clock: Clock) -> dict:
    lens = spec["lens"]
    rot = rotating_sets(lens, "cuda", a.rotate_mb * MB, seed=a.seed + zlib.crc32(name.encode()) % 1000,
                        max_sets=a.max_sets, max_pages=spec.get("table_pages"), queries=MADE_QUERIES)
    batch, sets = rot.batch, rot.sets
    set_batches = [rot.mega.rows(i * batch, (i + 1) * batch) for i in range(sets)]  # one shared cache
    r = {"name": name, "desc": spec["desc"], "batch": batch, "tokens": int(lens.sum()), "sets": sets, "us": {},
         "check": {}}
    print(f"  {name} ({spec['desc']}): {sets} input sets", flush=True)
    rows = check_rows(lens, a.check_tokens)
    for variant in a.variants:
        per_set = [calls_of(variant, sb) for sb in set_batches]
        problems = []
        for sub, out in per_set[0]:  # correctness of set 0, each call
            ffi_dsa.call(*sub.args(), out)
            clock.sync()
            problems += check_result(out, sub, rows)
        r["check"][variant] = "PASS" if not problems else f"FAIL: {problems[0]}"
        def make_call(i, per_set=per_set):  # set i's calls of the variant
            return lambda: [ffi_dsa.call(*sub.args(), out) for sub, out in per_set[i]]

        r["us"][variant], _ = in_graph_us(clock, make_call, sets, a.calls_per_graph, a.replays, a.warmup)
        print(f"    {variant:<9} {r['us'][variant]:8.2f} us in graph, check {r['check'][variant]}", flush=True)
        del per_set
        gc.collect()
    del set_batches, rot
    gc.collect()
    torch.cuda.empty_cache()
    return r


def print_table(results: list[dict], variants: list[str]) -> None:
    print("\nin-graph us per call (16 calls per graph, L2-cold); ratios to N1 in brackets")
    print(f"{'wl':<4}" + "".join(f"{v:>18}" for v in variants))
    for r in results:
        base = r["us"].get("N1")
        cells = []
        for v in variants:
            t = r["us"].get(v)
            ratio = f" ({t / base:.2f}x)" if base and t and v != "N1" else ""
            cells.append(f"{t:.2f}{ratio}" if t else "-")
        print(f"{r['name']:<4}" + "".join(f"{c:>18}" for c in cells))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bench_queries", description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="W1,W2,W3,W4,W5,W6")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {list(VARIANTS)}")
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--calls-per-graph", type=int, default=16)
    parser.add_argument("--rotate-mb", type=int, default=256)
    parser.add_argument("--max-sets", type=int, default=512)
    parser.add_argument("--check-tokens", type=int, default=150_000)
    parser.add_argument("--seed", type=int, default=4321)
    parser.add_argument("--json", type=Path, default=None)
    a = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_queries: needs a CUDA device", file=sys.stderr)
        return 2
    a.variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    unknown = [v for v in a.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    all_w = workloads()
    names = [n.strip() for n in a.workloads.split(",") if n.strip()]
    clock = Clock("cuda")
    props = torch.cuda.get_device_properties(0)
    bandwidth = copy_bandwidth("cuda", 1024 * MB)
    print(f"bench_queries: {props.name}, copy {bandwidth / 1e12:.3f} TB/s", flush=True)
    results = []
    start = time.perf_counter()
    for name in names:
        results.append(run_workload(name, all_w[name], a, clock))
    print(f"  done in {time.perf_counter() - start:.0f} s")
    print_table(results, a.variants)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"device": props.name, "copy_bandwidth_Bps": bandwidth, "results": results},
                                     indent=1))
        print(f"wrote {a.json}")
    failed = [(r["name"], v) for r in results for v, c in r["check"].items() if c != "PASS"]
    if failed:
        print(f"bench_queries: checks FAILED: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
