"""CPU benchmark: ffi_dsa vs the naive torch version, side by side in one process.

    python benchmarks/bench_cpu.py [--batch 16 --tokens 8192 --queries N --heads H --runs 10 --warmup 2
                                    --kernels all --json PATH]
    python -m ffi_dsa bench --device cpu [same options]

Both run on the same 16 x 8K-token batch (ffi_dsa.workloads.make_batch, fixed seed; --queries N gives
each row N query tokens, the row's last N, and --heads 32 the narrow indexer), each timed
as the median of N calls after warm-up with time.perf_counter (interleaved: one call of each
version per round, so background load hits them alike), and both outputs are checked with
ffi_dsa.check_topk under the contract's tolerance (docs/contract.md) (the naive output is ordered by score: sorted=True).
ffi_dsa is timed with numpy inputs and, when torch is importable, with torch CPU tensors too.
--kernels times the numpy version once per CPU scoring variant (ffi_dsa.set_cpu_kernel before each
call, outside the timed region), each labelled with the variant it ran; the default is the one
"auto" picks. The MXFP4 op (ffi_dsa.mxfp4_call, docs/contract.md §9) is timed beside it on an MXFP4
batch of the same rows, lengths, N and H (ffi_dsa.mxfp4_workloads, same seed), once per variant
timed, checked with ffi_dsa.check_mxfp4_topk, and its time is printed as a ratio to the FP8 op's of
the same variant (--no-mxfp4 leaves it out). The load average before and after is printed (other
processes on a 2-core machine change every number).
Exit code: 1 when a check fails, 2 when --min-speedup is given and not met, else 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import ffi_dsa  # noqa: E402
from ffi_dsa.contract import DEFAULT_TOPK as TOPK  # noqa: E402
from ffi_dsa.contract import NUM_HEADS, SUPPORTED_HEADS  # noqa: E402
from ffi_dsa.demo import cpu_name  # noqa: E402
from ffi_dsa.mxfp4_workloads import make_mxfp4_batch  # noqa: E402
from ffi_dsa.workloads import make_batch  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bench_cpu", description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16, help="rows (default 16)")
    parser.add_argument("--tokens", type=int, default=8192, help="context tokens per row (default 8192)")
    parser.add_argument("--queries", type=int, default=None,
                        help="N query tokens per row: q [B, N, H, 128] (default: the rank-3 q of one query)")
    parser.add_argument("--heads", type=int, default=NUM_HEADS, choices=SUPPORTED_HEADS,
                        help=f"index heads H (default {NUM_HEADS})")
    parser.add_argument("--runs", type=int, default=10, help="timed calls per version (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls first (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch.set_num_threads for the naive version (default: torch's own choice)")
    parser.add_argument("--no-naive", action="store_true", help="time ffi_dsa only")
    parser.add_argument("--no-mxfp4", action="store_true", help="leave out the MXFP4 op's rows")
    parser.add_argument("--kernels", default="auto",
                        help="CPU scoring variants to time, comma-separated, or 'all' (default: auto)")
    parser.add_argument("--min-speedup", type=float, default=None,
                        help="exit 2 unless ffi_dsa (numpy inputs, auto variant) beats naive torch by this factor")
    parser.add_argument("--json", type=Path, default=None, help="write the numbers here")
    a = parser.parse_args(argv)

    lens = np.full(a.batch, a.tokens, dtype=np.int32)
    t0 = time.perf_counter()
    batch = make_batch(lens, seed=a.seed, queries=a.queries, heads=a.heads)
    mxfp4_batch = None if a.no_mxfp4 else make_mxfp4_batch(lens, seed=a.seed, queries=a.queries, heads=a.heads)
    gen_s = time.perf_counter() - t0
    tokens = batch.tokens
    machine = f"{os.cpu_count()} cores, {cpu_name()}, Python {platform.python_version()}"
    kernels = _kernels(a.kernels)
    load_before = os.getloadavg()
    shape = f"N={a.queries or 1} queries per row, H={a.heads}"
    print(f"bench_cpu: B={a.batch} x {a.tokens} tokens = {tokens} tokens, {shape}, K={TOPK}; {machine}")
    print(f"  CPU variants offered: {', '.join(ffi_dsa.cpu_kernels())} (auto = {ffi_dsa.cpu_kernel()}); "
          f"load average {_load(load_before)}")
    print(f"  batch generated in {gen_s:.1f} s; timing = median of {a.runs} calls after {a.warmup} warm-up "
          f"(time.perf_counter, versions interleaved)")

    results: dict[str, dict] = {}
    failed = False

    def record(name: str, times: list[float], out, sorted_check: bool) -> None:
        nonlocal failed
        if name in mxfp4_names:
            problems = ffi_dsa.check_mxfp4_topk(out, *mxfp4_batch.args(), sorted=sorted_check)
        else:
            problems = ffi_dsa.check_topk(out, *batch.args(), sorted=sorted_check)
        failed |= bool(problems)
        med = statistics.median(times)
        results[name] = {
            "median_us": med * 1e6, "min_us": min(times) * 1e6, "max_us": max(times) * 1e6,
            "tokens_per_s": tokens / med, "check": "PASS" if not problems else "FAIL",
            "problems": problems[:3],
        }

    # The versions are timed interleaved (one call of each per round), so that load from other
    # processes on a small machine hits all of them alike and the ratio stays meaningful.
    # name -> (setup outside the timed region, timed call, its output, check sorted by score?)
    args_np = batch.args()
    versions = {}
    auto = ffi_dsa.cpu_kernel()
    for kernel in kernels:
        out_k = np.full(batch.output_shape(TOPK), -7, dtype=np.int32)
        versions[_numpy_version(kernel, auto)] = (lambda k=kernel: ffi_dsa.set_cpu_kernel(k),
                                                  lambda o=out_k: ffi_dsa.call(*args_np, o), lambda o=out_k: o, False)
    mxfp4_names: dict[str, str] = {}  # MXFP4 version -> the FP8 version of the same variant
    if mxfp4_batch is not None:
        args_mx = mxfp4_batch.args()
        for kernel in kernels:
            out_m = np.full(mxfp4_batch.output_shape(TOPK), -7, dtype=np.int32)
            name = f"ffi_dsa mxfp4 (numpy) [{kernel}{', auto' if kernel == auto else ''}]"
            mxfp4_names[name] = _numpy_version(kernel, auto)
            versions[name] = (lambda k=kernel: ffi_dsa.set_cpu_kernel(k),
                              lambda o=out_m: ffi_dsa.mxfp4_call(*args_mx, o), lambda o=out_m: o, False)
    use_auto = lambda: ffi_dsa.set_cpu_kernel("auto")  # noqa: E731

    torch = None
    try:
        import torch
    except ImportError:
        print("  torch not importable: ffi_dsa with torch inputs and the naive torch baseline are skipped")
    if torch is not None:
        if a.threads:
            torch.set_num_threads(a.threads)
        args_t = batch.to_torch("cpu")
        out_t = torch.full(batch.output_shape(TOPK), -7, dtype=torch.int32)
        versions[f"ffi_dsa (torch cpu) [{auto}]"] = (use_auto, lambda: ffi_dsa.call(*args_t, out_t),
                                                     lambda: out_t, False)
        if not a.no_naive:
            from naive_torch import naive_topk_indexer

            holder = {}

            def naive():
                holder["out"] = naive_topk_indexer(*args_t, topk=TOPK)

            versions[f"naive torch fp32 ({torch.get_num_threads()} threads)"] = (
                lambda: None, naive, lambda: holder["out"], True)

    for _ in range(a.warmup):
        for setup, fn, _, _ in versions.values():
            setup()
            fn()
    times = {name: [] for name in versions}
    for _ in range(a.runs):
        for name, (setup, fn, _, _) in versions.items():
            setup()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    ffi_dsa.set_cpu_kernel("auto")
    load_after = os.getloadavg()
    for name, (_, _, get_out, sorted_check) in versions.items():
        record(name, times[name], get_out(), sorted_check)

    naive_name = next((k for k in results if k.startswith("naive")), None)
    base = results[naive_name]["median_us"] if naive_name else None
    print()
    print(f"  {'version':<42} {'median us':>12} {'min us':>12} {'tokens/s':>11} {'speed-up':>9}  check")
    for name, r in results.items():
        speed = f"{base / r['median_us']:.2f}x" if base else "-"
        print(f"  {name:<42} {r['median_us']:>12.0f} {r['min_us']:>12.0f} {r['tokens_per_s']:>11.3e} "
              f"{speed:>9}  {r['check']}{(' ' + r['problems'][0]) if r['problems'] else ''}")
    auto_name = _numpy_version(auto, auto)
    speedup = base / results[auto_name]["median_us"] if base and auto_name in results else None
    mxfp4_ratios = {}
    for name, fp8_name in mxfp4_names.items():
        mxfp4_ratios[name] = results[name]["median_us"] / results[fp8_name]["median_us"]
        print(f"  MXFP4 / FP8 time, {name[len('ffi_dsa mxfp4 (numpy) '):]}: {mxfp4_ratios[name]:.2f}")
    print(f"\n  load average before {_load(load_before)}, after {_load(load_after)}")
    if speedup is not None:
        print(f"  speed-up of ffi_dsa (numpy inputs, auto = {auto}) over naive torch: {speedup:.2f}x")

    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({
            "date": datetime.date.today().isoformat(), "machine": machine,
            "command": " ".join(["bench_cpu", *(argv if argv is not None else sys.argv[1:])]),
            "batch": a.batch, "tokens_per_row": a.tokens, "tokens": tokens, "topk": TOPK,
            "queries": a.queries or 1, "heads": a.heads,
            "runs": a.runs, "warmup": a.warmup, "results": results, "speedup_vs_naive": speedup,
            "mxfp4_over_fp8": mxfp4_ratios,
            "cpu_kernels": ffi_dsa.cpu_kernels(), "auto_kernel": auto,
            "load_average_before": load_before, "load_average_after": load_after,
        }, indent=2))
        print(f"  wrote {a.json}")

    if failed:
        print("bench_cpu: a result FAILED its check", file=sys.stderr)
        return 1
    if a.min_speedup is not None and (speedup is None or speedup < a.min_speedup):
        print(f"bench_cpu: speed-up {speedup} is below the required {a.min_speedup}x", file=sys.stderr)
        return 2
    return 0


def _kernels(arg: str) -> list[str]:
    """--kernels as variant names: 'all' = every variant this CPU runs, 'auto' = the one it picks."""
    offered = ffi_dsa.cpu_kernels()  # loads (first use: builds) the native module
    names = offered if arg == "all" else [k.strip() for k in arg.split(",") if k.strip()]
    names = [ffi_dsa.cpu_kernel() if k == "auto" else k for k in names]
    unknown = [k for k in names if k not in offered]
    if unknown:
        raise SystemExit(f"bench_cpu: --kernels {arg}: {unknown} not among this CPU's variants {offered}")
    return list(dict.fromkeys(names))


def _numpy_version(kernel: str, auto: str) -> str:
    return f"ffi_dsa (numpy) [{kernel}{', auto' if kernel == auto else ''}]"


def _load(avg) -> str:
    return "/".join(f"{x:.2f}" for x in avg)


if __name__ == "__main__":
    sys.exit(main())
