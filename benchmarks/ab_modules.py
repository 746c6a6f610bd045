"""Whole calls through this tree's module and another tree's, timed in one process, in turns.

    python benchmarks/ab_modules.py --against PATH [--against-cache DIR] [W5,W1 ...] [--queries N]
                                    [--rounds R] [--replays M] [--device cuda|cpu] [--rotate-mb MB]
                                    [--between-mb MB] [--graph-calls K]

Two builds timed in two processes, a minute apart, differ by what the machine did in between
(clocks, temperature, the other process's allocations) by as much as a select change saves
(benchmarks/NOTES.md). Here both modules are loaded into one process and each workload's CUDA
graphs of both (one call each) are replayed in alternating rounds, which of the two goes first
alternating too, over one rotation of L2-cold input sets (bench_gpu.rotating_sets), so drift lands
on both. With `--device cpu` the CPU modules, called directly. Per workload: each module's median
per call (CUDA events, every replay of every round), the other/this ratio of those medians with
the range of the per-round ratios, and whether both wrote the same bytes on every set. The other
tree's module is built or loaded by that tree's ffi_dsa in a child process (in FFI_DSA_CACHE_DIR,
or `--against-cache`); both modules must take the same arguments (the bindings' `topk_indexer`) and
export none of their own C++ (cuda/module_exports.map: a module built before that ran the first
module's code, so the two timed alike; such a module is refused, exit 2). Exit code 1 if any
output differs.

`--between-mb MB` copies MB MiB from one scratch buffer to another after each call, in the same
graph, as the rest of a model's layer would between two of its indexer calls: the L2 lines a call
leaves (its workspace's keys, the small inputs) are then evicted before the next call, as in serving,
instead of staying resident across the replays. Both modules' times include the copy, so the ratio
shrinks toward 1; the difference of the two times is the modules'.

`--graph-calls K` captures K consecutive calls (K input sets in turn) in each graph, as the kit's
bench_graph and bench_gpu.py's in-graph time do, and reports a replay's time over K (K at most
the input sets; on the CPU: K calls in a row, timed as one). With programmatic dependent launch a
call's first kernel may then be placed while the previous call's select still runs (its prologue,
up to its grid wait, overlaps that select), which graphs of one call never show.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

import torch

from bench_gpu import Clock, call_groups, capture_graphs, rotating_sets, workloads  # noqa: E402  (this script's folder)
from diff_module import tree_env  # noqa: E402
from ffi_dsa import _arrays, _build, _ffi_api, decode

MB = 1 << 20
POISON = -7  # no id: an output still holding it was not written


def other_module_path(tree: str, cache: str | None, kind: str) -> str:
    """The `kind` ('cuda' or 'cpu') module file `tree`'s ffi_dsa loads (building it first if it
    must, which prints)."""
    code = f"from ffi_dsa import _ffi_api; print(_ffi_api.module_path({kind!r}))"
    done = subprocess.run([sys.executable, "-c", code], env=tree_env(tree, cache), cwd=tree, stdout=subprocess.PIPE,
                          text=True)
    if done.returncode != 0:
        raise SystemExit(f"ab_modules: {tree}'s ffi_dsa could not load its {kind} module (exit {done.returncode})")
    return done.stdout.strip().splitlines()[-1]


def bound_call(kernel, args, out, max_seq_len=None):
    """kernel (a module's topk_indexer) on `args` and `out` as ffi_dsa.call passes them (slots,
    ascending positions, the workload's max_seq_len if any), without the per-call conversions."""
    full = (*args, out)
    ready = _arrays.all_dlpack_ready(full, decode.OP.arg_names, decode.OP.fp8_args)
    attrs = decode.OP.attrs({"sorted": False, "ids": "slots", "max_seq_len": max_seq_len})
    return lambda: kernel(*ready, *attrs)


def scratch_pair(between_mb: int, device: str):
    """Two buffers of `between_mb` MiB on `device`, which every call of a workload shares (None
    with 0)."""
    if between_mb <= 0:
        return None
    src = torch.ones(between_mb * MB // 4, dtype=torch.float32, device=device)
    return src, torch.empty_like(src)


def with_copy_after(call, scratch):
    """`call`, then a copy from scratch's first buffer to its second (nothing more without)."""
    if scratch is None:
        return call
    src, dst = scratch

    def both():
        call()
        dst.copy_(src)
    return both


def compare(name: str, spec: dict, kernels: dict, device: str, rotate_mb: int, rounds: int, replays: int,
            queries: int | None, between_mb: int = 0, graph_calls: int = 1) -> tuple[str, bool]:
    """One line for workload `name` and whether both modules wrote the same bytes."""
    rot = rotating_sets(spec["lens"], device, rotate_mb * MB, seed=11, max_sets=64, queries=queries,
                        max_pages=spec.get("table_pages"))
    outs = {who: [torch.full_like(o, POISON) for o in rot.outs] for who in kernels}
    scratch = scratch_pair(between_mb, device)
    calls = {}  # who -> zero-argument calls of per_group input sets each: a CUDA graph's replay on a GPU
    for who, kernel in kernels.items():
        def make_call(i, kernel=kernel, who=who):
            call = bound_call(kernel, rot.set_args(i), outs[who][i], spec.get("max_seq_len"))
            return with_copy_after(call, scratch)
        make_group, groups, per_group = call_groups(make_call, rot.sets, graph_calls)
        if device == "cuda":
            calls[who] = [g.replay for g in capture_graphs(make_group, groups, pool=torch.cuda.graph_pool_handle())]
        else:
            calls[who] = [make_group(g) for g in range(groups)]
    for who in kernels:
        for call in calls[who]:
            call()
    clock = Clock(device)
    clock.sync()
    written = all(bool((o != POISON).all()) for o in outs["this"])
    same = written and all(torch.equal(a, b) for a, b in zip(*outs.values()))
    times = {who: [] for who in kernels}
    ratios = []
    turn = 0  # one rotation for both: each replay reads sets that the replays just before it did not
    order = list(kernels)
    for r in range(rounds):
        medians = {}
        for who in (order if r % 2 == 0 else order[::-1]):
            fns = [calls[who][(turn + i) % len(calls[who])] for i in range(replays)]
            turn += replays
            t = clock.time_each(fns, head_start_s=max(2e-3, 30e-6 * replays))  # the CPU clock has none
            t = [x / per_group for x in t]
            times[who] += t
            medians[who] = statistics.median(t)
        ratios.append(medians["other"] / medians["this"])
    this, other = (statistics.median(times[w]) * 1e6 for w in order)
    line = (f"{name:4s} N={queries or 1}  this {this:8.2f} us  other {other:8.2f} us  other/this {other / this:6.3f} "
            f"(rounds {min(ratios):.3f}-{max(ratios):.3f}, {rounds} x {replays * per_group} calls each"
            + (f", {per_group} a graph" if per_group > 1 else "") + ")  "
            + (f"other - this {other - this:+.2f} us with a {between_mb} MiB copy after each call  " if between_mb else "")
            + ("bytes equal" if same else "BYTES DIFFER" if written else "NOT WRITTEN"))
    return line, same


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="?", default="W5", help="comma-separated (bench_gpu.py's names)")
    parser.add_argument("--against", required=True, help="the other tree (its ffi_dsa builds or loads its module)")
    parser.add_argument("--against-cache", help="FFI_DSA_CACHE_DIR for the other tree's module (default: the same)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--queries", type=int, default=None, help="N query tokens per row")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--replays", type=int, default=20, help="calls of each module per round")
    parser.add_argument("--rotate-mb", type=int, default=256, help="the input sets' cache, in MiB (L2-cold: >= 256)")
    parser.add_argument("--between-mb", type=int, default=0,
                        help="MiB copied after each call, in its graph (L2 evicted between calls, as in a model)")
    parser.add_argument("--graph-calls", type=int, default=1,
                        help="consecutive calls captured in each graph (the kit: >= 8; PDL overlaps them)")
    a = parser.parse_args(argv)
    if a.graph_calls < 1:
        parser.error(f"--graph-calls must be >= 1, not {a.graph_calls}")
    if a.between_mb < 0:
        parser.error(f"--between-mb must be >= 0, not {a.between_mb}")
    specs = workloads()
    unknown = [n for n in a.workloads.split(",") if n not in specs]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; bench_gpu.py's: {', '.join(specs)}")
    if a.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a GPU that torch sees")
    import tvm_ffi

    this = _ffi_api.cuda() if a.device == "cuda" else _ffi_api.cpu()
    this_path = _ffi_api.module_path(a.device)
    other_path = other_module_path(a.against, a.against_cache, a.device)
    for path in (this_path, other_path):
        if own := _build.exported_own_symbols(path):
            parser.exit(2, f"ab_modules: {path} exports {len(own)} symbols of its own C++ (e.g. {own[0]}): in one "
                           "process with another module it would run that module's code; rebuild it from a tree "
                           "with cuda/module_exports.map\n")
    kernels = {"this": this.topk_indexer, "other": tvm_ffi.load_module(other_path).topk_indexer}
    print(f"this:  {this_path}\nother: {other_path}", flush=True)
    ok = True
    for name in a.workloads.split(","):
        line, same = compare(name, specs[name], kernels, a.device, a.rotate_mb, a.rounds, a.replays, a.queries,
                             a.between_mb, a.graph_calls)
        print(line, flush=True)
        ok &= same
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
