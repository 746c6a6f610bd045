"""The snippets of README.md and docs/callers.md run as they stand, each as a script of its own (the
README says so): a snippet that leans on names from another one fails here with its NameError. Every
caller the README covers has one. (docs/serving.md's blocks are fragments of the engines' code: its
wiring is tests/test_engine_wiring.py's.)"""

from __future__ import annotations

import ast
import importlib.util
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import script_env

CHECKOUT = Path(__file__).resolve().parent.parent
README = CHECKOUT / "README.md"
DOCUMENTS = (README, CHECKOUT / "docs" / "callers.md")
# what README.md must show a runnable snippet of, and how to recognize it
CALLERS = {"the op on numpy": "ffi_dsa.topk_indexer(", "torch": "torch.ops.dsa.topk_indexer(",
           "torch.compile": "@torch.compile", "JAX": "jax.jit(topk_indexer", "TVM Relax": "tvm_relax.indexer_module",
           "a serving engine": "# SGLang", "vLLM's positions and bound": 'ids="positions", max_seq_len=',
           "prefill": "ffi_dsa.prefill_topk_indexer(",
           "prefill in torch": "torch.ops.dsa.prefill_topk_indexer(", "prefill in JAX": "jax.jit(prefill_topk_indexer",
           "prefill in TVM Relax": "tvm_relax.prefill_module", "MXFP4 pages": "ffi_dsa.mxfp4_topk_indexer(",
           "MXFP4 in torch": "torch.ops.dsa.mxfp4_topk_indexer(", "MXFP4 in JAX": "jax.jit(mxfp4_topk_indexer"}


def _snippets(document: Path) -> list[str]:
    """Every ```python block of `document` (none when it is not beside the tests)."""
    if not document.is_file():
        return []
    return re.findall(r"^```python\n(.*?)^```", document.read_text(), flags=re.S | re.M)


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


SNIPPETS = {f"{doc.name}-{i}": code for doc in DOCUMENTS for i, code in enumerate(_snippets(doc))}


def test_the_readme_has_a_snippet_for_every_caller():
    if not README.is_file():
        pytest.skip(f"no README.md beside the tests ({README})")
    readme = _snippets(README)
    missing = [caller for caller, mark in CALLERS.items() if not any(mark in code for code in readme)]
    assert missing == [], f"README.md has no ```python snippet for {missing}"


@pytest.mark.parametrize("name", list(SNIPPETS))
def test_snippet_runs_by_itself(name, tmp_path):
    code = SNIPPETS[name]
    missing = _missing_module(code)
    if missing:
        pytest.skip(f"the snippet needs {missing}, which is not installed")
    script = tmp_path / "snippet.py"
    script.write_text(code)
    # the ffi_dsa this suite imports (the installed one in CI, else the checkout), from outside the
    # checkout; a one-process torchrun environment for a snippet written for torchrun
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = dict(script_env(), RANK="0", WORLD_SIZE="1", MASTER_ADDR="localhost", MASTER_PORT=str(port))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"the snippet failed:\n{code}\n--- stderr ---\n{done.stderr[-4000:]}"
