"""Where one call's time goes: per-kernel durations and gaps inside CUDA-graph replays.

    python benchmarks/kernel_timeline.py [W1,W3,C2 ...] [--queries N] [--floor] [--rows]
                                                 (a GPU; default C2,W1,W3,W5,W6)

bench_gpu.py times each replay between two CUDA events; that number includes the graph launch
and both kernels. This script replays the same kind of rotating graphs under torch.profiler
(CUPTI kernel records) and prints, per workload: the scoring kernel's duration, the select
kernel's duration and its start relative to the scoring kernel's end (negative: programmatic
dependent launch placed it early and it waited), the gap from one call's select to the next call's
scoring kernel, and, once, the event-bracketed time of a graph holding a single tiny kernel (the
floor of the event method). Medians over `--replays` calls. "ends X after score" is the split
path's tail: from the scoring kernel's end (its last page's keys written) to the select's last id.
A workload on the fused path (one FusedRowsKernel per call, W5) prints the kernel's duration and
its select tail from the kernel's own stamps (ffi_dsa.cuda_options stamp_select: the global timer
when each query row's select may start, its row's last page scored, and when its last id is
written): "tail" is the call's last write after its last page (max done - max start over the
selects), "per row" the median select's own (from SM cycles), "its page loop" the median row's
time from its CTA's start on the pages to its select's start (global timer), all medians over the
replays; "loops end" the rows' page loops' ends (their selects' starts) after the call's first CTA
began on its pages: the first, the median and the last row's, and that of the row whose select
ends the call (whether the call waits for its slowest stream or for a select).
On either path a second line gives the phases of the select that ends last in each call (the
call's critical one), from the same stamps in SM cycles, medians over the replays: on the split
path "from its start" counts from the moment the scoring kernel's keys are readable to the CTA
(so the kernel boundary is the tail "after score" less this), "binned" includes the staging. The
line ends with the keys in that select's threshold bin (what its resolve ranks) and the most in any
select of the call (medians over the replays). On the split path a third line splits the scoring
kernel's CTAs (the stamped instance, from the same switch) into the chain from a CTA's first
instruction to its first page: past the grid wait, its page range known (the seq_lens scan), the
first page's TMA issued (after its block-table entry), the first segment's Q and the first page
arrived (both counted from the issue), then to its end; each span for the median CTA and for the
CTA that ended last, then how far apart the CTAs started and the first start to the last end.
`--rows` adds, on the split path, one stamped call's query rows against their lengths (row_waves):
when the last id came after the first select's start, how many selects started later than the
first wave (> 1 µs after it), a least-squares select time per 1K keys, and the rows that ended last
and the longest rows with their starts and own times: whether the rows run longest first and what
one row costs. `--queries N` times N query tokens per row; `--select-threads 512|1024` sets the split path's select
CTA size where a row gets one CTA (default: the schedule's); `--floor` adds a second line per workload with the
select stopped once its keys are staged and binned (ffi_dsa.cuda_options select_floor: nothing is
written), the split path's fixed cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile

import torch

import ffi_dsa  # noqa: E402
from ffi_dsa.cuda_options import (SCORE_INNER_SPANS, SCORE_SPANS, SELECT_PHASES, score_stamps,  # noqa: E402
                                  select_stamps, set_cuda_options, using_cuda_options)
from ffi_dsa.decode_reference import visible_lengths  # noqa: E402
from bench_gpu import Clock, _clock_hz, capture_graphs, rotating_sets, workloads  # noqa: E402

MB = 1 << 20


def median(xs) -> float:
    return statistics.median(xs) if xs else float("nan")


def tiny_graph_us(clock: Clock, replays: int) -> float:
    x = torch.zeros(16, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        x.add_(1)  # first use outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        graph.capture_begin()
        x.add_(1)
        graph.capture_end()
    torch.cuda.synchronize()
    return median(clock.time_each([graph.replay] * replays, head_start_s=5e-3)) * 1e6


def kernel_records(fns) -> list[dict]:
    """CUPTI kernel records of running fns back to back (after a head start), sorted by start."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.cuda._sleep(int(5e-3 * _clock_hz()))
        for fn in fns:
            fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel" and any(k in e["name"] for k in ("Score", "Select", "Fused"))]
    return sorted(kernels, key=lambda e: e["ts"])


