"""Where an eager call's host time goes, layer by layer.

    python benchmarks/host_overhead.py [--device cuda|cpu] [--calls 1500]

bench_gpu.py's "eager" column brackets each `ffi_dsa.call` with two CUDA events: when the host is
slower than the GPU, that number is host time plus the event records themselves. This script
separates the layers, each as the median host time of one call (time.perf_counter_ns around the
call; the stream is synchronized every few calls so the launch queue never fills and blocks) and,
on CUDA, as the same event-bracketed time bench_gpu reports:

  torch x.add_(1)          one small torch op: what any eager op costs on this host
  event.record()           one CUDA event record (bench_gpu's eager bracket records two)
  exported fn, B=0         the tvm-ffi call, 6 DLPack conversions and the argument checks; no launch
  exported fn, <shape>     + workspace, tensor maps and the launches of that shape
  ffi_dsa.call, <shape>    + the Python layer (device dispatch, numpy fixes)

Shapes (CUDA only): C2 (1 x 1500 tokens: the select kernel alone), W1 (1 x 8K: two kernels), W3
(16 x 4K). On the CPU only the layers without computation are timed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import ffi_dsa  # noqa: E402
from bench_gpu import Clock  # noqa: E402
from ffi_dsa import _ffi_api, decode  # noqa: E402
from ffi_dsa.contract import DEFAULT_TOPK  # noqa: E402
from ffi_dsa.workloads import make_batch  # noqa: E402

SHAPES = {"C2": [1500], "W1": [8192], "W3": [4096] * 16}
DEFAULT_ATTRS = decode.OP.attrs({})  # the exported function's option attributes at their defaults


def host_us(fn, calls: int, sync, sync_every: int = 40) -> float:
    times = []
    for i in range(calls):
        start = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - start)
        if i % sync_every == 0:
            sync()
    sync()
    return statistics.median(times[calls // 10:]) / 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    parser.add_argument("--calls", type=int, default=1500)
    a = parser.parse_args()
    cuda = a.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    fn = _ffi_api.kernel_for("topk_indexer", a.device)
    probes: dict[str, object] = {}
    x = torch.zeros(16, device=a.device)
    probes["torch x.add_(1)"] = lambda: x.add_(1)
    if cuda:
        event = torch.cuda.Event()
        probes["event.record()"] = event.record
    # sliced once, outside the timed call: a torch slice costs as much as the call
    empty = [t[:0] for t in make_batch([64], seed=1).to_torch(a.device)]
    out0 = torch.empty((0, DEFAULT_TOPK), dtype=torch.int32, device=a.device)
    probes["exported fn, B=0 (call + DLPack + checks)"] = lambda: fn(*empty, out0, *DEFAULT_ATTRS)
    # the shapes only on CUDA: on the CPU the computation swamps the rest
    for name, lens in SHAPES.items() if cuda else ():
        args = make_batch(lens, seed=1).to_torch(a.device)
        out = torch.empty((len(lens), DEFAULT_TOPK), dtype=torch.int32, device=a.device)
        probes[f"exported fn, {name}"] = lambda args=args, out=out: fn(*args, out, *DEFAULT_ATTRS)
        probes[f"ffi_dsa.call, {name}"] = lambda args=args, out=out: ffi_dsa.call(*args, out)

    where = torch.cuda.get_device_name(0) if cuda else "CPU"
    print(f"host overhead per eager call on {where} ({a.calls} calls each, median µs)")
    print(f"{'what':46s} {'host':>8s} {'events':>8s}")
    for name, probe in probes.items():
        probe()
        sync()
        host = host_us(probe, a.calls, sync)
        # bench_gpu's eager method: each call between two CUDA events
        ev = f"{'-':>8s}"
        if cuda:
            ev = f"{statistics.median(Clock('cuda').time_each([probe] * min(a.calls, 300))) * 1e6:8.2f}"
        print(f"{name:46s} {host:8.2f} {ev}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
