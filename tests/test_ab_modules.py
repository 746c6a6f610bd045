"""benchmarks/ab_modules.py: two trees' modules timed in one process, in turns, their outputs
compared. The other tree here is the ffi_dsa this suite imports, so the two must agree byte for
byte and time alike."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import CHECKOUT, DEVICES, FFI_DSA_PARENT, script_env

SCRIPT = str(CHECKOUT / "benchmarks" / "ab_modules.py")


def run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=cwd, env=script_env(), capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("device", DEVICES)
def test_the_same_module_agrees_with_itself(device, tmp_path):
    done = run("C2,C1", "--device", device, "--against", FFI_DSA_PARENT, "--rounds", "2", "--replays", "3",
               "--rotate-mb", "1", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [ln for ln in done.stdout.splitlines() if re.match(r"C[12] +N=1 ", ln)]
    assert len(lines) == 2, done.stdout
    for line in lines:
        assert line.endswith("bytes equal"), line
        this, other, ratio = (float(x) for x in re.search(r"this +([\d.]+) us +other +([\d.]+) us +other/this +([\d.]+)",
                                                             line).groups())
        # The line rounds the times to 0.01 us and the ratio (of the unrounded times) to 0.001: C1's
        # and C2's few microseconds move other / this of the printed times by up to ~0.003.
        slack = 0.0005 + (other / this) * (0.005 / this + 0.005 / other)
        assert this > 0 and other > 0 and ratio == pytest.approx(other / this, abs=slack)


def test_an_unknown_workload_is_named():
    done = run("W5,W9", "--device", "cpu", "--against", FFI_DSA_PARENT)
    assert done.returncode == 2 and "unknown workload(s) W9;" in done.stderr


def test_a_copy_between_calls_is_timed_with_both_modules(tmp_path):
    done = run("C2", "--device", "cpu", "--against", FFI_DSA_PARENT, "--rounds", "2", "--replays", "3",
               "--rotate-mb", "1", "--between-mb", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    [line] = [ln for ln in done.stdout.splitlines() if re.match(r"C2 +N=1 ", ln)]
    this, other, diff = (float(x) for x in re.search(
        r"this +([\d.]+) us +other +([\d.]+) us .* other - this ([+-][\d.]+) us with a 2 MiB copy after each call",
        line).groups())
    assert diff == pytest.approx(other - this, abs=0.011) and line.endswith("bytes equal"), line


def test_a_negative_copy_is_refused():
    done = run("C2", "--device", "cpu", "--against", FFI_DSA_PARENT, "--between-mb", "-1")
    assert done.returncode == 2 and "--between-mb must be >= 0, not -1" in done.stderr


def test_calls_grouped_as_in_a_graph_of_several(tmp_path):
    # Three calls a group over the sets: every set is still written (the bytes compared), the line
    # names the grouping, and the times are per call.
    done = run("C2", "--device", "cpu", "--against", FFI_DSA_PARENT, "--rounds", "2", "--replays", "3",
               "--rotate-mb", "1", "--graph-calls", "3", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    [line] = [ln for ln in done.stdout.splitlines() if re.match(r"C2 +N=1 ", ln)]
    assert "2 x 9 calls each, 3 a graph)" in line and line.endswith("bytes equal"), line


def test_a_graph_of_no_calls_is_refused():
    done = run("C2", "--device", "cpu", "--against", FFI_DSA_PARENT, "--graph-calls", "0")
    assert done.returncode == 2 and "--graph-calls must be >= 1, not 0" in done.stderr
