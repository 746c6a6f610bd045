"""torch on several devices: one call per rank with torch.distributed (benchmarks/torch_ranks.py).

Two ranks are spawned in a subprocess (gloo on the CPU; NCCL with one GPU per rank when two GPUs
exist), and as many ranks as the machine has GPUs, each calls ``torch.ops.dsa.topk_indexer`` once
on its own rows and device, and rank 0 gathers the rows back. The result must be the bytes of
``ffi_dsa.call`` on the whole batch on the same device type, for B divisible by the world size,
not divisible, and smaller than it (a rank with no rows).

The timing tool of the same layout (benchmarks/bench_torch_ranks.py) runs here on two gloo ranks
with tiny sizes: its tables must hold every world size and case, with times that add up.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from ffi_dsa.contract import NUM_HEADS, NUM_HEADS_NARROW
from conftest import CHECKOUT, assert_same_as_call, load_script, script_env

torch_ranks = load_script("benchmarks/torch_ranks.py")
bench_torch_ranks = load_script("benchmarks/bench_torch_ranks.py")
WORLD = 2
K = 64
SEED = 3
BATCH_SIZES = (8, 7, 1)
GPUS = torch.cuda.device_count()
TWO_GPUS = GPUS >= WORLD


# (queries, heads): the single-query form, and N query tokens per row (docs/contract.md §7)
FORMS = [pytest.param((None, NUM_HEADS), id="rank3"), pytest.param((2, NUM_HEADS_NARROW), id="n2_h32")]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("device", [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not TWO_GPUS, reason="needs 2 GPUs")]),
])
def test_two_ranks_give_the_single_process_bytes(device, form, tmp_path):
    assert_ranks_give_the_single_process_bytes(WORLD, device, form, BATCH_SIZES, tmp_path)


# B divisible by the GPU count, one row more, and fewer rows than GPUs (ranks with none)
EVERY_GPU_BATCH_SIZES = (4 * GPUS, 4 * GPUS + 1, max(GPUS - 1, 1))


@pytest.mark.cuda
@pytest.mark.skipif(GPUS < 2, reason=f"needs 2 or more GPUs, found {GPUS}")
@pytest.mark.parametrize("form", [pytest.param((None, NUM_HEADS), id="n1"), pytest.param((2, NUM_HEADS), id="n2")])
def test_every_gpu_gives_the_single_process_bytes(form, tmp_path):
    assert_ranks_give_the_single_process_bytes(GPUS, "cuda", form, EVERY_GPU_BATCH_SIZES, tmp_path)


def assert_ranks_give_the_single_process_bytes(world, device, form, batch_sizes, tmp_path):
    queries, heads = form
    out = tmp_path / "ids.npz"
    shape_args = ["--heads", str(heads)] + ([] if queries is None else ["--queries", str(queries)])
    child = subprocess.run(
        [sys.executable, str(CHECKOUT / "benchmarks" / "torch_ranks.py"), "--world-size", str(world), "--device", device,
         "--batch-sizes", ",".join(map(str, batch_sizes)), "--topk", str(K), "--seed", str(SEED), "--out", str(out),
         *shape_args],
        cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=240)
    assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-4000:]
    got = np.load(out)
    for i, batch_size in enumerate(batch_sizes):
        batch = torch_ranks.rank_batch(batch_size, SEED + i, queries, heads)
        ids = got[f"batch{i}"]
        assert ids.shape == batch.output_shape(K)
        assert_same_as_call(ids, batch, K, device=device)


@pytest.mark.parametrize("batch_size", [0, 1, 2, 7, 8, 13])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_rank_rows_split_like_tensor_split(batch_size, world):
    want = [len(part) for part in torch.tensor_split(torch.arange(batch_size), world)]
    rows = [torch_ranks.rank_rows(batch_size, rank, world) for rank in range(world)]
    assert [r.stop - r.start for r in rows] == want
    assert [r.start for r in rows] == [sum(want[:rank]) for rank in range(world)]


# ------------------------------------------------------------------- the timing tool
BENCH_ROWS, BENCH_LAYERS, BENCH_FIXED = 2, 2, 4


def test_bench_tables_on_two_gloo_ranks(tmp_path):
    out = tmp_path / "table.json"
    child = subprocess.run(
        [sys.executable, str(CHECKOUT / "benchmarks" / "bench_torch_ranks.py"), "--device", "cpu", "--world-sizes", "1,2",
         "--rows-per-rank", str(BENCH_ROWS), "--context", "512", "--layers", str(BENCH_LAYERS), "--steps", "3",
         "--queries", "1,2", "--fixed-batch", str(BENCH_FIXED), "--topk", str(K), "--json", str(out)],
        cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=240)
    assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-4000:]
    table = json.loads(out.read_text())
    assert table["device"] == "cpu" and table["skipped_world_sizes"] == []
    scaling = {(r["queries"], r["ranks"]): r for r in table["scaling"]}
    assert sorted(scaling) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert {r["metric"] for r in table["scaling"]} == {"eager_step"}  # no CUDA graph on the CPU
    for (n, world), r in scaling.items():
        assert (r["rows_per_rank"], r["rows_total"]) == (BENCH_ROWS, BENCH_ROWS * world)
        assert len(r["per_call_us_ranks"]) == world and r["per_call_us"] == max(r["per_call_us_ranks"])
        assert math.isfinite(r["per_call_us"]) and r["per_call_us"] > 0
        assert r["rows_per_s"] == pytest.approx(r["rows_total"] / (r["per_call_us"] * 1e-6))
        base = scaling[(n, 1)]
        assert r["speedup"] == pytest.approx(r["rows_per_s"] / base["rows_per_s"])
        assert 0 <= r["overlap"] <= 1
    fixed = {(r["queries"], r["ranks"]): r for r in table["fixed"]}
    assert sorted(fixed) == [(1, 2), (2, 2)]
    for (n, world), r in fixed.items():
        assert (r["rows_total"], r["rows_per_rank"]) == (BENCH_FIXED, BENCH_FIXED // world)
        # one rank alone at the share is the scaling table's one-rank case (same rows per rank)
        assert r["alone_us"] == scaling[(n, 1)]["per_call_us"]
        assert r["split_us"] > 0 and r["whole_us"] > 0
        assert r["speedup"] == pytest.approx(r["whole_us"] / r["split_us"])
    ranks = table["ranks"]["2"]
    assert [len(cases) for cases in ranks] == [2, 2]  # (N, B) = (1, 4), (2, 4) on each rank
    assert all(case["rows"] == 2 and case["phases"]["eager_step"]["end"] > case["phases"]["eager_step"]["start"]
               for cases in ranks for case in cases)
    assert "eager step" in child.stdout and f"B = {BENCH_FIXED} rows split" in child.stdout


def test_bench_plans_every_case_once():
    plan = bench_torch_ranks.plan_cases([1, 2, 4], [1, 2], rows_per_rank=128, fixed_batch=128)
    assert plan[1] == [(1, 128), (1, 64), (1, 32), (2, 128), (2, 64), (2, 32)]
    assert plan[2] == [(1, 256), (1, 128), (2, 256), (2, 128)]
    assert plan[4] == [(1, 512), (1, 128), (2, 512), (2, 128)]
    assert bench_torch_ranks.plan_cases([1, 2], [1], rows_per_rank=8, fixed_batch=None) == {1: [(1, 8)], 2: [(1, 16)]}


def test_bench_skips_world_sizes_beyond_the_gpus():
    assert bench_torch_ranks.runnable_worlds([2, 4, 8], "cuda", available=4) == ([1, 2, 4], [8])
    assert bench_torch_ranks.runnable_worlds([4], "cpu", available=0) == ([1, 4], [])


def fake_rank(rank, world, total, us, start=0.0, end=1.0):
    rows = torch_ranks.rank_rows(total, rank, world)
    return {"rank": rank, "queries": 1, "rows": rows.stop - rows.start,
            "phases": {"graph_step": {"per_call_us": us, "start": start, "end": end}}}


def test_bench_rows_per_second_follow_the_slowest_rank():
    cases = {(1, 1, 10): bench_torch_ranks.summarize([fake_rank(0, 1, 10, 100.0)]),
             (2, 1, 20): bench_torch_ranks.summarize([fake_rank(0, 2, 20, 100.0, 0.0, 1.0),
                                                      fake_rank(1, 2, 20, 125.0, 0.5, 2.0)])}
    one, two = bench_torch_ranks.scaling_rows(cases, [1, 2], [1], rows_per_rank=10)
    assert one["rows_per_s"] == pytest.approx(10 / 100e-6) and one["speedup"] == pytest.approx(1.0)
    assert two["per_call_us"] == 125.0 and two["rows_per_s"] == pytest.approx(20 / 125e-6)
    assert two["speedup"] == pytest.approx(1.6) and not two["meets_bar"]  # 1.6 < 0.9 x 2
    assert two["overlap"] == pytest.approx(0.25)  # both timing in [0.5, 1.0] of [0.0, 2.0]


def test_bench_fixed_batch_split_beside_its_share_alone():
    cases = {(1, 1, 9): bench_torch_ranks.summarize([fake_rank(0, 1, 9, 90.0)]),
             (1, 1, 5): bench_torch_ranks.summarize([fake_rank(0, 1, 5, 50.0)]),
             (2, 1, 9): bench_torch_ranks.summarize([fake_rank(0, 2, 9, 55.0), fake_rank(1, 2, 9, 45.0)])}
    (row,) = bench_torch_ranks.fixed_rows(cases, [1, 2], [1], fixed_batch=9)
    assert (row["rows_per_rank"], row["split_us"], row["alone_us"], row["whole_us"]) == (5, 55.0, 50.0, 90.0)
    assert row["split_over_alone"] == pytest.approx(1.1) and row["speedup"] == pytest.approx(90 / 55)
