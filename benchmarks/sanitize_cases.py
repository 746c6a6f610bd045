"""A small, representative set of ffi_dsa calls for compute-sanitizer (memcheck, racecheck,
synccheck, initcheck): every code path of the kernel once, at sizes the tools get through quickly.

    compute-sanitizer --tool memcheck python3 benchmarks/sanitize_cases.py [--device cuda]
    python benchmarks/sanitize_cases.py --device cpu      (the same cases on the CPU path)

Cases: lengths 0, 1, 2047, 2048, 2049 (around K), a long row (~20K tokens: many scoring CTAs, a 3-CTA select cluster),
a 128K row (a 16-CTA select cluster), every score equal (the radix select over a cluster), invalid
page ids (negative and >= num_pages) inside the used range, a negative and a too-long seq_len,
sorted=True, rows of at most K tokens only (the one-kernel path), several queries per row (N = 2, 4;
causal and per-query seq_lens; both paths; the one-kernel path's queries selected side by side;
more than twice as many query rows as SMs, selected by CTAs of 512 threads, a row among them longer
than such a CTA stages; more query rows than SMs with such a row, selected longest first by CTAs of
1024 threads) and 32 heads, B=0, and the options: ids="positions" on
both paths, and a max_seq_len far below a 128K row on a table 2560 pages wide (the select planned
for short rows reading a long one). Each output is poisoned first and checked with ffi_dsa.check_topk.
Run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so that memcheck sees exact allocation bounds.
Exit code 1 when a check fails.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import ffi_dsa  # noqa: E402
from ffi_dsa.contract import DEFAULT_TOPK as TOPK  # noqa: E402
from ffi_dsa.contract import HEAD_DIM, PAGE_TOKENS  # noqa: E402
from ffi_dsa.kv_cache import pack_k_cache  # noqa: E402
from ffi_dsa.workloads import make_batch  # noqa: E402


def cases():
    yield "lengths 0,1,2047,2048,2049", make_batch([0, 1, 2047, 2048, 2049], seed=11), False
    yield "long row ~20K (multi-CTA scoring, select cluster) + short", make_batch([20000, 3000], seed=12), False
    yield "sorted=True", make_batch([2049, 5000, 100, 0], seed=13), True
    yield "128K row (16-CTA select cluster) + short", make_batch([131072, 3000], seed=16), False

    flat = make_batch([20000, 3000], seed=17)  # every score equal: the radix select, over a cluster
    flat.k_cache[:] = pack_k_cache(np.ones((flat.k_cache.shape[0], PAGE_TOKENS, HEAD_DIM), np.float32))
    yield "all scores equal (radix select in a cluster)", flat, False

    bad = make_batch([4096, 4096, 1000, 700], seed=14, max_pages=80)
    num_pages = bad.k_cache.shape[0]
    bad.block_table[0, 3] = num_pages          # one past the end
    bad.block_table[0, 10] = -5                # negative
    bad.block_table[1, 0] = num_pages + 1000   # far out
    bad.seq_lens[2] = -3                       # negative length: counts as 0
    bad.seq_lens[3] = 80 * 64 + 999            # longer than the table: cut to 80 pages (unlisted pages are -1)
    yield "invalid pages, negative and too-long seq_lens", bad, False

    short = make_batch([0, 1, 700, 2047, 2048], seed=18)  # no row over K: one kernel, no scores
    short.block_table[2, 4] = -2
    yield "rows <= K only (position order: the select kernel alone)", short, False

    lens = np.random.default_rng(19).integers(0, 8193, size=132)  # >= 0.7 x the SMs: the one-kernel path
    lens[:5] = [0, 2049, 8192, 5000, 3000]
    big = make_batch(lens, seed=19)
    big.block_table[3, 2] = -1
    big.block_table[4, 0] = big.k_cache.shape[0]
    yield "132 rows <= 8K (one kernel, one CTA per row)", big, False
    yield "132 rows <= 8K, sorted=True", big, True

    lens = np.random.default_rng(20).integers(0, 300, size=700)  # more rows than one 640-row prefix tile
    lens[[5, 639, 641, 699]] = [2049, 3000, 2500, 4100]
    lens[650] = 17000  # a table wider than the one kernel's 16K tokens: the two kernels
    yield "700 rows, scored rows past the 640-row prefix tile, sorted", make_batch(lens, seed=20), True

    mtp = make_batch([20000, 2050, 1, 0], seed=21, queries=4)  # causal prefixes crossing K, 0 and 1
    mtp.block_table[0, 5] = -1
    yield "N=4, causal, two kernels", mtp, False
    yield "N=3, 64 heads, causal, two kernels, sorted", make_batch([9000, 2050, 40], seed=25, queries=3), True
    yield "N=2, 32 heads, per-query seq_lens, sorted", make_batch(np.array([[9000, 3000], [0, 2049], [700, 5000]]), seed=22,
                                                                 queries=2, heads=32), True
    lens = np.random.default_rng(23).integers(0, 4097, size=(132, 2))  # one CTA per row, both queries
    lens[:3] = [[0, 4096], [2049, 2048], [4096, 1]]
    yield "N=2 x 132 rows <= 4K (one kernel)", make_batch(lens, seed=23, queries=2), False
    yield "N=4, 32 heads, 132 rows <= 4K (one kernel, queries side by side)", make_batch(
        np.random.default_rng(29).integers(1500, 4097, size=132), seed=29, queries=4, heads=32), False
    yield "N=4, 32 heads, 132 rows <= 2K (one kernel), sorted", make_batch(
        np.random.default_rng(24).integers(0, 2049, size=132), seed=24, queries=4, heads=32), True

    lens = np.random.default_rng(30).integers(0, 8193, size=70)  # 280 query rows: more than 2 x the SMs
    lens[:4] = [25000, 2049, 0, 20480]  # 25K: more keys than a 512-thread CTA stages (read from L2)
    paired = make_batch(lens, seed=30, queries=4)
    paired.block_table[1, 3] = -1
    yield "N=4 x 70 rows, two kernels, 512-thread select CTAs two an SM", paired, False
    yield "N=4 x 70 rows, two kernels, 512-thread select CTAs, sorted", paired, True

    lens = np.random.default_rng(31).integers(0, 8193, size=40)  # 160 query rows: two waves of 1024-thread CTAs
    lens[[5, 17, 30]] = [25000, 2049, 0]  # the longest row not first: longest first reorders the CTAs
    longest = make_batch(lens, seed=31, queries=4)
    longest.block_table[5, 2] = -1
    yield "N=4 x 40 rows, a 25K row, two kernels, longest first", longest, False
    yield "N=4 x 40 rows, a 25K row, two kernels, longest first, sorted", longest, True

    yield "B=0", make_batch(np.zeros(0, np.int32), seed=15), False


def option_cases():
    """(name, batch, sorted, options) of calls with decode's options on the paths above."""
    positions = {"ids": "positions"}
    yield "positions, lengths 0,1,2047,2048,2049", make_batch([0, 1, 2047, 2048, 2049], seed=11), False, positions
    wide = make_batch([131072, 8192, 3000, 0], seed=26, max_pages=2560)
    wide.block_table[1, 7] = -3
    yield "positions, 128K row, max_seq_len 8192, 2560 pages", wide, False, {**positions, "max_seq_len": 8192}
    yield "slots, 128K row, max_seq_len 8192, sorted", wide, True, {"max_seq_len": 8192}
    lens = np.random.default_rng(27).integers(0, 8193, size=132)  # the one-kernel path
    lens[:3] = [0, 2049, 8192]
    yield "positions, 132 rows <= 8K (one kernel), sorted", make_batch(lens, seed=27), True, positions
    yield "positions, N=2, two kernels, max_seq_len below", make_batch([9000, 2050, 1], seed=28, queries=2), False, \
        {**positions, "max_seq_len": 4096}


