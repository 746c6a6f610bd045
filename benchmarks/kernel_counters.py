"""Hardware counters per kernel (Nsight Compute): duration, DRAM bytes moved, achieved bandwidth.

    python benchmarks/kernel_counters.py [W1,W2,...] [--queries N] [--heads H]
                                            (a GPU with `ncu` on PATH; default W1-W6, one query of 64 heads)

bench_gpu.py says how long a call takes; this says where the bytes and the time go. For each
workload it runs one cold call (`ncu --cache-control all` flushes L2 before every kernel; clocks
left alone: `--clock-control none`) in a child process under ncu, reads every ffi_dsa kernel's
counters and prints, per kernel and per call: the duration, DRAM bytes read and written, the
achieved DRAM bandwidth, that bandwidth over the copy bandwidth measured in the same run, and the
bytes the call had to move (bench_gpu.floor_bytes) over the bytes it did move. ncu runs the
kernels one at a time, so programmatic dependent launch no longer overlaps the select's prologue
with scoring: per-kernel times add up to slightly more than the kernels take in a graph.

`--steady C` instead runs C calls back to back on two batches in turn (two K caches: the second
call streams pages the first did not leave in L2, as in a serving step or the kit's rotation), L2
left as each kernel leaves it (`--cache-control none`, application replay), and prints the last
call's kernels: what a call moves in steady state, such as the previous call's workspace lines
that L2 writes back to HBM during this call's page stream. Application replay runs the child
once per metric pass: ~50 s a workload (H100). "keys MB" is the split path's workspace a call
writes, 4 bytes a token of every query row (a bound: rows of at most K tokens take none).
"""

from __future__ import annotations

import argparse
import csv
import io
import shutil
import subprocess
import sys
from pathlib import Path

KERNELS = "regex:ScorePagesKernel|SelectRowsKernel|FusedRowsKernel"
METRICS = {
    "gpu__time_duration.sum": "ns",
    "dram__bytes_read.sum": "read",
    "dram__bytes_write.sum": "write",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct",
    "launch__grid_size": "grid",
}
UNIT_SCALE = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "nsecond": 1, "usecond": 1e3, "msecond": 1e6}


