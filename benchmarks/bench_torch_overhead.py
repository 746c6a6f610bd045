"""Eager per-call overhead of the torch registration routes (docs/performance.md quotes its numbers).

    python benchmarks/bench_torch_overhead.py [--calls 20000] [--reps 7]

CPU, tiny inputs: B=1 with seq_len 64 and K=16 (kernel included), and B=0 (validation and
dispatch only). Compares the tvm-ffi function called directly with the ``torch.library.Library``
define/impl + ``register_fake`` route (what ``torch.ops.dsa`` uses) and ``torch.library.custom_op``.
Reports the median and the minimum over repetitions, in microseconds per call.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import ffi_dsa

from ffi_dsa import _ffi_api, decode
import ffi_dsa.torch_ops  # noqa: F401  (registers torch.ops.dsa.*)
from ffi_dsa.contract import DEFAULT_TOPK
from ffi_dsa.workloads import make_batch

DEFAULT_ATTRS = decode.OP.attrs({})  # the exported function's option attributes at their defaults


def _custom_op():
    """The same op through torch.library.custom_op, for comparison (registered once)."""
    fn = _ffi_api.kernel_for("topk_indexer", "cpu")

    @torch.library.custom_op("dsa_bench::topk_indexer", mutates_args=())
    def op(q: torch.Tensor, k_cache: torch.Tensor, weights: torch.Tensor, seq_lens: torch.Tensor,
           block_table: torch.Tensor, topk: int = DEFAULT_TOPK, sorted: bool = False) -> torch.Tensor:
        out = torch.empty((q.shape[0], topk), dtype=torch.int32, device=q.device)
        fn(q, k_cache, weights, seq_lens, block_table, out, *decode.OP.attrs({"sorted": sorted}))
        return out

    @op.register_fake
    def _(q, k_cache, weights, seq_lens, block_table, topk=DEFAULT_TOPK, sorted=False):
        return q.new_empty((q.shape[0], topk), dtype=torch.int32)

    return op


def _time_interleaved(routes: dict, calls: int, reps: int) -> dict[str, tuple[float, float]]:
    """Median and min of `reps` timings per route; the routes take turns within each repetition,
    so load changes on a shared machine hit them alike."""
    for route in routes.values():
        for _ in range(min(calls, 2000)):
            route()
    samples: dict[str, list[float]] = {name: [] for name in routes}
    for _ in range(reps):
        for name, route in routes.items():
            start = time.perf_counter()
            for _ in range(calls):
                route()
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: (statistics.median(v), min(v)) for name, v in samples.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    custom = _custom_op()
    fn = _ffi_api.kernel_for("topk_indexer", "cpu")
    K = 16
    for lens in ([64], []):
        q, k, w, s, bt = make_batch(lens).to_torch()
        B = len(lens)
        out = torch.empty((B, K), dtype=torch.int32)
        routes = {
            "tvm-ffi function, preallocated output": lambda: fn(q, k, w, s, bt, out, *DEFAULT_ATTRS),
            "torch.empty + tvm-ffi function": lambda: fn(q, k, w, s, bt, torch.empty((B, K), dtype=torch.int32), *DEFAULT_ATTRS),
            "ffi_dsa.call, preallocated output": lambda: ffi_dsa.call(q, k, w, s, bt, out),
            "Library: torch.ops.dsa.topk_indexer.default": lambda: torch.ops.dsa.topk_indexer.default(q, k, w, s, bt, K),
            "Library: torch.ops.dsa.topk_indexer (packet)": lambda: torch.ops.dsa.topk_indexer(q, k, w, s, bt, K),
            "Library: torch.ops.dsa.topk_indexer_out.default": lambda: torch.ops.dsa.topk_indexer_out.default(q, k, w, s, bt, out),
            "custom_op: decorated function": lambda: custom(q, k, w, s, bt, K),
            "custom_op: torch.ops.dsa_bench.topk_indexer": lambda: torch.ops.dsa_bench.topk_indexer(q, k, w, s, bt, K),
        }
        print(f"B={B}{', seq_len 64' if B else ''}, K={K} (us per call: median, min of {args.reps} x {args.calls})")
        for name, (med, best) in _time_interleaved(routes, args.calls, args.reps).items():
            print(f"  {name:50s} {med:7.2f} {best:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
