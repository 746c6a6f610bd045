"""Each CUDA path once, each in a process of its own under a time limit: the first step of a GPU
machine's call (benchmarks/device_run.sh smoke), so that a kernel that never finishes is a named
failure after seconds, not a call that runs out its whole limit with nothing said.

    python benchmarks/gpu_smoke.py [--device cuda|cpu] [--timeout S] [--cases a,b,...]

A case is one path of the module: the fused kernel at N = 1, 2 and 4, sorted output, the split
path for rows one CTA selects (of 1024 threads, and of 512 with a row longer than such a CTA
stages) and for rows on a cluster, the select stamps on either path (ffi_dsa.cuda_options). Its
child makes one batch of fresh random data and calls it twice into poisoned outputs (fuzz.py's
Runner: on CUDA the repeat on a second stream); the two must be the same bytes and pass
``ffi_dsa.check_topk`` (the float64 reference, the contract's tolerance). A child still running at
the time limit is killed and reported as a hang: a hung kernel keeps its process from ever returning. Shortly before the
limit the child prints its Python stack (faulthandler), which says where it waits (a synchronize
behind a kernel, or host code). The module is loaded, or built, by this process before the first
case, outside every limit. ``--device cpu`` makes the same calls on the CPU path (the options
are the CUDA module's and are not set there), so the script runs without a GPU. Exit code 1 if any
case fails or hangs.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from ffi_dsa.contract import DEFAULT_TOPK


@dataclass(frozen=True)
class Case:
    lens: tuple[int, ...] | None  # row lengths; None: rows enough for the fused path
    queries: int | None = None    # N (None: rank-3 q, one query per row)
    heads: int = 64
    sorted: bool = False
    options: dict = field(default_factory=dict)  # ffi_dsa.cuda_options for the call (CUDA only)


CLUSTER_ROWS = (70000, 20000, 5000, 1000)  # one row on a cluster of CTAs, one of <= K tokens
SPLIT = {"fused": False}
PAIRED = {**SPLIT, "max_select_cluster": 1, "select_threads": 512}  # 512-thread select CTAs, one a row
CASES = {
    "fused_n1": Case(None),
    "fused_n2": Case(None, queries=2),
    "fused_n4_h32": Case(None, queries=4, heads=32),
    "fused_sorted": Case(None, sorted=True),
    "split_alone": Case((3000, 8000, 2100, 2049), options=SPLIT),
    "split_cluster": Case(CLUSTER_ROWS, options=SPLIT),
    "split_cluster_sorted": Case(CLUSTER_ROWS, sorted=True, options=SPLIT),
    "split_cluster_n2": Case(CLUSTER_ROWS, queries=2, options=SPLIT),
    "split_paired": Case((30000, 9000, 8000, 2100), options=PAIRED),
    "split_paired_sorted": Case((30000, 9000, 8000, 2100), sorted=True, options=PAIRED),
    "stamps_fused_n2": Case(None, queries=2, options={"stamp_select": True}),
    "stamps_split": Case(CLUSTER_ROWS, options={**SPLIT, "stamp_select": True}),
}


def row_lengths(case: Case, device: str, rng) -> np.ndarray:
    if case.lens is not None:
        return np.array(case.lens)
    # The fused path takes batches of >= 0.7 x the SMs rows whose table is <= 16K / N tokens wide.
    rows = 128
    if device == "cuda":
        import torch

        rows = max(rows, torch.cuda.get_device_properties(0).multi_processor_count)
    return rng.integers(2100, min(6000, 16384 // (case.queries or 1) - 64), size=rows)


def run_case(name: str, device: str, seed: int) -> list[str]:
    """Case `name`'s call and its repeat; the problems found (empty: correct)."""
    import ffi_dsa
    from ffi_dsa.workloads import make_batch
    from fuzz import Runner

    case = CASES[name]
    rng = np.random.default_rng(seed)
    batch = make_batch(row_lengths(case, device, rng), seed=seed, queries=case.queries, heads=case.heads)
    if device == "cuda":
        from ffi_dsa.cuda_options import select_stamps, set_cuda_options

        if case.options.get("stamp_select"):
            select_stamps(0, 1)  # the stamp buffer exists before a stamped call
        set_cuda_options(**case.options)
    first, repeat = Runner(device).run(batch.args(), batch.output_shape(DEFAULT_TOPK), case.sorted, {})
    problems = [] if np.array_equal(first, repeat) else ["the repeat wrote other bytes"]
    return problems + ffi_dsa.check_topk(first, *batch.args(), sorted=case.sorted)


def run_child(command: list[str], timeout: float) -> tuple[str, str]:
    """("ok" | "failed" | "hang", the child's output) of one child process under `timeout` seconds.
    The child writes into a file, not a pipe, and runs in a session of its own whose every process
    is killed at the limit: a process it started (a JIT build's compiler, say) can then neither keep
    this one waiting for the end of a pipe nor outlive the case."""
    with tempfile.TemporaryFile(mode="w+") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            status = "ok" if child.wait(timeout=timeout) == 0 else "failed"
        except subprocess.TimeoutExpired:
            status = "hang"
        with contextlib.suppress(ProcessLookupError):  # the session's other processes, if any
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        log.seek(0)
        return status, log.read()


def load_module(device: str) -> None:
    """This process loads (or first builds, saying so) the module the children load: a JIT build
    takes about a minute, which no case's limit should count."""
    if device == "cuda":
        from ffi_dsa import _ffi_api

        _ffi_api.cuda_module()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds a case may take, its process's start included")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--seed", type=int, default=2051)
    parser.add_argument("--child", help=argparse.SUPPRESS)  # the case this process runs
    a = parser.parse_args(argv)
    if a.child:
        faulthandler.dump_traceback_later(max(1.0, a.timeout - 5))  # where it waits, if it hangs
        problems = run_case(a.child, a.device, a.seed)
        for p in problems[:5]:
            print(p)
        return 1 if problems else 0
    names = [n for n in a.cases.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; the cases: {', '.join(CASES)}")
    load_module(a.device)
    failed = 0
    for name in names:
        start = time.perf_counter()
        status, output = run_child([sys.executable, __file__, "--device", a.device, "--seed", str(a.seed),
                                    "--timeout", str(a.timeout), "--child", name], a.timeout)
        took = time.perf_counter() - start
        note = f" (killed after {a.timeout:.0f} s: a kernel that never finishes?)" if status == "hang" else ""
        print(f"smoke {name:22s} {status.upper():6s} {took:6.1f} s{note}", flush=True)
        if status != "ok":
            failed += 1
            print("  " + "\n  ".join(output.strip().splitlines()[-12:]), flush=True)
    print(f"smoke ({a.device}): {len(names) - failed} of {len(names)} cases ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
