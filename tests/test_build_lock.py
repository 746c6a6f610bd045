"""Two processes that JIT-build the CPU module into one empty cache at once (torchrun ranks on a
fresh machine): one builds, the other waits for it and loads the same library."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


@pytest.mark.slow
def test_concurrent_first_builds_share_one_build(tmp_path):
    code = textwrap.dedent(f"""
        from pathlib import Path
        from ffi_dsa import _build
        print("LIB", _build.jit_cpu_library(cache_dir=Path({str(tmp_path)!r})), flush=True)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [p.communicate(timeout=900) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in results]
    libs = {line.split(" ", 1)[1] for out, _ in results for line in out.splitlines() if line.startswith("LIB ")}
    assert len(libs) == 1, libs
    # Both start within a second of each other and a build takes seconds: without the lock both
    # would run ninja (two "built" lines); with it one builds and the other waits, then loads.
    # (Only builds into tmp_path count: importing ffi_dsa may build the module into the default cache.)
    builds = sum(err.count(f"cached in {tmp_path}") for _, err in results)
    waits = sum(err.count(f"building into {tmp_path}") for _, err in results)
    assert builds == 1 and waits <= 1, [err[-1500:] for _, err in results]
