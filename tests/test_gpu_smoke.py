"""benchmarks/gpu_smoke.py, the first step of a GPU machine's call: each path once, each in a child
process under a time limit, a child that outlives it reported as a hang."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from conftest import CHECKOUT, DEVICES, load_script, script_env

gpu_smoke = load_script("benchmarks/gpu_smoke.py")
SCRIPT = str(CHECKOUT / "benchmarks" / "gpu_smoke.py")


def test_a_child_past_its_time_limit_is_a_hang_with_its_stack():
    start = time.perf_counter()
    child = ("import faulthandler, sys, time; print('started', flush=True); "
             "faulthandler.dump_traceback_later(1); time.sleep(60)")
    status, output = gpu_smoke.run_child([sys.executable, "-c", child], timeout=4)
    assert status == "hang"
    assert time.perf_counter() - start < 30  # killed, not waited for
    assert "started" in output and "Thread" in output  # its output and the stack it printed before the limit


def test_a_process_the_child_started_neither_holds_up_nor_outlives_the_case(tmp_path):
    """A child that leaves a process behind holding its output (a JIT build's compiler when the
    child is killed, a daemon): the case ends when the child does, and the leftover is killed."""
    marker = tmp_path / "leftover.pid"
    child = ("import subprocess, sys; "
             f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
             f"open({str(marker)!r}, 'w').write(str(p.pid)); print('left one', flush=True)")
    start = time.perf_counter()
    status, output = gpu_smoke.run_child([sys.executable, "-c", child], timeout=30)
    assert status == "ok" and "left one" in output
    assert time.perf_counter() - start < 20  # not the leftover's 60 s
    leftover = int(marker.read_text())
    for _ in range(50):
        if not running(leftover):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the process the child started ({leftover}) still runs")


def running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (killed, not yet reaped by init)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_failing_child_is_a_failure_with_its_output():
    status, output = gpu_smoke.run_child([sys.executable, "-c", "import sys; print('row 3: wrong'); sys.exit(1)"],
                                         timeout=30)
    assert status == "failed" and "row 3: wrong" in output
    assert gpu_smoke.run_child([sys.executable, "-c", "pass"], timeout=30)[0] == "ok"


@pytest.mark.parametrize("device", DEVICES)
def test_the_cases_pass(device, tmp_path):
    """The split-path cases (a row alone, a cluster, N = 2) through the script itself; on a GPU the
    fused cases too."""
    cases = "split_alone,split_cluster,split_cluster_n2" + (",fused_n1,fused_n2,fused_sorted" if device == "cuda" else "")
    done = subprocess.run([sys.executable, SCRIPT, "--device", device, "--cases", cases, "--timeout", "120"],
                          cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=900)
    n = len(cases.split(","))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{n} of {n} cases ok" in done.stdout


def test_an_unknown_case_is_named():
    done = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--cases", "fused_n1,fused_n9"],
                          env=script_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "fused_n9" in done.stderr and "split_cluster" in done.stderr
