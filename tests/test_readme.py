"""README.md's framework snippets run as they stand, each as a script of its own (the README says so):
a snippet that leans on names from another one fails here with its NameError."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import script_env

README = Path(__file__).resolve().parent.parent / "README.md"
SECTION = "## Framework integrations"


def _snippets() -> list[str]:
    """The ```python blocks of README's framework section (empty when the README is not beside the tests)."""
    if not README.is_file():
        return []
    text = README.read_text()
    start = text.find(SECTION)
    if start < 0:
        return []
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:end if end >= 0 else len(text)]
    return re.findall(r"^```python\n(.*?)^```", section, flags=re.S | re.M)


def _missing_module(code: str) -> str | None:
    """The first module the snippet needs that is not installed (tvm and jax are optional extras;
    ffi_dsa's JAX integration needs jax_tvm_ffi too)."""
    imported = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    if "jax" in imported:
        imported.add("jax_tvm_ffi")
    return next((m for m in sorted(imported) if importlib.util.find_spec(m) is None), None)


SNIPPETS = _snippets()


def test_the_readme_has_framework_snippets():
    if not README.is_file():
        pytest.skip(f"no README.md beside the tests ({README})")
    assert len(SNIPPETS) >= 4, f"expected the torch, MTP, JAX and TVM snippets under {SECTION!r}"


@pytest.mark.parametrize("code", SNIPPETS, ids=[f"snippet{i}" for i in range(len(SNIPPETS))])
def test_readme_snippet_runs_by_itself(code, tmp_path):
    missing = _missing_module(code)
    if missing:
        pytest.skip(f"the snippet needs {missing}, which is not installed")
    script = tmp_path / "snippet.py"
    script.write_text(code)
    # the ffi_dsa this suite imports (the installed one in CI, else the checkout), from outside the checkout
    env = script_env()
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"the snippet failed:\n{code}\n--- stderr ---\n{done.stderr[-4000:]}"
