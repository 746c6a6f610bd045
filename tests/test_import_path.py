"""Children started by the tests keep the caller's import path. On the GPU machine apache-tvm-ffi is
no installed package: its wheel is unpacked into a folder on PYTHONPATH (benchmarks/device_run.sh),
and every test that starts a Python child (README snippets, the build lock, the package's command
line, the sharded torch and JAX runs) failed there with `No module named 'tvm_ffi'` while the child's
environment dropped that PYTHONPATH. Here an interpreter that sees every package of this one except
tvm_ffi, which it finds only through PYTHONPATH, runs tests that start children."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
import tvm_ffi

import ffi_dsa

from conftest import CHECKOUT, FFI_DSA_PARENT, script_env

# tests that start a child which imports tvm_ffi: a snippet that calls the op
CHILD_TESTS = ["test_readme.py::test_snippet_runs_by_itself[README.md-0]"]


def test_script_env_puts_the_package_first_and_keeps_pythonpath(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/carried/wheels", "", "/more"]))
    assert script_env()["PYTHONPATH"].split(os.pathsep) == [FFI_DSA_PARENT, "/carried/wheels", "/more"]
    monkeypatch.delenv("PYTHONPATH")
    assert script_env()["PYTHONPATH"] == FFI_DSA_PARENT


def _site_dirs() -> list[Path]:
    """The folders this interpreter's children import packages from, in sys.path order: the folders
    PYTHONPATH names (the GPU machine's carried wheels, a checkout) and site-packages (which add
    their .pth folders themselves); not the stdlib, a script's folder or pytest's test folders."""
    named = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    allowed = {Path(p).resolve() for p in (*named, *site.getsitepackages())}
    found = [Path(p).resolve() for p in sys.path if p and Path(p).resolve() in allowed]
    return [p for p in dict.fromkeys(found) if p.is_dir()]


def _interpreter_without_tvm_ffi(root: Path) -> Path:
    """A venv whose site holds links to every package this interpreter imports but tvm_ffi (first
    found wins, as on sys.path), with the ffi_dsa under test where no tvm_ffi is beside it."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    site = root / "site"
    site.mkdir()
    hidden = ("tvm_ffi", "apache_tvm_ffi-", "ffi_dsa", "__pycache__")
    for folder in _site_dirs():
        for entry in folder.iterdir():
            if not entry.name.startswith(hidden) and not (site / entry.name).exists():
                (site / entry.name).symlink_to(entry)
    package = Path(ffi_dsa.__file__).resolve().parent
    if (package.parent / "tvm_ffi").exists():  # an installed ffi_dsa: a copy (a link would lead back)
        shutil.copytree(package, site / "ffi_dsa", ignore=shutil.ignore_patterns("__pycache__"))
    else:  # a checkout's (its sources beside it, no tvm_ffi there)
        (site / "ffi_dsa").symlink_to(package)
    own_site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
    # addsitedir: the linked folder's own .pth files are processed as site-packages' are
    Path(own_site, "linked_site.pth").write_text(f"import site; site.addsitedir({str(site)!r})\n")
    return python


@pytest.mark.slow
def test_children_of_the_tests_find_tvm_ffi_through_pythonpath_alone(tmp_path):
    python = _interpreter_without_tvm_ffi(tmp_path)
    carried = tmp_path / "carried"
    carried.mkdir()
    for entry in Path(tvm_ffi.__file__).resolve().parent.parent.glob("*tvm_ffi*"):
        if entry.name.startswith(("tvm_ffi", "apache_tvm_ffi-")):
            (carried / entry.name).symlink_to(entry)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CI")}
    probe = "import ffi_dsa, pathlib; print(pathlib.Path(ffi_dsa.__file__).parent); import tvm_ffi"
    alone = subprocess.run([str(python), "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert alone.returncode != 0 and "No module named 'tvm_ffi'" in alone.stderr, alone.stderr[-2000:]
    assert Path(alone.stdout.strip()).parent != Path(tvm_ffi.__file__).resolve().parent.parent, "ffi_dsa beside tvm_ffi"
    env["PYTHONPATH"] = str(carried)
    # the same tests, in that interpreter: the children they start must find tvm_ffi as it did
    done = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *(str(CHECKOUT / "tests" / t) for t in CHILD_TESTS)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert f"{len(CHILD_TESTS)} passed" in done.stdout, done.stdout[-2000:]