LOOP_ENDS = ["ends_first", "ends_median", "ends_last", "ends_critical"]
# The threshold bin's keys of the call's last-ending select, and the most of any of its selects.
BIN_KEYS = ["bin_keys", "bin_keys_max"]


def stamped_selects(graphs, slots: int, replays: int) -> tuple[float, float, dict[str, float]]:
    """From the select stamps of `replays` stamped calls: the median call's last write after its
    last select's start (µs, global timer), the median select's own time (µs, SM cycles), and the
    phases of each call's last-ending select (µs, medians over the calls), with "loop": on the fused
    path the median row's page loop (its select's start after its CTA began on the pages, global
    timer; nan on the split path), and "ends_first", "ends_median", "ends_last", "ends_critical":
    the rows' loop ends after the call's first CTA began on its pages (the first, median and last
    row's, and the last-ending select's row's; nan on the split path), and "bin_keys",
    "bin_keys_max": the keys in the threshold bin of the last-ending select and the most of any of
    the call's selects. Under select_floor no select ends: then only the staging ("binned") of the
    last select to start is reported."""
    device = torch.cuda.current_device()
    hz = _clock_hz()
    names = [*SELECT_PHASES, "select", "loop", *LOOP_ENDS, *BIN_KEYS]
    call_tails, own, phases = [], [], {name: [] for name in names}
    for i in range(replays):
        graphs[i % len(graphs)].replay()
        started = [s for s in select_stamps(device, slots) if s is not None]
        done = [s for s in started if s.done_ns]
        if done:
            call_tails.append((max(s.done_ns for s in done) - max(s.start_ns for s in done)) / 1e3)
            own.append(median([(s.done - s.start) / hz * 1e6 for s in done]))
            last = max(done, key=lambda s: s.done_ns)
            for name, cycles in last.phases().items():
                phases[name].append(cycles / hz * 1e6)
            phases["bin_keys"].append(last.bin_keys)
            phases["bin_keys_max"].append(max(s.bin_keys for s in done))
            loops = [(s.start_ns - s.score_ns) / 1e3 for s in done if s.score_ns]
            if loops:
                phases["loop"].append(median(loops))
                first = min(s.score_ns for s in done if s.score_ns)
                ends = sorted((s.start_ns - first) / 1e3 for s in done if s.score_ns)
                critical = (max(done, key=lambda s: s.done_ns).start_ns - first) / 1e3
                for name, value in zip(LOOP_ENDS, (ends[0], median(ends), ends[-1], critical)):
                    phases[name].append(value)
        elif started:
            last = max(started, key=lambda s: s.start_ns)
            if last.binned:
                phases["binned"].append((last.binned - last.start) / hz * 1e6)
    return median(call_tails), median(own), {name: median(v) for name, v in phases.items()}


def scoring_chain(stamps) -> dict[str, float] | None:
    """One stamped call's ScorePagesKernel CTAs (`stamps`, None for a slot no CTA wrote): the spans
    (SCORE_SPANS and "cta", µs at the SM clock) of the median CTA with pages (the median of each span
    over those CTAs) and of the CTA that ended last ("last_" + span), "spread": the CTAs' starts from
    the first to the last, and "span": the first start to the last end (global timer, µs). None
    when no CTA had pages."""
    hz = _clock_hz()
    paged = [st for st in stamps if st is not None and st.has_pages and st.end_ns]
    if not paged:
        return None
    per = [st.spans() for st in paged]
    out = {name: median([p[name] for p in per]) / hz * 1e6 for name in per[0]}
    last = max(paged, key=lambda st: st.end_ns).spans()
    out.update({"last_" + name: value / hz * 1e6 for name, value in last.items()})
    started = [st.start_ns for st in stamps if st is not None]
    out["spread"] = (max(started) - min(started)) / 1e3
    out["span"] = (max(st.end_ns for st in paged) - min(started)) / 1e3
    return out


def stamped_scoring(graphs, replays: int, ctas: int) -> dict[str, float] | None:
    """scoring_chain of `replays` stamped calls, each value the median over the calls; `ctas`: the
    slots read, at least the scoring kernel's grid (one CTA an SM at most)."""
    device = torch.cuda.current_device()
    score_stamps(device, ctas)  # forget earlier calls
    chains = []
    for i in range(replays):
        graphs[i % len(graphs)].replay()
        chain = scoring_chain(score_stamps(device, ctas))
        if chain is not None:
            chains.append(chain)
    return {name: median([c[name] for c in chains]) for name in chains[0]} if chains else None


