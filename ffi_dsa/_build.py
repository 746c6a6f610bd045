"""Where the native modules come from: the ones built at install time, else a JIT build.

``pip install`` compiles the modules with CMake (CMakeLists.txt) into ``ffi_dsa/lib``: the CPU module
always (``-march=x86-64-v3``), the CUDA module when nvcc was found (every arch of ``cuda/csrc/sm_*/``,
static cudart);
``lib/native.json`` says what is there. Without a fitting prebuilt module (a source checkout, a wheel
built without nvcc, a GPU of an arch the wheel holds no code for) the sources are compiled on first
use through tvm-ffi's JIT build: one line on stderr says so, and the result is cached by a hash of
every source byte, flag and compiler version. When that build cannot run either, the error says
what is missing (:class:`NativeBuildError`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

# tvm_ffi is imported only where a build needs it: importing it imports torch when torch is
# installed, and `ffi-dsa --help` / `ffi-dsa info` need neither.

_PACKAGE_DIR = Path(__file__).resolve().parent
LIB_DIR = _PACKAGE_DIR / "lib"


class NativeBuildError(RuntimeError):
    """A native module is neither installed nor buildable here; the message says what is missing."""


def native_dir() -> Path:
    """The C++/CUDA sources: inside an installed wheel, or the repository's cuda/ folder."""
    for candidate in (_PACKAGE_DIR / "cuda", _PACKAGE_DIR.parent / "cuda"):
        if (candidate / "include" / "ffi_dsa" / "contract.h").is_file():
            return candidate
    raise NativeBuildError(f"ffi_dsa: the native sources are not next to {_PACKAGE_DIR} (neither cuda/ "
                           "inside the package nor beside it); reinstall the package")


@functools.cache
def manifest() -> dict:
    """What the install-time build put in lib/ (CMakeLists.txt writes it); {} in a source checkout."""
    try:
        return json.loads((LIB_DIR / "native.json").read_text())
    except FileNotFoundError:
        return {}


def prebuilt(kind: str) -> Path | None:
    """The installed module of `kind` ('cpu' or 'cuda'), if the install-time build made one."""
    entry = manifest().get(kind)
    if entry and (LIB_DIR / entry["file"]).is_file():
        return LIB_DIR / entry["file"]
    return None


def cache_root() -> Path:
    return Path(os.environ.get("FFI_DSA_CACHE_DIR", Path.home() / ".cache" / "ffi_dsa")).expanduser()


def find_nvcc() -> Path | None:
    """The toolkit's own nvcc. An nvcc on PATH may be a wrapper script (/usr/local/bin/nvcc on our
    CPU machine), which misleads tvm-ffi's guess of the toolkit's include and lib directories."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    on_path = shutil.which("nvcc")
    if on_path:
        homes.append(str(Path(on_path).resolve().parent.parent))
    homes.append("/usr/local/cuda")
    for home in filter(None, homes):
        nvcc = Path(home) / "bin" / "nvcc"
        if nvcc.is_file() and (Path(home) / "include" / "cuda.h").is_file():
            return nvcc
    return None


def cuda_home() -> str:
    nvcc = find_nvcc()
    return str(nvcc.parent.parent) if nvcc else os.environ.get("CUDA_HOME", "/usr/local/cuda")


def visible_compute_capabilities() -> list[tuple[int, int]]:
    """(major, minor) of every GPU the CUDA driver shows this process; [] without a driver. Asked
    of libcuda directly, so JAX-only and numpy-only processes get the same answer as torch ones."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return []
    count, major, minor, device = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return []
    found = []
    for ordinal in range(count.value):
        if (cuda.cuDeviceGet(ctypes.byref(device), ordinal) == 0
                and cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, device) == 0   # ..._COMPUTE_CAPABILITY_MAJOR
                and cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, device) == 0):  # ..._COMPUTE_CAPABILITY_MINOR
            found.append((major.value, minor.value))
    return found


