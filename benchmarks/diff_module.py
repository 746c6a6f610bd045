"""The same calls through this tree's CUDA module and another tree's (main's), byte for byte.

    python benchmarks/diff_module.py --against PATH [--against-cache DIR] [--calls N] [--seed S] [--device cuda]

A kernel change that keeps the contract writes the same bytes as the module it replaces, not merely
bytes the tolerance check accepts (ties, the order of equal keys and NaN have one answer). This runs
every call twice, here and in a child process whose ffi_dsa is the one under PATH (a checkout of
main, say; its module is built or loaded as that tree's ffi_dsa does it, in FFI_DSA_CACHE_DIR or
`--against-cache`), and compares the outputs: fuzz.py's random
calls (both pools, every N, H, K, order, ids, max_seq_len, invalid pages, special scales) and, on
top, the cases a select change must not move:

- fused-path batches (132 rows, N x the table's width within one CTA's 16K keys) and split-path rows
  of 8K-130K tokens, random and exact data;
- a relu plateau (most of a row scores exactly 0), rows whose every score is equal, NaN and +-inf
  scores among the winners, lengths 0, 1, 2047, 2048, 2049 and invalid page ids;
each in both orders and both ids, with and without a max_seq_len.

Both processes draw the same calls from the same seed (this file, not PATH's, draws them). Prints
one line per differing call and a summary; exit code 1 if any call differs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import fuzz  # noqa: E402  (benchmarks/ is this script's folder)
from ffi_dsa.contract import HEAD_DIM, PAGE_FP8_BYTES, PAGE_TOKENS  # noqa: E402


def special_scales(pool: fuzz.Pool, rng, kind: str) -> np.ndarray:
    """A copy of the pool's packed cache whose scales make `kind`'s scores: 'plateau' (90% of the
    tokens scale 0: their scores are exactly 0), 'equal' (every token the same key and scale: one
    score), 'nan_inf' (NaN, +inf and -inf scales sprinkled)."""
    cache = pool.k_cache.copy()
    raw = cache.view(np.uint8).reshape(fuzz.POOL_PAGES, -1)
    scales = raw[:, PAGE_FP8_BYTES:].view("<f4")
    if kind == "plateau":
        scales[rng.random(scales.shape) < 0.9] = 0.0
    elif kind == "equal":
        raw[:, :PAGE_FP8_BYTES] = raw[0, :HEAD_DIM].reshape(1, HEAD_DIM).repeat(PAGE_TOKENS, 0).reshape(1, -1)
        scales[:] = 1.0
    else:
        flat = scales.reshape(-1)
        picks = rng.choice(flat.size, size=flat.size // 50, replace=False)
        flat[picks[0::3]] = np.nan
        flat[picks[1::3]] = np.inf
        flat[picks[2::3]] = -np.inf
    return cache


def draw_case(rng, pools, i: int):
    """(args, topk, sorted, out_shape, options) of call i: a fuzz call, or every fourth call one of
    the shapes and data above."""
    if i % 4:
        _, args, topk, sorted_, out_shape, options = fuzz.draw_call(rng, pools)
        return args, topk, sorted_, out_shape, options
    pool = pools[rng.random() < 0.5]
    queries = int(rng.integers(1, 5))
    heads = int(rng.choice([64, 32]))
    if rng.random() < 0.5:  # the fused path: 132 rows, N x width <= 16K keys
        width = 16384 // queries
        lens = rng.integers(0, width + 1, size=132)
    else:  # the split path: a few rows of 8K-130K tokens
        lens = rng.integers(8192, 131073, size=int(rng.integers(1, 5)))
    lens[:min(5, len(lens))] = np.array([0, 1, 2047, 2048, 2049])[:min(5, len(lens))]
    table = fuzz.draw_table(rng, lens)
    seq_lens = fuzz.draw_seq_lens(rng, lens, queries, 2048, bool(rng.random() < 0.5), table.shape[1] * PAGE_TOKENS)
    q8, weights = fuzz.draw_queries(rng, pool.exact, len(lens), queries, heads)
    kind = ("plateau", "equal", "nan_inf", "plain")[int(rng.integers(0, 4))]
    cache = pool.k_cache if kind == "plain" else special_scales(pool, rng, kind)
    sorted_ = bool(rng.random() < 0.5)
    options = fuzz.draw_options(rng, lens)
    return (q8, cache, weights, seq_lens, table), 2048, sorted_, (len(lens) * queries, 2048), options


def run_calls(device: str, calls: int, seed: int, out_path: str) -> None:
    """Draws and runs the calls with the ffi_dsa this process imports; saves every output."""
    rng = np.random.default_rng(seed)
    pools = (fuzz.Pool(rng, exact=False), fuzz.Pool(rng, exact=True))
    runner = fuzz.Runner(device)
    outs = {}
    for i in range(calls):
        args, topk, sorted_, out_shape, options = draw_case(rng, pools, i)
        got, again = runner.run(args, out_shape, sorted_, options)
        if not np.array_equal(got, again):
            got = np.full_like(got, -99)  # a repeat that differs is a difference by itself
        outs[f"c{i}"] = got
        outs[f"d{i}"] = np.array(f"K={topk} sorted={sorted_} {options} B={len(args[3])} q={list(args[0].shape[:-1])}")
    np.savez(out_path, **outs)


def tree_env(tree: str, cache: str | None) -> dict:
    """The environment of a child process that imports `tree`'s ffi_dsa, its modules built or
    loaded in `cache` (None: FFI_DSA_CACHE_DIR as it is)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(tree), env.get("PYTHONPATH", "")])
    if cache:
        env["FFI_DSA_CACHE_DIR"] = cache
    return env


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="the other tree (its ffi_dsa package is imported)")
    parser.add_argument("--against-cache", help="FFI_DSA_CACHE_DIR for the other tree's module (default: the same)")
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--seed", type=int, default=45)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    a = parser.parse_args(argv)
    if a.child:
        run_calls(a.device, a.calls, a.seed, a.child)
        return 0
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        here, there = os.path.join(tmp, "here.npz"), os.path.join(tmp, "there.npz")
        me = [sys.executable, os.path.abspath(__file__), "--against", a.against, "--calls", str(a.calls),
              "--seed", str(a.seed), "--device", a.device]
        other = subprocess.run([*me, "--child", there], env=tree_env(a.against, a.against_cache),
                               capture_output=True, text=True)
        if other.returncode != 0:
            print(f"diff_module: the calls through {a.against} failed:\n{other.stderr[-3000:]}")
            return 1
        run_calls(a.device, a.calls, a.seed, here)
        x, y = np.load(here), np.load(there)
        differ = 0
        for i in range(a.calls):
            if not np.array_equal(x[f"c{i}"], y[f"c{i}"]):
                differ += 1
                if differ <= 20:
                    rows = np.nonzero(np.any(x[f"c{i}"].reshape(-1, x[f"c{i}"].shape[-1]) !=
                                             y[f"c{i}"].reshape(-1, y[f"c{i}"].shape[-1]), axis=1))[0]
                    print(f"DIFFER call {i} ({x[f'd{i}']}): rows {rows[:8].tolist()}")
    print(f"diff_module ({a.device}, seed {a.seed}): {a.calls} calls against {a.against}, {differ} differing, "
          f"{time.perf_counter() - start:.0f} s")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
