"""pytest plugin: run the whole suite with one CPU scoring variant forced.

    python -m pytest -p tests.cpu_kernel_plugin --cpu-kernel avx2 tests

from the repository root. The variant is set in-process through
``ffi_dsa.set_cpu_kernel`` before the first test and checked before every test, so a test that
forces another variant must restore it (test_cpu_kernels.py does).
"""

from __future__ import annotations

import pytest

_forced: list[str] = []


def forced_kernel() -> str | None:
    """The variant this run forces, or None."""
    return _forced[0] if _forced else None


def pytest_addoption(parser):
    parser.addoption("--cpu-kernel", default=None,
                     help="force this ffi_dsa CPU scoring variant for the whole run (see ffi_dsa.cpu_kernels())")


def pytest_configure(config):
    name = config.getoption("--cpu-kernel", default=None)
    if name:
        import ffi_dsa

        if name not in ffi_dsa.cpu_kernels():
            raise pytest.UsageError(f"--cpu-kernel {name}: this CPU runs only {ffi_dsa.cpu_kernels()}")
        ffi_dsa.set_cpu_kernel(name)
        _forced.append(name)


def pytest_report_header(config):
    import ffi_dsa

    return f"ffi_dsa CPU kernel: {ffi_dsa.cpu_kernel()} (forced: {forced_kernel() or 'no'}; "\
           f"this CPU runs {', '.join(ffi_dsa.cpu_kernels())})"


@pytest.fixture(autouse=True)
def _forced_cpu_kernel_in_effect():
    if _forced:
        import ffi_dsa

        assert ffi_dsa.cpu_kernel() == _forced[0], "a test left another CPU kernel forced"
    yield