def scoring_line(name: str, chain: dict[str, float] | None) -> str:
    if chain is None:
        return f"{name:3s} scoring CTAs: none stamped"
    parts = " | ".join(f"{p} {chain[p]:4.2f}/{chain['last_' + p]:4.2f}" for p in (*SCORE_SPANS, "cta"))
    inner = " | ".join(f"{p} {chain[p]:4.2f}/{chain['last_' + p]:4.2f}" for p in SCORE_INNER_SPANS)
    return (f"{name:3s} scoring CTAs' chain, us (median CTA / the last to end): {parts}; "
            f"starts spread {chain['spread']:4.2f}, first start to last end {chain['span']:5.2f}; "
            f"inside: {inner}")


def row_waves(stamps, seen: list[int], name: str = "", top: int = 4) -> list[str]:
    """One split-path call's selects against their query rows' lengths: `stamps` by slot (slot r:
    query row r's select, by its cluster's first CTA), `seen` the query rows' lengths. Lines: the
    last id after the first select's start, the selects starting > 1 µs after it (the later waves),
    a least-squares select time per 1K keys, then the rows that ended last and the longest rows,
    each as (row, keys, start after the first start, own time) in µs on the global timer."""
    rows = [(r, s) for r, s in enumerate(stamps[:len(seen)]) if s is not None and s.done_ns]
    if not rows:
        return [f"{name:3s} rows: no select stamped"]
    t0 = min(s.start_ns for _, s in rows)
    start = {r: (s.start_ns - t0) / 1e3 for r, s in rows}
    own = {r: (s.done_ns - s.start_ns) / 1e3 for r, s in rows}
    keys = {r: seen[r] for r, _ in rows}
    later = sorted(start[r] for r in keys if start[r] > 1.0)
    mean_k = statistics.fmean(keys.values()) / 1e3
    mean_t = statistics.fmean(own.values())
    var = sum((keys[r] / 1e3 - mean_k) ** 2 for r in keys)
    slope = sum((keys[r] / 1e3 - mean_k) * (own[r] - mean_t) for r in keys) / var if var else float("nan")
    last = max(start[r] + own[r] for r in keys)

    def listed(order) -> str:
        return ", ".join(f"r{r} {keys[r]} keys at {start[r]:.2f} for {own[r]:.2f}" for r in order[:top])

    return [f"{name:3s} rows: {len(rows)} selects, the last id {last:.2f} us after the first start; "
            f"{len(later)} start later than 1 us after it"
            + (f" (the first at {later[0]:.2f})" if later else "")
            + f"; own time ~ {mean_t - slope * mean_k:.2f} + {slope:.3f} us per 1K keys",
            f"{name:3s} ended last: " + listed(sorted(keys, key=lambda r: -(start[r] + own[r]))),
            f"{name:3s} longest: " + listed(sorted(keys, key=lambda r: (-keys[r], r)))]


def phase_line(name: str, phases: dict[str, float]) -> str:
    parts = " | ".join(f"{p} {phases[p]:5.2f}" for p in SELECT_PHASES)
    return (f"{name:3s} the last select's phases, us: {parts} | from its start {phases['select']:5.2f} | "
            f"K-th bin keys {phases['bin_keys']:.0f} (the call's most {phases['bin_keys_max']:.0f})")