def prefill_cases():
    """(name, batch, topk, sorted) of prefill calls: ragged requests, a long row whose candidates are
    cut, a remainder block (M % 4 != 0), 32 heads, empty and clamped rows."""
    from ffi_dsa.prefill_workloads import make_prefill_batch

    ragged = make_prefill_batch([500, 130, 2100], queries=[300, 130, 24], seed=1, spare_keys=37)
    long_rows = make_prefill_batch([9000], queries=[5], seed=2)
    clamped = make_prefill_batch([700, 90], queries=[30, 3], seed=3, heads=32)
    clamped.ks[0], clamped.ke[1], clamped.ks[2] = -5, 10**6, clamped.ke[2]  # < 0, past N, empty
    return [("prefill ragged, K 2048", ragged, 2048, False),
            ("prefill ragged, K 64, sorted", ragged, 64, True),
            ("prefill 5 rows of 9K keys, K 2048, sorted", long_rows, 2048, True),
            ("prefill H32, clamped and empty rows", clamped, 256, False)]


def run_prefill_case(device: str, batch, topk: int, sorted_: bool) -> list[str]:
    out = np.full((batch.rows, topk), -7, dtype=np.int32)
    if device == "cuda":
        import torch

        result = torch.from_numpy(out).to("cuda")
        ffi_dsa.prefill_call(*batch.to_torch("cuda"), result, sorted=sorted_)
        out = result.cpu().numpy()
    else:
        ffi_dsa.prefill_call(*batch.args(), out, sorted=sorted_)
    return ffi_dsa.check_prefill_topk(out, *batch.args(), sorted=sorted_)


def report(name: str, problems: list[str], start: float) -> bool:
    """Prints a case's verdict line; True when it failed."""
    verdict = "ok" if not problems else f"FAIL: {problems[0]}"
    print(f"sanitize case: {name:<48} {verdict} ({time.perf_counter() - start:.1f} s)", flush=True)
    return bool(problems)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    a = parser.parse_args(argv)

    failed = 0
    for name, batch, sorted_, options in [(*case, {}) for case in cases()] + list(option_cases()):
        start = time.perf_counter()
        rows = len(batch.seq_lens)
        if a.device == "cuda":
            import torch

            args = batch.to_torch("cuda")
            out = torch.full(batch.output_shape(TOPK), -7, dtype=torch.int32, device="cuda")
            ffi_dsa.call(*args, out, sorted=sorted_, **options)
            torch.cuda.synchronize()
        else:
            args = batch.args()
            out = np.full(batch.output_shape(TOPK), -7, dtype=np.int32)
            ffi_dsa.call(*args, out, sorted=sorted_, **options)
        ids = options.get("ids", "slots")
        problems = ffi_dsa.check_topk(out, *batch.args(), sorted=sorted_, ids=ids) if rows else []
        failed += report(name, problems, start)
    for name, batch, topk, sorted_ in prefill_cases():
        start = time.perf_counter()
        failed += report(name, run_prefill_case(a.device, batch, topk, sorted_), start)
    print(f"sanitize cases: {'all passed' if not failed else f'{failed} FAILED'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
