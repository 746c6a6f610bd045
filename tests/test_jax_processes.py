"""JAX with one process per device (``jax.distributed``): 2 and 4 CPU processes in CI, 2 GPUs on a
GPU machine with two of them.

Each case launches the processes through ``benchmarks/jax_processes.py`` (the coordinator on
localhost, a deadline for the whole launch), lets each process compute its rows through
``ffi_dsa.jax_distributed`` in every layout of ``jax_processes.check_batches`` (a pool per process,
the same with two queries per row and 32 heads, one pool shared by all; slots, and positions with a
max_seq_len below the longest rows) and write its ids, then checks them here, independently of the
processes' own check: every process's rows against the float64 reference with the contract's
tolerance (``ffi_dsa.check_topk``), byte for byte against ``ffi_dsa.call`` on the same rows (CPU),
and the processes' answers differ from each other (each computed its own rows, not process 0's).
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("jax_tvm_ffi")

import ffi_dsa  # noqa: E402
from ffi_dsa import jax_distributed  # noqa: E402
from ffi_dsa.workloads import Batch  # noqa: E402

from conftest import CUDA, call_result, load_script  # noqa: E402

jax_processes = load_script("benchmarks/jax_processes.py")
bench_jax_processes = load_script("benchmarks/bench_jax_processes.py")

LAUNCH_TIMEOUT_S = 240  # 4 processes importing JAX on a 2-core CI machine take ~10 s; a hang must not
SEED = 5


def _gpus() -> int:
    if not CUDA:
        return 0
    import torch

    return torch.cuda.device_count()


def launch_and_load(processes: int, platform: str, out_dir) -> list[dict]:
    """Run the check in `processes` processes; every one must exit 0 and print its report; returns
    each process's ids per layout."""
    start = time.perf_counter()
    finished = jax_processes.launch(processes, args=["--seed", str(SEED), "--out", str(out_dir)],
                                    platform=platform, timeout=LAUNCH_TIMEOUT_S, echo=False)
    took = time.perf_counter() - start
    output = "\n".join(f"[{f.process_id}] {line}" for f in finished for line in f.lines[-40:])
    assert jax_processes.failures(finished) == [], output
    print(f"{processes} {platform} processes: {took:.1f} s")
    for f in finished:
        report = json.loads(next(line for line in reversed(f.lines) if line.startswith("{")))
        assert report["process"] == f.process_id and report["devices"] == processes, report
        assert report["problems"] == [], report
    return [dict(np.load(out_dir / f"process{i}.npz")) for i in range(processes)]


def check_every_process(results: list[dict], processes: int, compare_bytes: bool) -> None:
    for i, ids in enumerate(results):
        layouts = jax_processes.check_batches(i, processes, SEED)
        assert sorted(ids) == sorted(name for name, _, _, _ in layouts)
        for name, _, args, options in layouts:
            got = ids[name]
            assert got.dtype == np.int32 and got.shape == Batch(*args).output_shape(2048), (name, got.shape)
            assert ffi_dsa.check_topk(got, *args, ids=options.get("ids", "slots")) == [], (i, name)
            if compare_bytes:
                np.testing.assert_array_equal(got, call_result(Batch(*args), **options), err_msg=f"process {i}, {name}")
    for name in results[0]:  # each process computed its own rows, not another's
        for i in range(1, processes):
            assert not np.array_equal(results[0][name], results[i][name]), f"processes 0 and {i} agree on {name}"


@pytest.mark.parametrize("processes", [2, 4])
def test_cpu_processes_each_compute_their_rows(processes, tmp_path):
    results = launch_and_load(processes, "cpu", tmp_path)
    check_every_process(results, processes, compare_bytes=True)


@pytest.mark.cuda
def test_two_gpu_processes_each_compute_their_rows(tmp_path):
    if _gpus() < 2:
        pytest.skip(f"needs 2 GPUs, found {_gpus()}")
    results = launch_and_load(2, "gpu", tmp_path)
    check_every_process(results, 2, compare_bytes=False)  # FP8 tensor cores: the tolerance, not CPU bytes


def test_the_launch_reports_a_failing_process(tmp_path):
    """A process that exits non-zero fails the launch (K above the kernel's limit: every process
    raises before it computes anything)."""
    finished = jax_processes.launch(2, args=["--topk", "4096"], timeout=LAUNCH_TIMEOUT_S, echo=False)
    assert len(jax_processes.failures(finished)) == 2
    assert any("topk" in line for f in finished for line in f.lines)


def test_the_launch_kills_processes_at_its_deadline():
    start = time.perf_counter()
    finished = jax_processes.launch(2, timeout=0.5, echo=False)
    assert time.perf_counter() - start < 30
    assert [f.returncode for f in finished] == [None, None]
    assert jax_processes.failures(finished) == ["process 0: killed at the deadline", "process 1: killed at the deadline"]


def test_initialize_names_its_bad_arguments():
    with pytest.raises(ValueError, match="platform"):
        jax_distributed.initialize(0, 2, "localhost:1", platform="tpu")
    with pytest.raises(ValueError, match="process_id"):
        jax_distributed.initialize(2, 2, "localhost:1")


def test_the_benchmark_runs_on_cpu_processes(capsys):
    """bench_jax_processes end to end with tiny sizes (numbers not judged): both process counts give
    a row, each process having checked its ids before timing."""
    rc = bench_jax_processes.main(["--platform", "cpu", "--processes", "1,2", "--rows", "2", "--context", "300",
                                   "--layers", "2", "--steps", "2", "--trace-steps", "0"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    rows = [line.split() for line in printed.splitlines() if line.startswith("  ") and line.split()[0].isdigit()]
    assert [r[0] for r in rows] == ["1", "2"] and [r[2] for r in rows] == ["2", "4"], printed