def timeline(name: str, spec: dict, clock: Clock, replays: int, max_sets: int, queries: int | None = None,
             label: str = "", rows: bool = False) -> str:
    """The kernels' times (`label` at its end), then the last select's phases; a third line, on the
    fused path the rows' loop ends, on the split path the scoring CTAs' chain to their first page."""
    rot = rotating_sets(spec["lens"], "cuda", 256 * MB, seed=11, max_sets=max_sets, queries=queries)

    def make_call(i):
        args, out = rot.set_args(i), rot.outs[i]
        return lambda: ffi_dsa.call(*args, out)

    graphs = capture_graphs(make_call, rot.sets, pool=torch.cuda.graph_pool_handle())
    for i in range(10):
        graphs[i % len(graphs)].replay()
    torch.cuda.synchronize()
    fns = [graphs[i % len(graphs)].replay for i in range(replays)]
    event_us = median(clock.time_each(fns, head_start_s=5e-3)) * 1e6
    ks = kernel_records(fns)
    fused = [e["dur"] for e in ks if "Fused" in e["name"]]
    # Every select's slot: rank x query rows + query row, ranks up to the largest cluster (16).
    slots = len(spec["lens"]) * (queries or 1) * (1 if fused else 16)
    select_stamps(torch.cuda.current_device(), slots)  # the stamp buffer exists before any capture
    with using_cuda_options(stamp_select=True):  # a stamped graph stamps on every replay
        stamped = capture_graphs(make_call, rot.sets, pool=torch.cuda.graph_pool_handle())
    call_tail, own, phases = stamped_selects(stamped, slots, replays)
    if fused:
        return (f"{name:3s} events {event_us:6.2f} us | fused {median(fused):6.2f} (n={len(fused)}) | select tail "
                f"{call_tail:5.2f} after the last page (per row {own:5.2f}; its page loop {phases['loop']:6.2f}){label}\n"
                + phase_line(name, phases) + label + "\n"
                + f"{name:3s} loops end, us after the first CTA's start: first {phases['ends_first']:6.2f} | median "
                f"{phases['ends_median']:6.2f} | last {phases['ends_last']:6.2f} | the row that ends the call "
                f"{phases['ends_critical']:6.2f}{label}")
    score = [e["dur"] for e in ks if "Score" in e["name"]]
    select = [e["dur"] for e in ks if "Select" in e["name"]]
    select_after, next_call = [], []
    for a, b in zip(ks, ks[1:]):
        end_a = a["ts"] + a["dur"]
        if "Score" in a["name"] and "Select" in b["name"]:
            select_after.append(b["ts"] + b["dur"] - end_a)
        elif "Select" in a["name"]:
            next_call.append(b["ts"] - end_a)
    sms = torch.cuda.get_device_properties(0).multi_processor_count  # the scoring grid's most CTAs
    text = (f"{name:3s} events {event_us:6.2f} us | score {median(score):6.2f} (n={len(score)}) | select "
            f"{median(select):6.2f}, ends {median(select_after):6.2f} after score | select -> next call "
            f"{median(next_call):5.2f}{label}\n" + phase_line(name, phases) + label + "\n"
            + scoring_line(name, stamped_scoring(stamped, replays, sms)) + label)
    if rows:  # one more stamped call, alone in the stamp buffer (every set has the workload's rows)
        device = torch.cuda.current_device()
        select_stamps(device, slots)
        stamped[0].replay()
        seen = list(visible_lengths(spec["lens"], queries or 1, int(rot.mega.block_table.shape[1])))
        text += "\n" + "\n".join(line + label for line in row_waves(select_stamps(device, slots), seen, name))
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="?", default="C2,W1,W3,W5,W6")
    parser.add_argument("--replays", type=int, default=40)
    parser.add_argument("--max-sets", type=int, default=64)
    parser.add_argument("--queries", type=int, default=None, help="N query tokens per row (default: 1, rank-3 q)")
    parser.add_argument("--floor", action="store_true", help="also time the select stopped after staging")
    parser.add_argument("--rows", action="store_true",
                        help="the split path: one call's query rows, their select starts and times against their lengths")
    parser.add_argument("--select-threads", type=int, default=0, choices=[0, 512, 1024],
                        help="SelectRowsKernel's CTA size for rows on one CTA (ffi_dsa.cuda_options; 0: the schedule's)")
    a = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernel_timeline: needs a CUDA GPU")
        return 1
    clock = Clock("cuda")
    print(f"one tiny kernel in a graph, event-bracketed: {tiny_graph_us(clock, 200):.2f} us", flush=True)
    specs = workloads()
    n = f" N={a.queries}" if a.queries else ""
    if a.select_threads:
        n += f" select_threads={a.select_threads}"
        set_cuda_options(select_threads=a.select_threads)
    for name in a.workloads.split(","):
        print(timeline(name, specs[name], clock, a.replays, a.max_sets, a.queries, n, a.rows), flush=True)
        if a.floor:
            with using_cuda_options(select_floor=True):
                print(timeline(name, specs[name], clock, a.replays, a.max_sets, a.queries, n + " floor"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
