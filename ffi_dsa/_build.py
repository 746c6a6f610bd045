"""JIT build of the native modules, cached by a hash of every source byte and every flag.

The first call in a fresh environment compiles (seconds for the CPU module, longer for CUDA) and
says so on stderr, with the cache location; later processes load the cached ``.so`` directly.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import tvm_ffi

_PACKAGE_DIR = Path(__file__).resolve().parent



def native_dir() -> Path:
    """The C++/CUDA sources: inside an installed wheel, or the repository's cuda/ folder."""
    for candidate in (_PACKAGE_DIR / "cuda", _PACKAGE_DIR.parent / "cuda"):
        if (candidate / "include" / "ffi_dsa" / "contract.h").is_file():
            return candidate
    raise RuntimeError(f"ffi_dsa: native sources not found next to {_PACKAGE_DIR}; reinstall the package")


def cache_root() -> Path:
    return Path(os.environ.get("FFI_DSA_CACHE_DIR", Path.home() / ".cache" / "ffi_dsa")).expanduser()


def cuda_home() -> str:
    # /usr/local/bin/nvcc may be a wrapper script, which misleads tvm-ffi's guess of CUDA_HOME.
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        return home
    nvcc = shutil.which("nvcc")
    if nvcc:
        real = Path(nvcc).resolve()
        if real.parent.name == "bin" and (real.parent.parent / "include" / "cuda.h").exists():
            return str(real.parent.parent)
    return "/usr/local/cuda"


def _tool_version(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "absent"


def _source_hash(files: list[Path], flags: list[str], tools: list[str]) -> str:
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(str(path.relative_to(native_dir())).encode())
        digest.update(path.read_bytes())
    for item in [*flags, *tools, tvm_ffi.__version__, sys.platform]:
        digest.update(item.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def build(name: str, sources: list[str], *, headers: list[str], cflags: list[str],
          cuda_cflags: list[str] | None = None, ldflags: list[str] | None = None) -> str:
    """Build (or reuse) module `name` from `sources`; `headers` are the globs (relative to
    native_dir()) of what they include, so an edit to a CUDA header does not rebuild the CPU module."""
    root = native_dir()
    cuda_cflags = list(cuda_cflags or [])
    ldflags = list(ldflags or [])
    files = sorted({p for pattern in headers for p in root.glob(pattern) if p.is_file()} | {root / s for s in sources})
    has_cuda = any(s.endswith(".cu") for s in sources)
    tools = [_tool_version([os.environ.get("CXX", "c++"), "--version"])]
    if has_cuda:
        tools.append(_tool_version([str(Path(cuda_home()) / "bin" / "nvcc"), "--version"]))
    key = _source_hash(files, [*sources, *cflags, *cuda_cflags, *ldflags], tools)
    build_dir = cache_root() / f"{name}_{key}"
    library = build_dir / f"{name}.so"
    if library.is_file():
        return str(library)

    print(f"ffi_dsa: building {name} (first use in this environment; cached in {build_dir}) ...",
          file=sys.stderr, flush=True)
    start = time.perf_counter()
    env_backup = {k: os.environ.get(k) for k in ("CUDA_HOME", "TVM_FFI_CUDA_ARCH_LIST")}
    try:
        if has_cuda:
            os.environ["CUDA_HOME"] = cuda_home()
            # Hopper only, and sm_90a exactly: tvm-ffi's auto-detection picks sm_90, where wgmma
            # does not assemble. "9.0a" becomes -gencode=arch=compute_90a,code=sm_90a.
            os.environ["TVM_FFI_CUDA_ARCH_LIST"] = "9.0a"
        path = tvm_ffi.cpp.build(
            name=name,
            cpp_files=[str(root / s) for s in sources if not s.endswith(".cu")] or None,
            cuda_files=[str(root / s) for s in sources if s.endswith(".cu")] or None,
            extra_cflags=cflags,
            extra_cuda_cflags=cuda_cflags,
            extra_ldflags=ldflags,
            extra_include_paths=[str(root / "include")],
            build_directory=str(build_dir),
        )
    finally:
        for k, v in env_backup.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    print(f"ffi_dsa: built {name} in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return path


# No -march: the baseline stays the compiler's portable default (x86-64 on x86), so the cached
# module runs on any CPU; the SIMD variants carry their own ISA and are picked at run time.
CPU_FLAGS = ["-O3", "-ffp-contract=fast", "-fno-math-errno", "-pthread"]


def cpu_library() -> str:
    return build("ffi_dsa_cpu", ["csrc/cpu_binding.cc"], headers=["include/ffi_dsa/*.h", "include/ffi_dsa/cpu/*.h"],
                 cflags=CPU_FLAGS, ldflags=["-pthread"])


def cuda_library() -> str:
    home = cuda_home()
    return build(
        "ffi_dsa_cuda",
        ["csrc/cuda_binding.cu"],
        headers=["include/ffi_dsa/*.h", "include/ffi_dsa/impls/*.cuh"],
        cflags=["-O3"],
        # the -gencode flag comes from TVM_FFI_CUDA_ARCH_LIST, set in build()
        cuda_cflags=["-O3", "-std=c++17", "-lineinfo"],
        # libcudart is found where torch or JAX already loaded it, else in the toolkit.
        ldflags=[f"-Wl,-rpath,{home}/lib64"],
    )
