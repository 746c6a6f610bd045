"""Two ffi_dsa modules in one process stay two: another version's, a copy, or the pair that
benchmarks/ab_modules.py times. A module exports its tvm-ffi entry points and nothing of its own
C++: an exported inline static (STB_GNU_UNIQUE) or weak template function binds process-wide, so the
second module loaded would run the first one's settings and kernels. (The JIT-built module's table:
test_build_lock.py.)"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest
import tvm_ffi

import ffi_dsa
from ffi_dsa import _build, _ffi_api, _native
from ffi_dsa.cuda_options import cuda_options


def test_the_check_sees_exported_cpp_and_the_exports_map_hides_it(tmp_path):
    source = tmp_path / "lib.cc"
    source.write_text("namespace ffi_dsa { int Setting() { static int value = 1; return value++; } }\n"
                      # as TVM_FFI_DLL_EXPORT_TYPED_FUNC declares an entry point
                      'extern "C" __attribute__((visibility("default"))) int __tvm_ffi_entry() {\n'
                      "  return ffi_dsa::Setting();\n}\n")
    exported, hidden = tmp_path / "exported.so", tmp_path / "hidden.so"
    compiler = shutil.which("c++") or shutil.which("g++")
    assert compiler, "no C++ compiler on PATH (the modules' builds need one too)"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", str(source), "-o", str(exported)], check=True)
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", *_build.HIDDEN_SYMBOLS, str(source), "-o", str(hidden),
                    f"-Wl,--version-script={_build.native_dir() / _build.EXPORTS_MAP}"], check=True)
    assert any("_ZN7ffi_dsa7SettingEv" in s for s in _build.exported_own_symbols(exported))
    assert _build.exported_own_symbols(hidden) == []
    assert getattr(ctypes.CDLL(str(hidden)), "__tvm_ffi_entry")() == 1  # the entry point still leaves


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_the_installed_modules_export_only_their_entry_points(kind):
    library = _build.prebuilt(kind)
    if library is None:
        pytest.skip(f"this install holds no {kind} module (built on first use instead)")
    own = _build.exported_own_symbols(library)
    assert not own, f"{library} exports {len(own)} of its own symbols, e.g. {own[:5]}"


def copy_of(kind: str, tmp_path):
    path = tmp_path / f"copy_of_ffi_dsa_{kind}.so"
    shutil.copyfile(_ffi_api.module_path(kind), path)
    return tvm_ffi.load_module(str(path))


def test_a_copy_of_the_cpu_module_keeps_its_own_kernel_choice(tmp_path):
    before = ffi_dsa.cpu_kernel()
    others = [k for k in ffi_dsa.cpu_kernels() if k != before]
    if not others:
        pytest.skip(f"this CPU runs one kernel only ({before}): nothing to choose apart")
    copy = _native.bind(copy_of("cpu", tmp_path), _native.CpuFunctions)
    try:
        copy.set_cpu_kernel(others[0])
        assert str(copy.cpu_kernel()) == others[0]
        assert ffi_dsa.cpu_kernel() == before, "setting the copy's kernel changed the package's module"
    finally:
        copy.set_cpu_kernel("auto")


@pytest.mark.cuda
def test_a_copy_of_the_cuda_module_keeps_its_own_options(tmp_path):
    before = cuda_options()
    copy = _native.bind(copy_of("cuda", tmp_path), _native.CudaFunctions)
    try:
        copy.set_cuda_options(-1, -1, -1, int(not before["select_floor"]), -1, -1)
        assert bool(copy.cuda_options()["select_floor"]) != before["select_floor"]
        assert cuda_options() == before, "setting the copy's options changed the package's module"
    finally:
        copy.set_cuda_options(-1, -1, -1, int(before["select_floor"]), -1, -1)
