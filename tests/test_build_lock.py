"""The JIT fallback (a source checkout, a GPU the wheel holds no code for), on the CPU module: two
processes that JIT-build it into one empty cache at once (torchrun ranks on a fresh machine) make
one build, the other waits for it and loads the same library; and that library, compiled from the
sources the package ships, exports none of its own C++ and gives the installed module's bytes. The
suite's one compile: the JIT build differs from the wheel's (no -march), so nothing the install kept
can stand in for it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tvm_ffi

import ffi_dsa
from ffi_dsa._build import exported_own_symbols
from ffi_dsa.workloads import make_batch

from conftest import poisoned_np, script_env


@pytest.mark.slow
def test_concurrent_first_builds_share_one_build_with_the_installed_bytes(tmp_path):
    code = textwrap.dedent(f"""
        from pathlib import Path
        from ffi_dsa import _build
        print("LIB", _build.jit_cpu_library(cache_dir=Path({str(tmp_path)!r})), flush=True)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=script_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [p.communicate(timeout=900) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in results]
    libs = {line.split(" ", 1)[1] for out, _ in results for line in out.splitlines() if line.startswith("LIB ")}
    assert len(libs) == 1, libs
    # Both start within a second of each other and a build takes seconds: without the lock both
    # would run ninja (two "built" lines); with it one builds and the other waits, then loads.
    builds = sum(err.count(f"cached in {tmp_path}") for _, err in results)
    waits = sum(err.count(f"building into {tmp_path}") for _, err in results)
    assert builds == 1 and waits <= 1, [err[-1500:] for _, err in results]

    lib = libs.pop()
    own = exported_own_symbols(lib)
    assert not own, own[:5]  # test_module_isolation.py: why
    jit = tvm_ffi.load_module(lib)["topk_indexer"]
    batch = make_batch([3000, 0, 700, 64], seed=71)
    got, expected = poisoned_np((4, 256)), poisoned_np((4, 256))
    jit(*batch.args(), got, False, False, 0)  # numpy inputs (q: uint8 bytes of fp8); sorted, positions, bound
    ffi_dsa.call(*batch.args(), expected)
    np.testing.assert_array_equal(got, expected)
