"""`python -m ffi_dsa demo`: one realistic decode batch, timed and checked against the reference.

16 rows of mixed context lengths (a few hundred tokens up to 32K) on a shuffled page table, run
on the best device present: CUDA when torch is importable and sees a GPU, else the CPU with
plain numpy inputs (torch is optional there). The result is checked with ``ffi_dsa.check_topk``
under the contract's tolerance (docs/contract.md); the exit code is non-zero when the check fails.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import TYPE_CHECKING

# numpy and the package's API are imported where the demo runs: `ffi-dsa --help` reads only
# add_arguments, and the API's import loads the native module (through tvm_ffi, which imports torch).
if TYPE_CHECKING:
    import numpy as np


def demo_lengths(seed: int, rows: int = 16, max_len: int = 32768) -> np.ndarray:
    """Mixed decode lengths: log-uniform between 100 and `max_len`, one row of exactly
    `max_len`, one shorter than K (so the -1 padding shows), the rest shuffled."""
    import numpy as np

    from .contract import DEFAULT_TOPK as TOPK

    rng = np.random.default_rng(seed)
    lens = np.exp(rng.uniform(np.log(100), np.log(max_len), size=rows)).astype(np.int64)
    lens[0] = max_len
    if rows > 1:
        lens[1] = int(rng.integers(100, TOPK))
    return rng.permutation(lens).astype(np.int32)


def pick_device(requested: str) -> tuple[str, str]:
    """(device, why): 'cuda' only when torch imports and sees a GPU."""
    if requested == "cpu":
        return "cpu", "asked for"
    try:
        import torch
    except ImportError:
        if requested == "cuda":
            raise SystemExit("demo: --device cuda needs torch with CUDA; torch is not importable") from None
        return "cpu", "torch not importable"
    if torch.cuda.is_available():
        return "cuda", torch.cuda.get_device_name(0)
    if requested == "cuda":
        raise SystemExit("demo: --device cuda asked for, but torch.cuda.is_available() is False")
    return "cpu", "no CUDA device"


def _time_cpu(fn, warmup: int, runs: int) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _time_cuda(fn, warmup: int, runs: int) -> list[float]:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(runs)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) / 1e3 for start, end in events]


def _fmt_seconds(t: float) -> str:
    return f"{t * 1e6:.1f} us" if t < 1e-3 else f"{t * 1e3:.2f} ms" if t < 1 else f"{t:.2f} s"


def cpu_name() -> str:
    """The host CPU's model name (for benchmark and demo reports)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def run(device: str = "auto", seed: int = 2026, rows: int = 16, max_len: int = 32768,
        warmup: int = 2, runs: int = 5, sorted: bool = False) -> int:
    import numpy as np

    from . import call, check_topk
    from .contract import DEFAULT_TOPK as TOPK
    from .workloads import make_batch

    device, why = pick_device(device)
    lens = demo_lengths(seed, rows, max_len)
    print(f"ffi_dsa demo: building a decode batch of {rows} rows ({int(lens.sum())} tokens, "
          f"lengths {int(lens.min())}..{int(lens.max())}) on a shuffled page table ...", flush=True)
    batch = make_batch(lens, seed=seed)

    if device == "cuda":
        import torch

        args = batch.to_torch("cuda")
        out = torch.full((rows, TOPK), -7, dtype=torch.int32, device="cuda")
        label = f"cuda ({why})"
        timer = _time_cuda
    else:
        args = batch.args()  # numpy: q as uint8 bytes of FP8, the cache as int8
        out = np.full((rows, TOPK), -7, dtype=np.int32)
        import os

        label = f"cpu ({cpu_name()}, {os.cpu_count()} cores; {why})"
        timer = _time_cpu

    def once():
        call(*args, out, sorted=sorted)

    once()  # first call: loads (and on first use builds) the native module
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
    times = timer(once, warmup, runs)
    median = statistics.median(times)

    start = time.perf_counter()
    problems = check_topk(out, *batch.args(), sorted=sorted)
    check_s = time.perf_counter() - start
    verdict = "PASS" if not problems else f"FAIL ({len(problems)} problems; first: {problems[0]})"

    tokens = batch.tokens
    table = [
        ("device", label),
        ("rows", str(rows)),
        ("tokens", f"{tokens} (K = {TOPK}{', sorted' if sorted else ''})"),
        ("time", f"{_fmt_seconds(median)} (median of {runs} runs after {warmup + 1} warm-up)"),
        ("tokens/s", f"{tokens / median:.3e}"),
        ("check", f"{verdict} vs float64 reference, contract tolerance ({check_s:.1f} s)"),
    ]
    width = max(len(k) for k, _ in table)
    print()
    for key, value in table:
        print(f"  {key:<{width}}  {value}")
    return 0 if not problems else 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="where to run (default: CUDA if torch sees a GPU, else CPU)")
    parser.add_argument("--seed", type=int, default=2026, help="batch seed (default 2026)")
    parser.add_argument("--rows", type=int, default=16, help="batch rows (default 16)")
    parser.add_argument("--max-len", type=int, default=32768, help="longest context (default 32768)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up runs (default 2)")
    parser.add_argument("--sorted", action="store_true", help="order each row by descending score")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="ffi_dsa demo", description=__doc__.splitlines()[0])
    add_arguments(parser)
    a = parser.parse_args(argv)
    return run(a.device, a.seed, a.rows, a.max_len, a.warmup, a.runs, a.sorted)


if __name__ == "__main__":
    sys.exit(main())