def child(name: str, queries: int | None, heads: int, calls: int = 1) -> int:
    """`calls` calls of workload `name` on fresh device data (the kernels ncu reads), alternating
    between two batches when more than one; `queries` per row (q [B, N, H, 128], causal seq_lens)
    when given."""
    import torch

    import ffi_dsa
    from bench_gpu import TOPK, workloads
    from ffi_dsa import _ffi_api
    from gpu_batches import make_batch_torch

    _ffi_api.cuda_module()
    lens = workloads()[name]["lens"]
    batches = [make_batch_torch(lens, seed=5 + i, device="cuda", queries=queries, heads=heads)
               for i in range(min(calls, 2))]
    out = torch.full(batches[0].output_shape(TOPK), -7, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    for c in range(calls):
        ffi_dsa.call(*batches[c % len(batches)].args(), out)
    torch.cuda.synchronize()
    return 0


def workspace_keys(lens, queries: int | None) -> int:
    """Bytes of keys the split path writes a call: every query row's visible tokens (causal seq_lens),
    each rounded up to a quad."""
    from ffi_dsa.contract import PAGE_TOKENS
    from ffi_dsa.decode_reference import visible_lengths

    pages = -(-max(int(n) for n in lens) // PAGE_TOKENS)  # a table wide enough to clamp nothing
    return int(sum(4 * ((int(n) + 3) // 4 * 4) for n in visible_lengths(lens, queries or 1, pages)))


def short_name(kernel: str) -> str:
    for k in ("ScorePages", "SelectRows", "FusedRows"):
        if k in kernel:
            return k
    return kernel[:20]


def parse(csv_text: str) -> list[dict]:
    """ncu --csv --page raw: a header row, a units row, then one row per kernel."""
    lines = [ln for ln in csv_text.splitlines() if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(rows) < 3:
        return []
    header, units = rows[0], rows[1]
    kernels = []
    for row in rows[2:]:
        rec = {"kernel": short_name(row[header.index("Kernel Name")])}
        for metric, key in METRICS.items():
            i = header.index(metric)
            value = float(row[i].replace(",", "")) if row[i] not in ("", "n/a") else float("nan")
            rec[key] = value * UNIT_SCALE.get(units[i], 1)
        kernels.append(rec)
    return kernels


def profile(name: str, ncu: str, shape_args: list[str], calls: int = 1) -> list[dict]:
    """The kernels of the child's last call (every call launches the same kernels)."""
    caching = ["--cache-control", "all"] if calls == 1 else ["--cache-control", "none", "--replay-mode", "application"]
    cmd = [ncu, "--clock-control", "none", *caching, "--kernel-name", KERNELS, "--csv", "--page", "raw",
           "--metrics", ",".join(METRICS), sys.executable, __file__, "--child", name, "--calls", str(calls), *shape_args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    kernels = parse(proc.stdout)
    if proc.returncode != 0 or not kernels or len(kernels) % calls != 0:
        tail = (proc.stdout + proc.stderr)[-1500:]
        raise RuntimeError(f"ncu on {name} gave {len(kernels)} kernel records for {calls} calls (exit {proc.returncode}):\n{tail}")
    return kernels[-(len(kernels) // calls):]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="?", default="W1,W2,W3,W4,W5,W6")
    parser.add_argument("--queries", type=int, default=None, help="N query tokens per row (rank-4 q)")
    parser.add_argument("--heads", type=int, default=None, help="index heads (64 or 32)")
    parser.add_argument("--steady", type=int, default=None, metavar="C",
                        help="C >= 2 calls back to back on two batches, L2 kept; the last call's kernels")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=1, help=argparse.SUPPRESS)
    a = parser.parse_args(argv)
    from ffi_dsa.contract import NUM_HEADS

    heads = a.heads or NUM_HEADS
    if a.child:
        return child(a.child, a.queries, heads, a.calls)
    if a.steady is not None and a.steady < 2:
        parser.error("--steady: at least 2 calls")
    calls = a.steady or 1
    shape_args = (["--queries", str(a.queries)] if a.queries else []) + ["--heads", str(heads)]

    import torch

    from bench_gpu import copy_bandwidth, floor_bytes, workloads

    if not torch.cuda.is_available():
        print("kernel_counters: needs a CUDA GPU")
        return 1
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    if not Path(ncu).exists():
        print("kernel_counters: Nsight Compute (ncu) not found")
        return 1
    bandwidth = copy_bandwidth("cuda", 1 << 31)
    how = "one cold call" if calls == 1 else f"the last of {calls} calls on two batches (L2 kept)"
    print(f"copy bandwidth {bandwidth / 1e12:.3f} TB/s (read + write); {how} per workload under ncu; "
          f"queries per row {a.queries or 1} ({'rank-4' if a.queries else 'rank-3'} q), {heads} heads")
    print(f"{'wl':3s} {'kernel':10s} {'grid':>5s} {'us':>7s} {'read MB':>8s} {'write MB':>8s} {'GB/s':>6s} "
          f"{'of copy':>7s} {'dram %':>6s} {'sm %':>5s}")
    specs = workloads()
    for name in a.workloads.split(","):
        kernels = profile(name, ncu, shape_args, calls)
        for k in kernels:
            moved = k["read"] + k["write"]
            rate = moved / k["ns"]  # bytes per ns = GB/s
            print(f"{name:3s} {k['kernel']:10s} {k['grid']:5.0f} {k['ns'] / 1e3:7.2f} {k['read'] / 1e6:8.2f} "
                  f"{k['write'] / 1e6:8.2f} {rate:6.0f} {rate * 1e9 / bandwidth:7.0%} {k['dram_pct']:6.1f} "
                  f"{k['sm_pct']:5.1f}")
        ns = sum(k["ns"] for k in kernels)
        moved = sum(k["read"] + k["write"] for k in kernels)
        need = floor_bytes(specs[name]["lens"])
        split = any(k["kernel"] == "ScorePages" for k in kernels)  # the fused path writes no keys
        keys = f"; keys MB {workspace_keys(specs[name]['lens'], a.queries) / 1e6:.2f}" if split else ""
        print(f"{name:3s} {'call':10s} {'':5s} {ns / 1e3:7.2f} {moved / 1e6:17.2f} {moved / ns:6.0f} "
              f"{moved / ns * 1e9 / bandwidth:7.0%}   floor {need / bandwidth * 1e6:.2f} us for {need / 1e6:.2f} MB; "
              f"moved / needed {moved / need:.2f}{keys}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
