"""GPU benchmark: ffi_dsa against the memory floor, the naive torch version and the production chain.

    python benchmarks/bench_gpu.py [--json PATH] [--plot PATH] [--workloads W1,W5,...]
    python -m ffi_dsa bench [same options]           (when torch sees a GPU)
    python benchmarks/bench_gpu.py --device cpu --smoke   (plumbing check without a GPU)
    python benchmarks/bench_gpu.py --workloads serving,wide --ids slots,positions --no-naive
                                     (what ids="positions" and max_seq_len cost: one call)

For every workload (W1..W6: serving-sized; C1..C5: small, like the public FlashInfer-Bench set):
  floor      (132 B x context tokens + B x (8192 + 256 + 8192) B) / device copy bandwidth, the
             bandwidth measured in this same run (a large device-to-device torch copy, bytes read +
             written over time)
  graph      ffi_dsa.call captured into CUDA graphs, median of >= 20 replays, each timed with CUDA
             events, inputs rotated over >= 256 MB so the K cache is not L2-resident (see
             `rotating_sets` and `time_graph_replays` for how, and why no copy is timed)
  in-graph   per call when N consecutive calls (each on its own input set) share one CUDA graph,
             as every layer's call shares a serving engine's decode-step graph: the graph launch
             (~3.7 us on the H100, which the single-call figure includes) is spread over N calls
  eager      ffi_dsa.call from Python, timed the same way (host overhead included)
  naive      benchmarks/naive_torch.py (eager), unless it would not fit in memory or takes > 1 s
  DG+FI      DeepGEMM fp8_paged_mqa_logits + FlashInfer top_k_page_table_transform, live, only when
             both import
  peer chain the same chain measured on an H100 by the peer study (a fixed reference table below)
Each ffi_dsa result is checked once with ffi_dsa.check_topk (float64 reference, contract tolerance, docs/contract.md),
on a subset of rows for large batches.

W7 (B = 48, U(1K..8K)) is short rows only; at N = 4 its 192 query rows are more than the SMs.
The decode options: W1w/W3w/W5w/W7w are W1/W3/W5/W7's rows in block tables 2560 pages wide (the
model's longest context, as engines allocate them), and W1wh/W3wh/W5wh/W7wh the same calls given
``max_seq_len`` = the batch's longest row (vLLM's bound); a summary line gives each wide form's cost
against the narrow table. ``--ids slots,positions`` times every workload with each id kind on the
same input sets (graph and in-graph replays; the first kind's figures fill the table, the others a
ratio column and the JSON), after checking that positions mapped through the block table are the
slots byte for byte: W5 (and the rows of at most K tokens) take the one-kernel path, the others the
two-kernel path. Workload groups: ``serving`` (W1..W6), ``contest`` (C1..C5), ``wide`` (W1, W3, W5
and their wide forms).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import re
import statistics
import sys
import time
import traceback
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import torch  # noqa: E402

import ffi_dsa  # noqa: E402
from gpu_batches import TorchBatch, make_batch_torch, remap_ids  # noqa: E402
from ffi_dsa.contract import DEFAULT_TOPK as TOPK  # noqa: E402
from ffi_dsa.contract import HEAD_DIM, NUM_HEADS, PAGE_BYTES, PAGE_TOKENS, TOKEN_BYTES  # noqa: E402
from ffi_dsa.workloads import MODEL_TABLE_PAGES  # noqa: E402
MB = 1 << 20

# The production chain measured on an H100 by the peer study, 2026-11-22: DeepGEMM 2.6.1
# fp8_paged_mqa_logits (+ get_paged_mqa_logits_metadata) then FlashInfer 0.7.2
# top_k_page_table_transform; CUDA-graph replay, inputs rotated over 256 MB, median us per call;
# copy bandwidth 2.97-3.01 TB/s (the project's shared notes, "The production chain measured on an
# H100 (2026-11-22)"; docs/performance.md). These are reference values, not measured by this script.
PEER_H100_2026_11_22 = {
    "W1": {"floor": 0.37, "deepgemm_logits": 4.0, "flashinfer_topk": 9.3, "chain_graph": 13.3, "chain_eager": 38.9, "naive": 101},
    "W2": {"floor": 5.76, "deepgemm_logits": 9.9, "flashinfer_topk": 17.0, "chain_graph": 27.3, "chain_eager": 88.6, "naive": 341},
    "W3": {"floor": 2.97, "deepgemm_logits": 6.7, "flashinfer_topk": 8.2, "chain_graph": 15.1, "chain_eager": 38.9, "naive": 181},
    "W4": {"floor": 51.5, "deepgemm_logits": 60.0, "flashinfer_topk": 21.1, "chain_graph": 82.4, "chain_eager": 87.1, "naive": 4063},
    "W5": {"floor": 46.7, "deepgemm_logits": 55.3, "flashinfer_topk": 11.7, "chain_graph": 67.0, "chain_eager": 71.0, "naive": 2132},
    "W6": {"floor": 23.1, "deepgemm_logits": 29.8, "flashinfer_topk": 19.3, "chain_graph": 50.4, "chain_eager": 93.9, "naive": 1110},
}


# ----------------------------------------------------------------------------------- workloads
def _contest_lengths(rng, batch: int, long_rows: int, long_max: int = 6000) -> np.ndarray:
    """Mostly <= 2048 tokens (as in the public FlashInfer-Bench set), a few rows up to ~6K."""
    lens = rng.integers(1, 2049, size=batch)
    lens[rng.choice(batch, size=min(long_rows, batch), replace=False)] = rng.integers(2049, long_max + 1,
                                                                                        size=min(long_rows, batch))
    return lens


def workloads(seed: int = 1234) -> dict[str, dict]:
    rng = np.random.default_rng(seed)
    w = {
        "W1": {"lens": np.full(1, 8192), "desc": "B=1 x 8K"},
        "W2": {"lens": np.full(1, 131072), "desc": "B=1 x 128K"},
        "W3": {"lens": np.full(16, 4096), "desc": "B=16 x 4K"},
        "W4": {"lens": rng.integers(1024, 32768 + 1, size=64), "desc": "B=64, U(1K..32K)"},
        "W5": {"lens": np.full(128, 8192), "desc": "B=128 x 8K"},
        "W6": {"lens": np.full(8, 65536), "desc": "B=8 x 64K"},
        "C1": {"lens": rng.integers(1, 3000 + 1, size=8), "desc": "B=8, U(1..3000)"},
        "C2": {"lens": np.array([1500]), "desc": "B=1 x 1500"},
        "C3": {"lens": _contest_lengths(rng, 4, 1), "desc": "B=4, <=2K + one <=6K"},
        "C4": {"lens": _contest_lengths(rng, 13, 2), "desc": "B=13, <=2K + two <=6K"},
        "C5": {"lens": _contest_lengths(rng, 31, 3), "desc": "B=31, <=2K + three <=6K"},
        "L1": {"lens": np.full(1, 1 << 20), "desc": "B=1 x 1M"},
        "L2": {"lens": np.full(256, 2049), "desc": "B=256 x 2049"},
        # short rows only (a generator of its own: the others' lengths stay as they were). At N = 4,
        # 192 query rows, past one wave of 1024-thread select CTAs: W7w (no max_seq_len) times what
        # a plan for the table's width costs short rows
        "W7": {"lens": np.random.default_rng(seed + 7).integers(1024, 8192 + 1, size=48), "desc": "B=48, U(1K..8K)"},
    }
    # The same rows in block tables as wide as serving engines allocate them (the model's longest
    # context, 163840 tokens): the cost must not follow the table's width; with the caller's bound on
    # the longest row (max_seq_len, as vLLM passes it) the select plans for the rows, not the table.
    for name in ("W1", "W3", "W5", "W7"):
        w[name + "w"] = {"lens": w[name]["lens"], "desc": w[name]["desc"] + ", table 2560 pages",
                         "table_pages": MODEL_TABLE_PAGES}
        w[name + "wh"] = {**w[name + "w"], "desc": w[name + "w"]["desc"] + ", max_seq_len",
                          "max_seq_len": int(np.max(w[name]["lens"]))}
    for item in w.values():
        item["lens"] = np.asarray(item["lens"], dtype=np.int64)
    return w


# names --workloads takes for several workloads at once
WORKLOAD_GROUPS = {
    "serving": ["W1", "W2", "W3", "W4", "W5", "W6"],
    "contest": ["C1", "C2", "C3", "C4", "C5"],
    "wide": ["W1", "W1w", "W1wh", "W3", "W3w", "W3wh", "W5", "W5w", "W5wh"],
}
IDS = ("slots", "positions")


def workload_names(text: str, known) -> list[str]:
    """--workloads as names, groups expanded, each once, in order ("all": every workload)."""
    if text == "all":
        return list(known)
    names = []
    for item in (n.strip() for n in text.split(",") if n.strip()):
        for name in WORKLOAD_GROUPS.get(item, [item]):
            if name not in names:
                names.append(name)
    return names


def floor_bytes(lens: np.ndarray) -> int:
    """Fewest bytes one call must move: the K cache once, plus q, weights and the output per row."""
    per_row = NUM_HEADS * HEAD_DIM + NUM_HEADS * 4 + TOPK * 4  # q, weights, output
    return int(TOKEN_BYTES * np.clip(lens, 0, None).sum() + len(lens) * per_row)


# ------------------------------------------------------------------------------------- timing
class Clock:
    """Device timing: CUDA events on a GPU, time.perf_counter (after a sync) on the CPU."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def time_each(self, fns, head_start_s: float = 0.0, retries: int = 2) -> list[float]:
        """Seconds taken by each fn() in `fns`, run back to back in order.

        On CUDA each call is bracketed by two events. With `head_start_s` > 0 the stream first
        sleeps that long on the device, so the host enqueues every call before the GPU reaches
        the first: the events then see device time only, not host launch gaps. If the host was
        slower than the head start (a briefly busy host: one v9.1 run reported 182 us for a 20 us
        call), the measurement is repeated with twice the host time as head start (at most 0.1 s),
        up to `retries` times. That cannot help when the calls outnumber the driver's launch queue:
        the host then waits for the device whatever the head start (measured: 2000 small kernels).
        """
        if not self.cuda:
            out = []
            for fn in fns:
                start = time.perf_counter()
                fn()
                out.append(time.perf_counter() - start)
            return out
        for attempt in range(retries + 1):
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in fns]
            torch.cuda.synchronize()
            if head_start_s > 0 and hasattr(torch.cuda, "_sleep"):
                torch.cuda._sleep(int(head_start_s * _clock_hz()))
            host_start = time.perf_counter()
            for (start, end), fn in zip(events, fns):
                start.record()
                fn()
                end.record()
            host_s = time.perf_counter() - host_start
            torch.cuda.synchronize()
            if not (head_start_s > 0 and host_s > head_start_s):
                break
            again = attempt < retries
            print(f"    note: enqueueing took {host_s * 1e3:.2f} ms > head start {head_start_s * 1e3:.2f} ms; "
                  + ("measuring again with a longer head start" if again else "the last calls may include host gaps"),
                  flush=True)
            head_start_s = min(2 * host_s, 0.1)
        return [start.elapsed_time(end) / 1e3 for start, end in events]