def arch_runs_on(arch: str, capability: tuple[int, int]) -> bool:
    """Whether SASS for `arch` ('sm_90a', 'sm_90') runs on a GPU of `capability`: arch-specific code
    ('a'/'f' suffix) only on exactly that capability, plain code on the same major and a newer minor."""
    m = re.fullmatch(r"sm_(\d+)(\d)([af]?)", arch)
    if not m:
        return False
    major, minor = int(m[1]), int(m[2])
    if m[3]:
        return capability == (major, minor)
    return capability[0] == major and capability[1] >= minor


def _tool_version(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "absent"


def _tvm_ffi_version() -> str:
    """tvm-ffi's version, from its installed metadata where there is one: found on every call of
    build(), also when the module is cached, where importing tvm_ffi would be the slow part."""
    try:
        return importlib.metadata.version("apache-tvm-ffi")
    except importlib.metadata.PackageNotFoundError:
        import tvm_ffi

        return tvm_ffi.__version__


def _source_hash(files: list[Path], flags: list[str], tools: list[str]) -> str:
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(str(path.relative_to(native_dir())).encode())
        digest.update(path.read_bytes())
    for item in [*flags, *tools, _tvm_ffi_version(), sys.platform]:
        digest.update(item.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _ninja_on_path() -> None:
    """tvm-ffi runs `ninja` from PATH; the ninja wheel (a dependency) puts it in the environment's
    bin/, which is not on PATH when Python is started by its full path without activating it."""
    if shutil.which("ninja"):
        return
    try:
        import ninja
    except ImportError:
        raise NativeBuildError("ffi_dsa: the JIT build needs ninja, which is neither on PATH nor importable: "
                               "`pip install ninja`") from None
    os.environ["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"


def build(name: str, sources: list[str], *, headers: list[str], cflags: list[str],
          cuda_cflags: list[str] | None = None, ldflags: list[str] | None = None, objects: list[str] | None = None,
          include_paths: list[str] | None = None, cuda_arch_list: str | None = None, output: str | None = None,
          reason: str = "JIT build", cache_dir: Path | None = None) -> str:
    """JIT-build (or reuse from the cache) module `name` from `sources`; `headers` are the globs
    (relative to native_dir()) of what they include, so an edit to a CUDA header does not rebuild
    the CPU module. `objects` are objects built before (by this function: their folder names hold
    their keys) linked in; `cuda_arch_list` is tvm-ffi's TVM_FFI_CUDA_ARCH_LIST ("9.0a"); `output`
    an object file name builds that object instead of a module; `cache_dir` replaces cache_root()."""
    root = native_dir()
    cuda_cflags = list(cuda_cflags or [])
    ldflags = list(ldflags or [])
    objects = list(objects or [])
    include_paths = [str(root / "include"), *(include_paths or [])]
    files = sorted({p for pattern in headers for p in root.glob(pattern) if p.is_file()} | {root / s for s in sources})
    has_cuda = any(s.endswith(".cu") for s in sources)
    tools = [_tool_version([os.environ.get("CXX", "c++"), "--version"])]
    if has_cuda:
        tools.append(_tool_version([str(Path(cuda_home()) / "bin" / "nvcc"), "--version"]))
    key = _source_hash(files, [*sources, *cflags, *cuda_cflags, *ldflags, *include_paths, cuda_arch_list or "",
                               output or "", *(Path(o).parent.name for o in objects)], tools)
    build_dir = (cache_dir or cache_root()) / f"{name}_{key}"
    library = build_dir / (output or f"{name}.so")
    if library.is_file():
        return str(library)
    with _build_lock(build_dir):
        if library.is_file():  # another process built it while this one waited
            return str(library)
        return _build_locked(name, [str(root / s) for s in sources] + objects, build_dir,
                             dict(extra_cflags=cflags, extra_cuda_cflags=cuda_cflags, extra_ldflags=ldflags,
                                  extra_include_paths=include_paths, output=output),
                             cuda_arch_list if has_cuda else None, reason)


@contextlib.contextmanager
def _build_lock(build_dir: Path):
    """One process at a time builds a module into `build_dir` (torchrun ranks starting on an empty
    cache would otherwise all run ninja in the same folder); the others wait, then load its result."""
    build_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # no POSIX locks: builds are not serialized
        yield
        return
    with open(build_dir.parent / f"{build_dir.name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            print(f"ffi_dsa: waiting for another process building into {build_dir} ...", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build_locked(name, sources, build_dir, options, cuda_arch_list, reason) -> str:
    """The build itself (build() holds the lock): tvm-ffi's build of `sources` with `options`;
    `cuda_arch_list` is None for a build without CUDA sources."""
    import tvm_ffi.cpp

    _ninja_on_path()
    print(f"ffi_dsa: building {options['output'] or name} ({reason}; cached in {build_dir}) ...",
          file=sys.stderr, flush=True)
    start = time.perf_counter()
    env_backup = {k: os.environ.get(k) for k in ("CUDA_HOME", "TVM_FFI_CUDA_ARCH_LIST")}
    try:
        if cuda_arch_list is not None:
            os.environ["CUDA_HOME"] = cuda_home()
            os.environ["TVM_FFI_CUDA_ARCH_LIST"] = cuda_arch_list
        path = tvm_ffi.cpp.build(name=name, sources=sources, build_directory=str(build_dir), **options)
    except Exception as err:
        raise NativeBuildError(f"ffi_dsa: the JIT build of {name} in {build_dir} failed: {err}") from err
    finally:
        for k, v in env_backup.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    print(f"ffi_dsa: built {options['output'] or name} in {time.perf_counter() - start:.1f} s", file=sys.stderr,
          flush=True)
    return path


# Only the tvm-ffi entry points leave a module, as in the wheel's (CMakeLists.txt, ffi_dsa_module;
# why: cuda/module_exports.map): hidden visibility in the compile, the version script in the link.
HIDDEN_SYMBOLS = ["-fvisibility=hidden", "-fvisibility-inlines-hidden"]
EXPORTS_MAP = "module_exports.map"


def _exports_only() -> str:
    return f"-Wl,--version-script={native_dir() / EXPORTS_MAP}"


OWN_NAMESPACE = "7ffi_dsa"  # how `ffi_dsa::` appears in a mangled C++ name


def exported_own_symbols(library: str | Path) -> list[str]:
    """The symbols of ffi_dsa's own C++ that `library` defines in its dynamic table (binding and
    mangled name): none where only the extern "C" entry points leave the module."""
    table = subprocess.run(["readelf", "--dyn-syms", "--wide", str(library)], capture_output=True, text=True,
                           check=True).stdout
    own = []
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 8 or not fields[0].rstrip(":").isdigit() or fields[6] == "UND":
            continue
        binding, name = fields[4], fields[7]
        if OWN_NAMESPACE in name:
            own.append(f"{binding} {name}")
    return own


# No -march in the JIT build either: the baseline stays the compiler's portable default (x86-64),
# and the SIMD variants carry their own ISA and are picked at run time (cpu/dispatch.h); a global
# -march=native would let AVX-512 into code that runs before the CPU check. The wheel's module
# targets x86-64-v3 (CMakeLists.txt).
JIT_CPU_FLAGS = ["-O3", "-ffp-contract=fast", "-fno-math-errno", "-pthread", *HIDDEN_SYMBOLS]


def jit_cpu_library(reason: str = "JIT build", cache_dir: Path | None = None) -> str:
    return build("ffi_dsa_cpu", ["csrc/cpu_binding.cc"],
                 headers=["include/ffi_dsa/*.h", "include/ffi_dsa/cpu/*.h", "include/ffi_dsa/validate/*.h",
                          "include/ffi_dsa/launch/*_workspace_bytes.h", EXPORTS_MAP],
                 cflags=JIT_CPU_FLAGS, ldflags=["-pthread", _exports_only()], reason=reason, cache_dir=cache_dir)


def cpu_library() -> str:
    """The CPU module to load: the installed one, else a JIT build."""
    installed = prebuilt("cpu")
    return str(installed) if installed else jit_cpu_library(f"no installed CPU module in {LIB_DIR}")


# ---- the CUDA module: an arch-neutral binding and, per arch, that arch's translation units ------

def source_archs() -> list[str]:
    """The CUDA archs the sources hold kernels for, as nvcc names them: one folder of translation
    units each (cuda/csrc/sm_90a/), compiled with that arch's flags alone."""
    return sorted(p.name for p in (native_dir() / "csrc").glob("sm_*") if p.is_dir())


def arch_capability(arch: str) -> tuple[int, int]:
    """The compute capability arch-specific code for `arch` ('sm_90a') runs on: (9, 0)."""
    m = re.fullmatch(r"sm_(\d+)(\d)[af]?", arch)
    if not m:
        raise ValueError(f"not a CUDA arch name: {arch!r}")
    return int(m[1]), int(m[2])


_JIT_CUDA_FLAGS = ["-O3", "-std=c++17", "-lineinfo", f"-Xcompiler={','.join(HIDDEN_SYMBOLS)}"]
_HOST_HEADERS = ["include/ffi_dsa/*.h", "include/ffi_dsa/validate/*.h", "include/ffi_dsa/launch/*"]


def jit_cuda_library(archs: list[str], reason: str = "JIT build") -> str:
    """The CUDA module for `archs`: each arch's translation units into one object (compiled in
    parallel by ninja), then the binding linked with them, as CMakeLists.txt builds it."""
    home = cuda_home()
    objects = []
    for arch in archs:
        major, minor = arch_capability(arch)
        suffix = arch[len(f"sm_{major}{minor}"):]
        objects.append(build(
            f"ffi_dsa_cuda_{arch}",
            sorted(str(p.relative_to(native_dir())) for p in (native_dir() / "csrc" / arch).glob("*.c[cu]")),
            headers=[*_HOST_HEADERS, "include/ffi_dsa/impls/*.cuh"],
            cflags=["-O3", *HIDDEN_SYMBOLS], cuda_cflags=_JIT_CUDA_FLAGS, cuda_arch_list=f"{major}.{minor}{suffix}",
            output=f"ffi_dsa_cuda_{arch}.o", reason=reason))
    return build(
        "ffi_dsa_cuda", ["csrc/cuda_binding.cc"], headers=[*_HOST_HEADERS, EXPORTS_MAP], objects=objects,
        cflags=["-O3", *HIDDEN_SYMBOLS, *(f"-DFFI_DSA_ARCH_{arch.upper()}" for arch in archs)],
        include_paths=[f"{home}/include"],
        # libcudart is found where torch or JAX already loaded it, else in the toolkit.
        ldflags=[f"-L{home}/lib64", "-lcudart", f"-Wl,-rpath,{home}/lib64", _exports_only()],
        reason=reason,
    )


def cuda_library() -> str:
    """The CUDA module to load: the installed one unless a GPU present that the sources hold kernels
    for has no code in it, else a JIT build (for the archs of the GPUs present, or every arch the
    sources hold when the driver shows none); NativeBuildError, saying what is missing, when neither
    can be had."""
    installed = prebuilt("cuda")
    built = (manifest().get("cuda") or {}).get("archs", [])
    present = visible_compute_capabilities()
    wanted = [a for a in source_archs() if arch_capability(a) in present]
    uncovered = [a for a in wanted if not any(arch_runs_on(b, arch_capability(a)) for b in built)]
    if installed and not uncovered:
        return str(installed)
    if installed:
        why = f"the installed CUDA module holds {', '.join(built)} code, none for this GPU ({', '.join(uncovered)})"
    elif manifest():
        why = f"this installation holds no CUDA module (nvcc was not found when it was built; {LIB_DIR})"
    else:
        why = f"this is a source checkout with no installed CUDA module ({LIB_DIR} holds none)"
    if find_nvcc() is None:
        raise NativeBuildError(
            f"ffi_dsa: no usable CUDA module: {why}; building one needs nvcc, which was not found "
            f"(CUDA_HOME={os.environ.get('CUDA_HOME')!r}, no nvcc on PATH, no /usr/local/cuda/bin/nvcc). "
            "Install the CUDA toolkit (12.8 or newer) and set CUDA_HOME to it, then either reinstall ffi-dsa "
            "(`pip install .` builds the CUDA module into the wheel) or call again (the first CUDA call "
            "builds it once, in a minute or so, cached in $FFI_DSA_CACHE_DIR)."
        )
    archs = uncovered or wanted or source_archs()
    return jit_cuda_library(archs, reason=f"{why}; for {', '.join(archs)} with {find_nvcc()}")
