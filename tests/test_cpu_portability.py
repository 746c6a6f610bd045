"""The CPU module on a CPU without AVX-512 (Haswell: AVX2, the x86-64-v3 level), emulated with
qemu-user: it must load, offer only scalar and avx2, pick avx2, and give the bytes the native run
gives with the same variants. Skipped where qemu-x86_64 is not installed (apt: qemu-user).
The module tested is the one this process loaded, so a build with ``-march=x86-64-v3`` (the
wheel's baseline) is checked by running the suite against that build.
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ffi_dsa import _build

QEMU = shutil.which("qemu-x86_64")
PROBE = Path(__file__).with_name("cpu_variant_probe.py")
EMULATION_TIMEOUT_S = 600


def _probe(prefix: list[str]) -> dict:
    run = subprocess.run([*prefix, sys.executable, str(PROBE), _build.cpu_library()], capture_output=True,
                         text=True, timeout=EMULATION_TIMEOUT_S, check=False)
    assert run.returncode == 0, f"{' '.join(prefix) or 'native'} run failed ({run.returncode}): {run.stderr[-2000:]}"
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.machine() != "x86_64" or QEMU is None, reason="needs x86-64 and qemu-x86_64")
def test_module_runs_on_an_avx2_cpu_without_avx512():
    native = _probe([])
    emulated = _probe([QEMU, "-cpu", "Haswell-v4"])
    assert emulated["kernels"] == ["scalar", "avx2"]
    assert emulated["auto"] == "avx2"
    for name, out in emulated["outputs"].items():
        assert out == native["outputs"][name], f"{name} differs between the emulated and the native run"
