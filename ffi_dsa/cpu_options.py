"""Options of the CPU path, in effect for later calls in this process (all threads).

The CPU module carries several builds of its scoring loop and picks the best one this CPU runs
("auto"); tests and benchmarks force each in turn. Names, slowest to fastest:

* ``scalar``: portable loops, compiled for the module's baseline ISA
* ``avx2``: FP32 FMA, 8 lanes (x86-64-v3)
* ``avx512``: FP32 FMA, 16 lanes (AVX-512 F/BW/DQ/VL)
* ``avx512bf16``: exact FP8 -> BF16 decode and ``vdpbf16ps`` (AVX-512 plus AVX512_BF16)

Every variant multiplies exactly and accumulates in float32; they may differ in the last bits of
a score (the order of the adds), within the SPEC tolerance.
"""

from __future__ import annotations

from . import _ffi_api


def set_cpu_kernel(name: str = "auto") -> str:
    """Use scoring variant `name` ("auto" or one of :func:`cpu_kernels`) from now on. Returns the
    previous setting ("auto" or a name), to restore it with. ValueError (and no change) for an
    unknown name or one this CPU cannot run."""
    return str(_ffi_api.cpu().set_cpu_kernel(str(name)))


def cpu_kernel() -> str:
    """The variant the next CPU call uses."""
    return str(_ffi_api.cpu().cpu_kernel())


def cpu_kernels() -> list[str]:
    """The variants this CPU can run, slowest to fastest ("auto" picks the last)."""
    return [str(name) for name in _ffi_api.cpu().cpu_kernels()]


def set_cpu_threads(threads: int = 0) -> None:
    """Threads of later CPU calls; 0 (the default) returns to ``FFI_DSA_NUM_THREADS`` if set, else
    every core. Small calls stay on the caller's thread either way."""
    _ffi_api.cpu().set_cpu_threads(int(threads))
