"""The house's structure as docs/layout.md states it: the core (ffi_dsa/) never imports its callers
(integration/, benchmarks/), imports the same modules the same way installed or in a checkout (no
__path__ edits, no switch on argv), loads nothing native when imported, and the CUDA archs the
sources hold (cuda/csrc/sm_*/) are the archs the native modules know."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import ffi_dsa
from ffi_dsa import _build, _ffi_api

from conftest import CHECKOUT, script_env

PACKAGE = Path(ffi_dsa.__file__).resolve().parent
CALLERS = ("integration", "benchmarks", "tests", "conftest")


def imported_names(path: Path) -> set[str]:
    """Every module a file imports, absolute (relative imports resolved against ffi_dsa)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = "ffi_dsa" + (f".{base}" if base else "")
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_the_core_never_imports_its_callers():
    """No edge from ffi_dsa/ to integration/ or benchmarks/ in the import graph (the examples and
    benchmarks import the core, never the other way round)."""
    for path in sorted(PACKAGE.glob("*.py")):
        for name in imported_names(path):
            parts = name.split(".")
            assert parts[0] not in CALLERS and parts[:2] not in (["ffi_dsa", c] for c in CALLERS), \
                f"{path.name} imports {name}"


def test_the_core_does_not_splice_paths_or_read_argv():
    """The wheel and a checkout import the same modules the same way: nothing in the package edits a
    package's __path__ or sys.path, or behaves differently by the command line it was started with."""
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                assert node.id != "__path__", f"{path.name}:{node.lineno} uses __path__"
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "sys":
                assert node.attr not in ("argv", "orig_argv", "path"), f"{path.name}:{node.lineno} reads sys.{node.attr}"


def test_the_scripts_import_no_checkout_paths():
    """The scripts of benchmarks/ and integration/ import the installed ffi_dsa and the siblings of
    their own folder, never a path they put on sys.path themselves."""
    for folder in ("benchmarks", "integration"):
        for path in sorted((CHECKOUT / folder).glob("*.py")):
            text = path.read_text()
            assert "sys.path" not in text and "__path__" not in text, f"{folder}/{path.name} edits an import path"


def test_importing_the_package_loads_nothing_native(tmp_path):
    """`import ffi_dsa` stays cheap: neither tvm_ffi (which imports torch when it is installed) nor a
    framework is imported until a name of the API is used."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import ffi_dsa"], cwd=tmp_path,
                          env=script_env(), capture_output=True, text=True, check=True)
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert not {"torch", "tvm_ffi", "jax", "numpy", "ffi_dsa.decode"} & imported, sorted(imported)


def test_importing_the_package_after_torch_registers_the_ops_and_loads_nothing_native(tmp_path):
    """With torch already imported, `import ffi_dsa` registers torch.ops.dsa.* (as torch extension
    libraries do), still without tvm_ffi or a native module: the ops load it on their first call."""
    code = textwrap.dedent("""
        import sys
        import torch
        import ffi_dsa
        ops = [torch.ops.dsa.topk_indexer, torch.ops.dsa.topk_indexer_out, torch.ops.dsa.prefill_topk_indexer,
               torch.ops.dsa.prefill_topk_indexer_out]
        assert "tvm_ffi" not in sys.modules, "registering imported tvm_ffi"
        assert "ffi_dsa_cpu" not in open("/proc/self/maps").read(), "registering loaded the native module"
        from ffi_dsa.workloads import make_batch
        out = torch.ops.dsa.topk_indexer(*make_batch([300, 0]).to_torch("cpu"), topk=8)
        assert out.shape == (2, 8) and (out[1] == -1).all()
        print("OK")
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=script_env(), capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stderr[-3000:]


def test_the_api_loads_on_first_use():
    assert set(ffi_dsa.__all__) <= set(dir(ffi_dsa))
    for name in ffi_dsa.__all__:
        assert getattr(ffi_dsa, name) is not None


def test_every_arch_folder_is_an_arch_the_modules_know():
    """cuda/csrc/sm_*/ (what CMake and the JIT build, one folder of translation units per arch) and
    cuda_archs.h (what the CPU module sizes JAX's scratch for, and what the CUDA binding dispatches on)
    list the same archs."""
    assert _build.source_archs() == sorted(str(a) for a in _ffi_api.cpu().cuda_archs())
    for arch in _build.source_archs():
        assert _ffi_api.cpu().workspace_bytes(arch, 2, 3) > 0


def test_no_public_name_is_a_module_name():
    """Importing a submodule sets the package's attribute of that name: a public function of the
    same name would be hidden by it (and loaded lazily, the API must not depend on import order)."""
    assert not {p.stem for p in PACKAGE.glob("*.py")} & set(ffi_dsa.__all__)
