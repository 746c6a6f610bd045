"""The package as installed: where its modules come from, the JIT fallback, its command line, and
the layout constants (docs/contract.md §1, §6)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ffi_dsa
from ffi_dsa import __main__ as cli
from ffi_dsa import _build, _ffi_api, contract

from conftest import CUDA, script_env

CHECKOUT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI") == "true"


@pytest.mark.skipif(not IN_CI, reason="CI=true only: a developer may test the source tree")
def test_ci_tests_the_installed_package_with_its_prebuilt_modules():
    """CI installs the wheel in a fresh venv: the suite must import that copy, not the checkout,
    and run the CPU module built at install time (a wheel without it would otherwise pass on JIT)."""
    package = Path(ffi_dsa.__file__).resolve().parent
    # the README's venv may sit inside the checkout: what matters is that this is not its source folder
    assert package != CHECKOUT / "ffi_dsa", f"ffi_dsa was imported from the checkout's sources: {package}"
    assert "site-packages" in package.parts, f"ffi_dsa is not an installed package: {package}"
    assert _build.prebuilt("cpu") is not None, f"the installed package has no CPU module in {_build.LIB_DIR}"
    assert Path(_ffi_api.module_path("cpu")) == _build.prebuilt("cpu")
    assert (_build.native_dir() / "csrc" / "cpu_binding.cc").is_file(), "the JIT fallback's sources are missing"


@pytest.mark.skipif(not IN_CI, reason="CI=true only: the native build cache of a CI run")
def test_ci_installed_the_modules_its_wheel_build_kept():
    """CI compiles the native modules once, building its wheel; the README's `pip install` then
    installs the files CMakeLists.txt kept in $FFI_DSA_CACHE_DIR instead of compiling them again.
    Either way the modules this suite loads are, byte for byte, modules that build kept."""
    for kind in ("cpu", "cuda"):
        installed = _build.prebuilt(kind)
        if kind == "cuda" and installed is None:
            continue  # a CI machine without nvcc builds no CUDA module
        assert installed is not None, f"the installed package has no {kind} module"
        kept = sorted(_build.cache_root().glob(f"wheel_{installed.stem}_*/{installed.name}"))
        assert kept, f"no {installed.name} kept in {_build.cache_root()}"
        assert any(k.read_bytes() == installed.read_bytes() for k in kept), (
            f"{installed} is none of the kept modules {kept}")


def test_layout_constants_are_those_of_contract_h():
    """ffi_dsa.contract reads the header the package ships (nothing native at import); the compiled
    CPU module, built from the same header, says the same, and the header says what is written here."""
    compiled = {str(k): int(v) for k, v in _ffi_api.cpu().contract_constants().items()}
    assert compiled == {"num_heads": contract.NUM_HEADS, "num_heads_narrow": contract.NUM_HEADS_NARROW,
                        "max_queries": contract.MAX_QUERIES, "head_dim": contract.HEAD_DIM,
                        "page_tokens": contract.PAGE_TOKENS, "token_bytes": contract.TOKEN_BYTES,
                        "page_fp8_bytes": contract.PAGE_FP8_BYTES, "page_bytes": contract.PAGE_BYTES,
                        "max_topk": contract.MAX_TOPK, "mxfp4_block": contract.MXFP4_BLOCK,
                        "mxfp4_blocks": contract.MXFP4_BLOCKS, "mxfp4_head_bytes": contract.MXFP4_HEAD_BYTES,
                        "mxfp4_token_bytes": contract.MXFP4_TOKEN_BYTES,
                        "mxfp4_page_value_bytes": contract.MXFP4_PAGE_VALUE_BYTES,
                        "mxfp4_page_bytes": contract.MXFP4_PAGE_BYTES, "ue8m0_bias": contract.UE8M0_BIAS,
                        "ue8m0_nan": contract.UE8M0_NAN}
    ids = {str(op): tuple(str(n) for n in names) for op, names in _ffi_api.cpu().contract_ids().items()}
    assert ids == {"topk_indexer": contract.DECODE_IDS, "prefill_topk_indexer": contract.PREFILL_IDS,
                   "mxfp4_topk_indexer": contract.MXFP4_IDS}
    assert tuple(float(v) for v in _ffi_api.cpu().contract_e2m1_magnitudes()) == contract.E2M1_MAGNITUDES
    assert (contract.MXFP4_BLOCKS, contract.MXFP4_TOKEN_BYTES, contract.MXFP4_PAGE_BYTES) == (4, 68, 4352)
    assert (contract.NUM_HEADS, contract.NUM_HEADS_NARROW, contract.MAX_QUERIES, contract.HEAD_DIM) == (64, 32, 4, 128)
    assert (contract.PAGE_TOKENS, contract.TOKEN_BYTES, contract.MAX_TOPK) == (64, 132, 2048)
    assert contract.SUPPORTED_HEADS == (contract.NUM_HEADS_NARROW, contract.NUM_HEADS)
    assert contract.PAGE_BYTES == contract.PAGE_TOKENS * contract.TOKEN_BYTES
    assert contract.PAGE_FP8_BYTES == contract.PAGE_TOKENS * contract.HEAD_DIM


def test_no_nvcc_and_no_cuda_module_is_one_error_saying_what_is_missing(monkeypatch):
    """A Hopper machine without nvcc and without a prebuilt CUDA module: NativeBuildError naming
    nvcc, CUDA_HOME and the two ways out (not ninja's exit status)."""
    monkeypatch.setattr(_build, "visible_compute_capabilities", lambda: [(9, 0)])
    monkeypatch.setattr(_build, "prebuilt", lambda kind: None)
    monkeypatch.setattr(_build, "find_nvcc", lambda: None)
    with pytest.raises(ffi_dsa.NativeBuildError) as exc:
        _build.cuda_library()
    message = str(exc.value)
    for needed in ("nvcc", "CUDA_HOME", "CUDA toolkit", "pip install"):
        assert needed in message, message


INSTALLED = Path("/installed/ffi_dsa_cuda.so")


@pytest.mark.parametrize("archs, gpus, nvcc, expected", [
    (["sm_90a"], [(9, 0)], None, "installed"),          # the wheel's module serves the H100, nvcc or not
    (["sm_90a"], [(8, 0)], "/cuda/bin/nvcc", "installed"),  # non-Hopper: the module's own error, no JIT
    (["sm_90a"], [], None, "installed"),                # no driver answer: try the installed one
    (["sm_100a"], [(9, 0)], "/cuda/bin/nvcc", "jit"),   # a Hopper GPU the wheel holds no code for
    (["sm_100a"], [(9, 0)], None, "error"),
    (None, [(9, 0)], "/cuda/bin/nvcc", "jit"),          # built without nvcc, or a source checkout
    (None, [(9, 0)], None, "error"),
])
def test_which_cuda_module_is_loaded(monkeypatch, archs, gpus, nvcc, expected):
    """The installed CUDA module unless a Hopper GPU present has no code in it; then a JIT build, or
    NativeBuildError when nvcc is missing too."""
    entry = {"file": INSTALLED.name, "archs": archs} if archs else None
    monkeypatch.setattr(_build, "manifest", lambda: {"cpu": {}, "cuda": entry})
    monkeypatch.setattr(_build, "prebuilt", lambda kind: INSTALLED if entry else None)
    monkeypatch.setattr(_build, "visible_compute_capabilities", lambda: gpus)
    monkeypatch.setattr(_build, "find_nvcc", lambda: Path(nvcc) if nvcc else None)
    monkeypatch.setattr(_build, "jit_cuda_library", lambda archs, reason: f"jit {' '.join(archs)}")
    if expected == "error":
        with pytest.raises(ffi_dsa.NativeBuildError, match="nvcc"):
            _build.cuda_library()
    else:
        assert _build.cuda_library() == {"installed": str(INSTALLED), "jit": "jit sm_90a"}[expected]


@pytest.mark.parametrize("arch, capability, runs", [
    ("sm_90a", (9, 0), True), ("sm_90a", (10, 0), False), ("sm_90a", (8, 9), False),
    ("sm_80", (8, 6), True), ("sm_86", (8, 0), False), ("sm_90", (10, 0), False), ("compute_90", (9, 0), False),
])
def test_which_installed_archs_run_on_which_gpu(arch, capability, runs):
    assert _build.arch_runs_on(arch, capability) is runs


@pytest.mark.cuda
def test_gpu_covered_by_the_installed_cuda_module_loads_it_without_a_jit_build():
    """Where the wheel holds a CUDA module for this GPU, that module is used (no nvcc needed)."""
    if _build.prebuilt("cuda") is None:
        pytest.skip("this installation holds no CUDA module (built without nvcc, or a source checkout)")
    assert Path(_ffi_api.module_path("cuda")) == _build.prebuilt("cuda")


def test_cli_bench_runs_from_the_package(capfd):
    """`python -m ffi_dsa bench` finds its benchmark script inside the package (installed) or beside
    it (checkout) and runs it on the same ffi_dsa."""
    assert cli.main(["bench", "--device", "cpu", "--batch", "2", "--tokens", "300", "--runs", "1",
                     "--warmup", "0", "--no-naive"]) == 0
    assert "ffi_dsa" in capfd.readouterr().out


def test_cli_help_and_info_import_neither_torch_nor_tvm_ffi(tmp_path):
    """`ffi-dsa --help` and `ffi-dsa info` answer at once: they import neither torch nor tvm_ffi
    (tvm_ffi imports torch when it is installed, which takes seconds)."""
    # the ffi_dsa this suite imports (the installed one in CI, else the checkout), from outside the checkout
    env = script_env()
    cli = [sys.executable, "-X", "importtime", "-m", "ffi_dsa"]
    subprocess.run([*cli, "info"], cwd=tmp_path, env=env, capture_output=True, check=True)  # a checkout JIT-builds once
    for command in ("--help", "info"):
        done = subprocess.run([*cli, command], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
        imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
        assert not {"torch", "tvm_ffi", "ffi_dsa.decode"} & imported, f"ffi-dsa {command} imported {imported}"


def test_cli_info_reports_the_cpu_module(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert _ffi_api.module_path("cpu") in out
    if not CUDA:
        assert '"gpus": []' in out


def test_the_docs_name_every_cmake_option_and_the_cuda_skip():
    """docs/build.md names each option() and cache setting of CMakeLists.txt, and it and the README's
    install section give the switch that skips the CUDA module as pip takes it."""
    if not (CHECKOUT / "CMakeLists.txt").is_file():
        pytest.skip("no checkout beside the tests")
    cmake = (CHECKOUT / "CMakeLists.txt").read_text()
    options = re.findall(r"^option\((FFI_DSA_\w+)", cmake, flags=re.M)
    settings = re.findall(r"^set\((FFI_DSA_\w+) .* CACHE ", cmake, flags=re.M)
    assert "FFI_DSA_CUDA" in options, options
    build = (CHECKOUT / "docs" / "build.md").read_text()
    assert [name for name in options + settings if f"`{name}`" not in build] == []
    readme = (CHECKOUT / "README.md").read_text()
    for text in (build, readme):
        assert "-C cmake.define.FFI_DSA_CUDA=OFF" in text

