"""Where a kernel's warps wait (Nsight Compute; the select kernels unless --kernel): stall reasons, issue rate.

    python benchmarks/select_stalls.py [W1,W5,W6] [--queries N] [--sass DIR] [--kernel REGEX]
                                                    (a GPU with `ncu` on PATH)

For each workload it runs the call twice in a child process under ncu (L2 left as the first call
leaves it, clocks alone: `--cache-control none --clock-control none`) and prints, for the second
call's SelectRowsKernel and FusedRowsKernel, ncu's warp-state, scheduler and instruction sections
and the source lines where most stall samples fall. A select is a latency chain on few warps, so
its stall mix (instruction fetch, barriers, shared-memory or L2 latency) says what to shorten.
`--sass DIR` also writes, per workload, ncu's source page as CSV (DIR/<workload>_sass.csv: every
SASS instruction of the kernel with its CUDA source line, executed instructions and stall samples),
to count on the host which phase issues how much. `--kernel` profiles other kernels of the call the
same way (`--kernel ScorePagesKernel`: the scoring loop, whose page time at N = 4 follows neither
the HBM stream nor the tensor cores' rate, so its stall mix says which chain holds it).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

KERNELS = "regex:SelectRowsKernel|FusedRowsKernel"
# Warp-state sampling every 2^(5 + 0) = 32 cycles, ncu's shortest period: a one-CTA select lasts
# ~15K cycles, and ncu's automatic period gave W1's SelectRowsKernel 23 samples, too few to tell
# one source line from another.
SAMPLING = ["--warp-sampling-interval", "0"]
SECTIONS = ("WarpStateStats", "SchedulerStats", "InstructionStats", "LaunchStats", "SourceCounters")


def child(name: str, queries: int | None) -> int:
    import torch

    import ffi_dsa
    from bench_gpu import TOPK, workloads
    from ffi_dsa import _ffi_api
    from gpu_batches import make_batch_torch

    _ffi_api.cuda_module()
    batch = make_batch_torch(workloads()[name]["lens"], seed=5, device="cuda", queries=queries)
    out = torch.full(batch.output_shape(TOPK), -7, dtype=torch.int32, device="cuda")
    for _ in range(2):
        ffi_dsa.call(*batch.args(), out)
    torch.cuda.synchronize()
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="?", default="W1,W5,W6")
    parser.add_argument("--queries", type=int, default=None)
    parser.add_argument("--sass", help="folder for each workload's per-instruction CSV")
    parser.add_argument("--kernel", default=KERNELS,
                        help=f"ncu --kernel-name of the kernels to profile (default {KERNELS!r})")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    a = parser.parse_args(argv)
    if a.child:
        return child(a.child, a.queries)
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    extra = ["--queries", str(a.queries)] if a.queries else []
    if a.sass:
        Path(a.sass).mkdir(parents=True, exist_ok=True)
    # The second call's kernel, L2 and clocks as the first call leaves them.
    kernel = a.kernel if a.kernel.startswith("regex:") else f"regex:{a.kernel}"
    profile = [ncu, "--clock-control", "none", "--cache-control", "none", "--kernel-name", kernel,
               "--launch-skip", "1", "--launch-count", "1", "--import-source", "yes", *SAMPLING]
    sections = [arg for section in SECTIONS for arg in ("--section", section)]
    for name in a.workloads.split(","):
        child_cmd = [sys.executable, __file__, "--child", name, *extra]
        proc = subprocess.run([*profile, *sections, *child_cmd], capture_output=True, text=True, timeout=300)
        print(f"==== {name} (N = {a.queries or 1}) ====")
        keep = [ln for ln in proc.stdout.splitlines()
                if ln.strip() and not ln.startswith("==PROF==") and "----" not in ln]
        print("\n".join(keep[-120:]))
        if proc.returncode != 0:
            print(proc.stderr[-1500:])
        if a.sass:
            page = ["--section", "SourceCounters", "--page", "source", "--print-source", "cuda,sass", "--csv"]
            src = subprocess.run([*profile, *page, *child_cmd], capture_output=True, text=True, timeout=300)
            with open(f"{a.sass}/{name}_sass.csv", "w") as f:
                f.write(src.stdout)
            print(f"{name}: per-instruction counts in {a.sass}/{name}_sass.csv ({len(src.stdout)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