def _clock_hz() -> float:
    try:
        return float(torch.cuda.get_device_properties(0).clock_rate) * 1e3  # kHz -> Hz
    except Exception:  # noqa: BLE001  (attribute absent in some torch versions)
        return 2.0e9


def copy_bandwidth(device: str, nbytes: int, runs: int = 10) -> float:
    """Bytes read + written per second of a large device-to-device copy (median)."""
    clock = Clock(device)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src.random_(0, 255) if device == "cuda" else src.fill_(1)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = clock.time_each([lambda: dst.copy_(src)] * runs)
    return 2 * nbytes / statistics.median(times)


# --------------------------------------------------------------------------- rotating inputs
@dataclass
class Rotation:
    """`sets` independent input sets (same shapes) over one shared K cache of >= rotate bytes."""

    mega: TorchBatch
    batch: int
    sets: int
    outs: list = field(default_factory=list)

    def set_args(self, i: int):
        return self.mega.rows(i * self.batch, (i + 1) * self.batch).args()

    @property
    def cache_bytes(self) -> int:
        return int(self.mega.k_cache.numel())


def rotating_sets(lens: np.ndarray, device: str, rotate_bytes: int, seed: int, max_sets: int,
                  max_pages: int | None = None, queries: int | None = None, heads: int = NUM_HEADS) -> Rotation:
    """Input sets for L2-cold timing, made in one go.

    Why: the H100 has 50 MB of L2, so replaying one call on one input measures the cache, not
    HBM. Instead of copying fresh inputs in before each call (which would put copy time inside
    or next to the measurement), we make ``sets`` complete, independent input sets up front and
    capture one CUDA graph per set: replay i runs set i % sets, and nothing but the op runs
    between the events. All sets are the rows of one tall batch (the workload's lengths tiled
    ``sets`` times) whose pages are drawn without replacement from one permuted pool, so set i
    reads its own pages, scattered over a cache of >= `rotate_bytes` (256 MB by default), and
    no page is reused within the next sets - 1 replays. ``queries`` and ``heads`` shape q as
    ``make_batch_torch`` does.
    """
    k_bytes = max(1, int(((np.clip(lens, 0, None) + PAGE_TOKENS - 1) // PAGE_TOKENS).sum()) * PAGE_BYTES)
    sets = int(min(max_sets, max(2, math.ceil(rotate_bytes / k_bytes))))
    mega = make_batch_torch(np.tile(lens, sets), seed=seed, device=device, max_pages=max_pages, queries=queries,
                            heads=heads)
    rot = Rotation(mega=mega, batch=len(lens), sets=sets)
    shape = mega.rows(0, len(lens)).output_shape(TOPK)
    rot.outs = [torch.full(shape, -7, dtype=torch.int32, device=device) for _ in range(sets)]
    return rot


def call_groups(make_call, sets: int, per_group: int):
    """(make_group, groups, calls): make_group(g) returns one zero-argument call that makes `calls`
    consecutive sets' calls, from set g * calls on (wrapping), where calls is per_group within
    [1, sets]; `groups` of them cover every set. make_call(i) returns the call for set i."""
    calls = max(1, min(per_group, sets))

    def make_group(g):
        fns = [make_call((g * calls + j) % sets) for j in range(calls)]
        return lambda: [fn() for fn in fns]

    return make_group, math.ceil(sets / calls), calls


def in_graph_us(clock: Clock, make_call, sets: int, calls_per_graph: int, replays: int, warmup: int):
    """(median µs per call, calls per graph) with `calls_per_graph` consecutive sets' calls in one
    CUDA graph (see the module docstring); make_call(i) returns the zero-argument call for set i."""
    make_group, groups, calls = call_groups(make_call, sets, calls_per_graph)
    graphs = capture_graphs(make_group, groups, pool=torch.cuda.graph_pool_handle())
    times = time_graph_replays(clock, graphs, replays, warmup)
    del graphs
    return statistics.median(times) / calls * 1e6, calls


def capture_graphs(make_call, sets: int, pool=None) -> list:
    """One CUDA graph per input set; make_call(i) returns the zero-argument call for set i."""
    graphs = []
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    # a warm-up call on the capture stream (first-use work must not happen inside a capture)
    with torch.cuda.stream(stream):
        make_call(0)()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    for i in range(sets):
        graph = torch.cuda.CUDAGraph()
        # the low-level capture API: torch.cuda.graph() would sync, empty the cache and maybe
        # gc.collect() for each of the (up to a thousand) small graphs.
        with torch.cuda.stream(stream):
            graph.capture_begin(pool=pool)
            make_call(i)()
            graph.capture_end()
        graphs.append(graph)
    torch.cuda.synchronize()
    return graphs


def time_graph_replays(clock: Clock, graphs: list, replays: int, warmup: int) -> list[float]:
    """Per-replay device time, rotating through the graphs (see rotating_sets)."""
    n = len(graphs)
    for i in range(warmup):
        graphs[i % n].replay()
    clock.sync()
    fns = [graphs[(warmup + i) % n].replay for i in range(replays)]
    # ~30 us of host time per replay is plenty to let the host get ahead of the device
    return clock.time_each(fns, head_start_s=max(2e-3, 30e-6 * replays))


def time_rotating_calls(clock: Clock, make_call, sets: int, calls: int, warmup: int) -> list[float]:
    for i in range(warmup):
        make_call(i % sets)()
    clock.sync()
    return clock.time_each([make_call((warmup + i) % sets) for i in range(calls)])


# ---------------------------------------------------------------------------------- baselines
def naive_bytes_estimate(lens: np.ndarray) -> int:
    """Peak bytes of naive_torch on a padded [B, max_pages * 64] batch: the gathered fp8 keys,
    three float32 copies of them, and three [B, 64, n] float32 logit-sized tensors."""
    slots = len(lens) * int(((lens.max(initial=0) + PAGE_TOKENS - 1) // PAGE_TOKENS) * PAGE_TOKENS)
    return slots * (128 * (1 + 4 + 4 + 4) + 64 * 4 * 3 + 64)


def token_page_table(batch: TorchBatch) -> torch.Tensor:
    """[B, max_pages * 64] int32 global token ids (page * 64 + slot), for FlashInfer's transform."""
    table = batch.block_table.long()
    slots = torch.arange(PAGE_TOKENS, device=table.device)
    ids = table[:, :, None] * PAGE_TOKENS + slots
    ids = torch.where(table[:, :, None] >= 0, ids, torch.full_like(ids, -1))
    return ids.reshape(table.shape[0], -1).to(torch.int32).contiguous()


def load_production_chain():
    """(make_chain, versions) for DeepGEMM logits + FlashInfer top-k, or (None, reason)."""
    try:
        import deep_gemm  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (ImportError, or a wheel built for another torch)
        return None, f"DeepGEMM not importable ({type(exc).__name__}: {str(exc)[:80]})"
    try:
        import flashinfer  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return None, f"FlashInfer not importable ({type(exc).__name__}: {str(exc)[:80]})"
    if not hasattr(flashinfer, "top_k_page_table_transform"):
        return None, "FlashInfer has no top_k_page_table_transform"
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count

    def make_chain(batch: TorchBatch):
        q, k_cache, weights, seq_lens, block_table = batch.args()
        b = q.shape[0]
        max_ctx = block_table.shape[1] * PAGE_TOKENS
        q4 = q.view(b, 1, 64, 128)
        kv = k_cache.view(torch.uint8)
        src_table = token_page_table(batch)
        # newer DeepGEMM takes context_lens as [B, next_n]; older as [B]
        ctx = seq_lens
        try:  # probe the signature once
            deep_gemm.get_paged_mqa_logits_metadata(ctx, PAGE_TOKENS, num_sms)
        except Exception:  # noqa: BLE001
            ctx = seq_lens.view(b, 1)

        def chain():
            m = deep_gemm.get_paged_mqa_logits_metadata(ctx, PAGE_TOKENS, num_sms)
            logits = deep_gemm.fp8_paged_mqa_logits(q4, kv, weights, ctx, block_table, m, max_ctx, False)
            return flashinfer.top_k_page_table_transform(logits, src_table, seq_lens, TOPK)

        return chain

    versions = f"deep_gemm {getattr(deep_gemm, '__version__', '?')}, flashinfer {getattr(flashinfer, '__version__', '?')}"
    return make_chain, versions


# ------------------------------------------------------------------------------------- checks
def check_rows(lens: np.ndarray, budget_tokens: int) -> list[int]:
    """Rows to check: the longest and the shortest first, then in order, within a token budget."""
    order = [int(np.argmax(lens)), int(np.argmin(lens))] + list(range(len(lens)))
    chosen, total = [], 0
    for r in order:
        if r in chosen:
            continue
        if chosen and total + int(max(lens[r], 0)) > budget_tokens:
            continue
        chosen.append(r)
        total += int(max(lens[r], 0))
    return sorted(chosen)


def check_result(out: torch.Tensor, batch: TorchBatch, rows: list[int], ids: str = "slots") -> list[str]:
    """check_topk on `rows` only: a compact copy of those rows and their pages (host float64).
    Positions need no remapping: they do not name pages."""
    sub, page_map = batch.compact(rows)
    got = out[rows].cpu().numpy()
    if ids == "slots":
        got = remap_ids(got, page_map)
    problems = ffi_dsa.check_topk(got, *sub.args(), ids=ids)  # check_topk copies tensors to the host
    renamed = []
    for p in problems:  # name the rows of the full batch
        m = re.match(r"row (\d+):", p)
        renamed.append(f"row {rows[int(m.group(1))]}:{p[m.end():]}" if m else p)
    return renamed


# --------------------------------------------------------------------------------------- main
def fmt(x, spec=".1f", none="-"):
    return none if x is None else format(x, spec)


def run_workload(name: str, spec: dict, a, clock: Clock, bandwidth: float, chain_maker) -> dict:
    lens = spec["lens"]
    device = a.device
    r = {"name": name, "desc": spec["desc"], "batch": int(len(lens)), "tokens": int(np.clip(lens, 0, None).sum()),
         "max_len": int(lens.max()), "floor_bytes": floor_bytes(lens)}
    r["floor_us"] = r["floor_bytes"] / bandwidth * 1e6
    t0 = time.perf_counter()
    rot = rotating_sets(lens, device, a.rotate_mb * MB, seed=a.seed + zlib.crc32(name.encode()) % 1000,
                        max_sets=a.max_sets, max_pages=spec.get("table_pages"))
    clock.sync()
    r["sets"], r["rotation_mb"] = rot.sets, rot.cache_bytes / MB
    print(f"  {name} ({spec['desc']}, {r['tokens']} tokens): {rot.sets} input sets over "
          f"{rot.cache_bytes / MB:.0f} MB of K cache, generated in {time.perf_counter() - t0:.2f} s", flush=True)

    r["ids"], r["max_seq_len"] = a.ids[0], spec.get("max_seq_len")

    def caller(ids: str):
        """make_call(i) of the workload's calls with `ids`: the zero-argument call for set i."""
        options = {"ids": ids, "max_seq_len": spec.get("max_seq_len")}

        def make_call(i):
            args, out = rot.set_args(i), rot.outs[i]
            return lambda: ffi_dsa.call(*args, out, **options)
        return make_call

    make_call = caller(a.ids[0])

    # correctness first: one eager call on set 0, poisoned output, checked on a row subset
    set0 = rot.mega.rows(0, rot.batch)
    rot.outs[0].fill_(-7)
    make_call(0)()
    clock.sync()
    reference_out = rot.outs[0].clone()
    rows = check_rows(lens, a.check_tokens)
    t0 = time.perf_counter()
    try:
        problems = check_result(rot.outs[0], set0, rows, a.ids[0])
    except Exception as exc:  # noqa: BLE001
        problems = [f"check crashed: {type(exc).__name__}: {exc}"]
    r["check"] = "PASS" if not problems else "FAIL"
    r["check_rows"] = len(rows)
    r["problems"] = problems[:3]
    print(f"    check on {len(rows)}/{len(lens)} rows: {r['check']}{(' - ' + problems[0]) if problems else ''} "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)

    # ffi_dsa eager (host overhead included: no head start)
    eager = time_rotating_calls(clock, make_call, rot.sets, a.replays, a.warmup)
    r["eager_us"] = statistics.median(eager) * 1e6

    # ffi_dsa under CUDA-graph replay
    r["graph_us"] = None
    if clock.cuda and not a.no_graph:
        try:
            t0 = time.perf_counter()
            graphs = capture_graphs(make_call, rot.sets, pool=torch.cuda.graph_pool_handle())
            capture_s = time.perf_counter() - t0
            rot.outs[0].fill_(-7)  # the warm-up replays start with set 0: its output is rewritten
            times = time_graph_replays(clock, graphs, a.replays, a.warmup)
            r["graph_us"] = statistics.median(times) * 1e6
            r["graph_spread_us"] = [min(times) * 1e6, max(times) * 1e6]
            same = bool(torch.equal(rot.outs[0], reference_out))
            r["graph_matches_eager"] = same
            print(f"    graphs captured in {capture_s:.2f} s; replay output {'==' if same else '!='} eager output",
                  flush=True)
            if not same:
                r["check"] = "FAIL"
                r["problems"].insert(0, "graph replay output differs from the eager output (nondeterminism?)")
            del graphs
            r["in_graph_us"], r["in_graph_calls"] = in_graph_us(clock, make_call, rot.sets, a.calls_per_graph,
                                                                a.replays, a.warmup)
        except Exception as exc:  # noqa: BLE001
            r["graph_error"] = f"{type(exc).__name__}: {exc}"
            print(f"    graph capture/replay failed: {r['graph_error']}", flush=True)
    # the other id kinds: the same selection on set 0, then (CUDA) their times on the same sets
    r["by_ids"] = {ids: other_ids(caller(ids), rot, set0, reference_out, a, clock, ids) for ids in a.ids[1:]}
    if any(not t["same_selection"] for t in r["by_ids"].values()):
        r["check"] = "FAIL"
        r["problems"].insert(0, "another id kind selected other tokens")
    best = r["graph_us"] if r["graph_us"] is not None else r["eager_us"]
    r["tokens_per_s"] = r["tokens"] / (best * 1e-6)
    r["pct_floor"] = 100.0 * r["floor_us"] / best

    # naive torch (eager), on a standalone copy of set 0 (its own compact cache)
    r["naive_us"], r["naive_note"] = None, None
    if not a.no_naive:
        need = naive_bytes_estimate(lens)
        free = torch.cuda.mem_get_info()[0] if clock.cuda else 16 << 30
        if need > 0.5 * free:
            r["naive_note"] = f"skipped: needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
        else:
            from naive_torch import naive_topk_indexer

            solo, _ = set0.compact(range(rot.batch))
            args = solo.args()
            try:
                clock.sync()
                t0 = time.perf_counter()
                naive_topk_indexer(*args, topk=TOPK)
                clock.sync()
                first = time.perf_counter() - t0
                naive_topk_indexer(*args, topk=TOPK)
                clock.sync()
                once = time.perf_counter() - t0 - first
                if once > 1.0:
                    r["naive_note"] = f"skipped: one call took {once:.1f} s (> 1 s)"
                else:
                    n = 3 if once > 0.2 else 10
                    times = clock.time_each([lambda: naive_topk_indexer(*args, topk=TOPK)] * n)
                    r["naive_us"] = statistics.median(times) * 1e6
            except (torch.cuda.OutOfMemoryError, MemoryError) as exc:
                r["naive_note"] = f"skipped: out of memory ({str(exc)[:60]})"
            del solo, args
            if clock.cuda:
                torch.cuda.empty_cache()
        if r["naive_note"]:
            print(f"    naive torch {r['naive_note']}", flush=True)

    # DeepGEMM + FlashInfer, live
    r["chain_graph_us"] = r["chain_eager_us"] = None
    if chain_maker is not None and clock.cuda:
        try:
            chains = [chain_maker(rot.mega.rows(i * rot.batch, (i + 1) * rot.batch)) for i in range(rot.sets)]
            eager = time_rotating_calls(clock, lambda i: chains[i], rot.sets, a.replays, a.warmup)
            r["chain_eager_us"] = statistics.median(eager) * 1e6
            graphs = capture_graphs(lambda i: chains[i], rot.sets)  # private pools: the chain allocates
            times = time_graph_replays(clock, graphs, a.replays, a.warmup)
            r["chain_graph_us"] = statistics.median(times) * 1e6
            del graphs, chains
        except Exception as exc:  # noqa: BLE001
            r["chain_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            print(f"    DeepGEMM+FlashInfer failed: {r['chain_error']}", flush=True)

    peer = None if a.smoke else PEER_H100_2026_11_22.get(name)  # smoke sizes are not the peer's
    r["peer_chain_graph_us"] = peer["chain_graph"] if peer else None
    r["peer_naive_us"] = peer["naive"] if peer else None
    r["vs_naive"] = r["naive_us"] / r["eager_us"] if r["naive_us"] else None          # eager vs eager
    r["vs_peer_chain"] = (r["peer_chain_graph_us"] / r["graph_us"]
                          if peer and r["graph_us"] else None)                            # graph vs graph
    r["vs_live_chain"] = (r["chain_graph_us"] / r["graph_us"]
                          if r["chain_graph_us"] and r["graph_us"] else None)
    print(f"    floor {r['floor_us']:.2f} us | graph {fmt(r['graph_us'], '.2f')} us | "
          f"in-graph x{r.get('in_graph_calls', '-')} {fmt(r.get('in_graph_us'), '.2f')} us | eager {r['eager_us']:.2f} us | "
          f"naive {fmt(r['naive_us'], '.0f')} us", flush=True)
    return r


def as_slots(out: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """An output of positions as global slots through the block table (one table row per query
    row's batch row); -1 kept."""
    rows = out.reshape(block_table.shape[0], -1)
    t = rows.clamp(min=0).long()
    page = torch.gather(block_table.long(), 1, t // PAGE_TOKENS)
    return torch.where(rows >= 0, page * PAGE_TOKENS + t % PAGE_TOKENS, -1).to(torch.int32).reshape(out.shape)


def other_ids(make_call, rot: Rotation, set0: TorchBatch, first_out: torch.Tensor, a, clock: Clock,
              ids: str) -> dict:
    """The workload's calls with another id kind: its output on set 0 against the first kind's
    (positions mapped to slots), then on CUDA its graph and in-graph times on the same input sets."""
    rot.outs[0].fill_(-7)
    make_call(0)()
    clock.sync()
    mine, theirs = rot.outs[0], first_out
    if ids == "positions":
        mine = as_slots(mine, set0.block_table)
    elif a.ids[0] == "positions":
        theirs = as_slots(theirs, set0.block_table)
    same = bool(torch.equal(mine, theirs))
    if not clock.cuda or a.no_graph:
        print(f"    ids={ids}: the same selection as ids={a.ids[0]}: {'yes' if same else 'NO'}", flush=True)
        return {"same_selection": same}
    graphs = capture_graphs(make_call, rot.sets, pool=torch.cuda.graph_pool_handle())
    graph = statistics.median(time_graph_replays(clock, graphs, a.replays, a.warmup)) * 1e6
    del graphs
    in_graph, _ = in_graph_us(clock, make_call, rot.sets, a.calls_per_graph, a.replays, a.warmup)
    print(f"    ids={ids}: graph {graph:.2f} us | in-graph {in_graph:.2f} us | the same selection as "
          f"ids={a.ids[0]}: {'yes' if same else 'NO'}", flush=True)
    return {"graph_us": graph, "in_graph_us": in_graph, "same_selection": same}


def print_option_summary(results: list[dict]) -> None:
    """The decode options' costs: each other id kind against the first, and each wide table (with
    and without max_seq_len) against the same rows in a narrow table (in-graph times)."""
    by_name = {r["name"]: r for r in results}
    for r in results:
        for ids, t in r.get("by_ids", {}).items():
            if r.get("in_graph_us") and t.get("in_graph_us"):
                print(f"{r['name']}: ids={ids} / ids={r['ids']} = {t['in_graph_us'] / r['in_graph_us']:.3f} in-graph, "
                      f"{t['graph_us'] / r['graph_us']:.3f} graph" + ("" if t["same_selection"] else "  DIFFERENT IDS"))
    for base in ("W1", "W3", "W5"):
        narrow = by_name.get(base, {}).get("in_graph_us")
        for form, what in ((base + "w", "table 2560 pages"), (base + "wh", "table 2560 pages + max_seq_len")):
            wide = by_name.get(form, {}).get("in_graph_us")
            if narrow and wide:
                print(f"{form}: {what} vs {base}: {100 * (wide / narrow - 1):+.1f}% in-graph "
                      f"({wide:.2f} vs {narrow:.2f} us)")


def print_table(results: list[dict], bandwidth: float, chain_note: str) -> None:
    print()
    print(f"ffi_dsa, K={TOPK}; copy bandwidth {bandwidth / 1e12:.3f} TB/s (read + write); times in us, "
          "median per call")
    head = (f"{'wl':<4} {'B':>4} {'tokens':>8} {'floor':>7} {'graph':>8} {'in-graph':>8} {'eager':>8} {'tokens/s':>9} "
            f"{'%floor':>6} {'vs naive':>8} {'chain*':>7} {'vs chain*':>9} {'vs DG+FI':>8}  check")
    print(head)
    print("-" * len(head))
    for r in results:
        print(f"{r['name']:<4} {r['batch']:>4} {r['tokens']:>8} {r['floor_us']:>7.2f} {fmt(r['graph_us'], '.2f'):>8} "
              f"{fmt(r.get('in_graph_us'), '.2f'):>8} "
              f"{r['eager_us']:>8.2f} {r['tokens_per_s']:>9.2e} {r['pct_floor']:>5.0f}% "
              f"{fmt(r['vs_naive'], '.1f') + ('x' if r['vs_naive'] else ''):>8} "
              f"{fmt(r['peer_chain_graph_us'], '.1f'):>7} "
              f"{fmt(r['vs_peer_chain'], '.2f') + ('x' if r['vs_peer_chain'] else ''):>9} "
              f"{fmt(r['vs_live_chain'], '.2f') + ('x' if r['vs_live_chain'] else ''):>8}  {r['check']}")
    print("-" * len(head))
    print("graph: CUDA-graph replay, inputs rotated over >= 256 MB (L2-cold); in-graph: per call with N calls in one "
          "graph (N = --calls-per-graph, at most the sets); eager: Python call; %floor = floor/time "
          "(graph time where there is one)")
    print("vs naive = naive torch eager / ffi_dsa eager; chain* = DeepGEMM+FlashInfer graph time (us) measured "
          "2026-11-22 on an H100 by the peer study (reference value, not this run); vs chain* = chain* / ffi_dsa graph;")
    print(f"vs DG+FI = the same chain measured live in this run / ffi_dsa graph ({chain_note})")
    skipped = [f"{r['name']}: {r['naive_note']}" for r in results if r.get("naive_note")]
    if skipped:
        print("naive torch " + "; ".join(skipped))


def plot(results: list[dict], path: Path, title: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not importable: no plot"
    fig, ax = plt.subplots(figsize=(9, 6))
    rs = sorted(results, key=lambda r: r["tokens"])

    def series(key, label, style, source=rs):
        pts = [(r["tokens"], r[key]) for r in source if r.get(key)]
        if pts:
            ax.plot(*zip(*pts), style, label=label)

    series("graph_us", "ffi_dsa (CUDA graph)", "o-")
    series("in_graph_us", "ffi_dsa (per call, N calls in one graph)", "o-.")
    series("eager_us", "ffi_dsa (eager)", "o--")
    series("floor_us", "memory floor (measured copy bandwidth)", "k:")
    series("naive_us", "naive torch (eager)", "s-")
    series("chain_graph_us", "DeepGEMM + FlashInfer (graph, live)", "^-")
    peers = [r for r in rs if r.get("peer_chain_graph_us")]
    series("peer_chain_graph_us", "DeepGEMM + FlashInfer (graph, H100 peer study 2026-11-22)", "^:", peers)
    for r in rs:
        y = r["graph_us"] or r["eager_us"]
        ax.annotate(r["name"], (r["tokens"], y), textcoords="offset points", xytext=(4, -10), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("context tokens in the batch")
    ax.set_ylabel("time per call (us)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bench_gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="all",
                        help="comma list of W1..W7, C1..C5, L1 (1 x 1M), L2 (256 x 2049), W1w/W3w/W5w/W7w (2560-page "
                             "tables), W1wh/W3wh/W5wh/W7wh (the same with max_seq_len), or the groups serving, contest, "
                             "wide; default all")
    parser.add_argument("--ids", default="slots",
                        help="id kinds to time, comma-separated (slots, positions): the first fills the table, "
                             "the others are timed beside it on the same inputs")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu only exercises the plumbing (no graphs, tiny sizes with --smoke)")
    parser.add_argument("--smoke", action="store_true", help="lengths / 32, 64 MB rotation, few replays")
    parser.add_argument("--replays", type=int, default=50, help="timed graph replays / eager calls (>= 20)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--calls-per-graph", type=int, default=16,
                        help="calls captured together for the in-graph time (each on its own input set)")
    parser.add_argument("--rotate-mb", type=int, default=256, help="K cache bytes the sets rotate over")
    parser.add_argument("--max-sets", type=int, default=1024, help="cap on input sets (graphs) per workload")
    parser.add_argument("--copy-mb", type=int, default=1024, help="copy-bandwidth buffer size (each way)")
    parser.add_argument("--check-tokens", type=int, default=300_000,
                        help="token budget of the float64 check per workload (rows beyond it are not checked)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--no-graph", action="store_true")
    parser.add_argument("--no-naive", action="store_true")
    parser.add_argument("--no-peers", action="store_true", help="do not try DeepGEMM / FlashInfer")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    a = parser.parse_args(argv)

    if a.device == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: torch sees no CUDA device (use --device cpu --smoke for a plumbing check)", file=sys.stderr)
        return 2
    if a.smoke:
        a.replays, a.warmup, a.rotate_mb = min(a.replays, 5), min(a.warmup, 2), min(a.rotate_mb, 16)
        a.copy_mb = min(a.copy_mb, 64)
    a.replays = max(a.replays, 1)

    all_w = workloads(a.seed)
    names = workload_names(a.workloads, all_w)
    unknown = [n for n in names if n not in all_w]
    if unknown:
        parser.error(f"unknown workloads {unknown}; known: {list(all_w)} and the groups {list(WORKLOAD_GROUPS)}")
    a.ids = [i.strip() for i in a.ids.split(",") if i.strip()]
    if not a.ids or any(i not in IDS for i in a.ids) or len(set(a.ids)) != len(a.ids):
        parser.error(f"--ids takes distinct values of {IDS}, got {a.ids}")
    if a.smoke:
        for n in names:
            all_w[n]["lens"] = np.maximum(all_w[n]["lens"] // 32, 1)
            all_w[n]["desc"] += " /32"
            if "max_seq_len" in all_w[n]:
                all_w[n]["max_seq_len"] = int(all_w[n]["lens"].max())

    clock = Clock(a.device)
    if clock.cuda:
        props = torch.cuda.get_device_properties(0)
        device_desc = (f"{props.name}, {props.multi_processor_count} SMs, "
                       f"{getattr(props, 'L2_cache_size', 0) / MB:.0f} MB L2, torch {torch.__version__}, "
                       f"CUDA {torch.version.cuda}")
    else:
        device_desc = f"CPU ({os.cpu_count()} cores), torch {torch.__version__}"
    print(f"bench_gpu: {device_desc}", flush=True)

    # first call: loads (or builds) the native module outside every measurement
    t0 = time.perf_counter()
    warm = make_batch_torch([300, 5000], seed=1, device=a.device)
    ffi_dsa.call(*warm.args(), torch.empty((2, TOPK), dtype=torch.int32, device=a.device))
    clock.sync()
    print(f"  native module ready ({time.perf_counter() - t0:.1f} s incl. build if any)", flush=True)
    del warm

    bandwidth = copy_bandwidth(a.device, a.copy_mb * MB)
    if clock.cuda:
        torch.cuda.empty_cache()
    print(f"  device-to-device copy: {bandwidth / 1e12:.3f} TB/s (read + write, {a.copy_mb} MiB buffer)", flush=True)

    chain_maker, chain_note = (None, "--no-peers") if a.no_peers or not clock.cuda else load_production_chain()
    if chain_maker is None:
        print(f"  DeepGEMM + FlashInfer: not importable / not run ({chain_note})", flush=True)

    results = []
    start = time.perf_counter()
    for name in names:
        try:
            results.append(run_workload(name, all_w[name], a, clock, bandwidth, chain_maker))
        except Exception as exc:  # noqa: BLE001  keep going: one broken workload must not hide the rest
            traceback.print_exc()
            results.append({"name": name, "error": f"{type(exc).__name__}: {exc}"})
        gc.collect()  # the workload's input sets and graphs go before the next one is made
        if clock.cuda:
            torch.cuda.empty_cache()
    ok = [r for r in results if "error" not in r]
    print(f"\n  workloads done in {time.perf_counter() - start:.0f} s", flush=True)
    print_table(ok, bandwidth, chain_note)
    print_option_summary(ok)
    for r in results:
        if "error" in r:
            print(f"{r['name']}: ERROR {r['error']}")

    payload = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "device": device_desc,
        "host": f"{platform.node()} {os.cpu_count()} cores", "copy_bandwidth_Bps": bandwidth,
        "topk": TOPK, "ids": a.ids, "replays": a.replays, "warmup": a.warmup, "rotate_mb": a.rotate_mb, "smoke": a.smoke,
        "chain": chain_note, "peer_h100_2026_11_22": PEER_H100_2026_11_22,
        "workload_lengths": {n: all_w[n]["lens"].tolist() for n in names}, "results": results,
    }
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(payload, indent=1, default=float))
        print(f"wrote {a.json}")
    if a.plot:
        print(plot(ok, a.plot, f"ffi_dsa DSA indexer top-k, {device_desc.split(',')[0]}"))
    bad = [r["name"] for r in results if "error" in r or r.get("check") != "PASS"]
    if bad:
        print(f"bench_gpu: FAILED or errored: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
