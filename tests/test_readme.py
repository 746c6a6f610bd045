"""Every code block of README.md and docs/*.md runs as it stands, or its text says it is a fragment
and what it needs:

* a ```python block runs as a script of its own (a snippet that leans on names from another one
  fails here with its NameError); one whose first line is ``# torchrun <args> <script>.py`` runs
  under torchrun with those arguments (two CPU ranks);
* a ```python block whose paragraph says "(a fragment: needs ...)" is checked, not run: it parses,
  and every call it makes of a function from integration/ matches that function's signature;
* a plain ``` block is one of the README's two commands, which .ci/run runs as they stand
  (.ci/readme_commands.sh); a ```text block is notation (it must not be Python).

Every caller the README covers has a runnable snippet."""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import script_env

CHECKOUT = Path(__file__).resolve().parent.parent
README = CHECKOUT / "README.md"
DOCUMENTS = (README, *sorted((CHECKOUT / "docs").glob("*.md")))
FRAGMENT = re.compile(r"\(a fragment:\s+needs\s[^)]+\)")
TORCHRUN = re.compile(r"^# torchrun ((?:\S+ )*?)\S+\.py\b")
# what README.md must show a runnable snippet of, and how to recognize it
CALLERS = {"the op on numpy": "ffi_dsa.topk_indexer(", "torch": "torch.ops.dsa.topk_indexer(",
           "torch.compile": "@torch.compile", "JAX": "jax.jit(topk_indexer", "TVM Relax": "tvm_relax.indexer_module",
           "a serving engine": "# SGLang", "vLLM's positions and bound": 'ids="positions", max_seq_len=',
           "prefill": "ffi_dsa.prefill_topk_indexer(",
           "prefill in torch": "torch.ops.dsa.prefill_topk_indexer(", "prefill in JAX": "jax.jit(prefill_topk_indexer",
           "prefill in TVM Relax": "tvm_relax.prefill_module", "MXFP4 pages": "ffi_dsa.mxfp4_topk_indexer(",
           "MXFP4 in torch": "torch.ops.dsa.mxfp4_topk_indexer(", "MXFP4 in JAX": "jax.jit(mxfp4_topk_indexer"}


def _blocks(document: Path) -> list[tuple[str, str, str]]:
    """(info string, code, the paragraph before it) of every fenced block of `document` (none when
    it is not beside the tests)."""
    if not document.is_file():
        return []
    text = document.read_text()
    found = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M):
        before = text[:match.start()].rstrip().split("\n\n")[-1]
        found.append((match.group(1), match.group(2), before))
    return found


def _commands() -> list[str]:
    """The README's two commands, as .ci/readme_commands.sh states them for .ci/run."""
    script = (CHECKOUT / ".ci" / "readme_commands.sh").read_text()
    return [shlex.split(value)[0] for value in re.findall(r"^(?:DEMO|TEST)_CMD=(.*)$", script, flags=re.M)]


def _kind(info: str, code: str, before: str) -> str:
    if info == "python":
        return "fragment" if FRAGMENT.search(before) else "torchrun" if TORCHRUN.match(code) else "script"
    return {"": "command", "text": "notation"}.get(info, "unknown")


def _named(document: Path) -> dict[str, tuple]:
    """`document`'s blocks by name: its ```python blocks README.md-0, README.md-1, ... in order (the
    names tests/test_import_path.py runs one by), the others README.md-text-0, README.md-plain-0, ..."""
    named, counts = {}, {}
    for block in _blocks(document):
        kind = "" if block[0] == "python" else f"-{block[0] or 'plain'}"
        i = counts[kind] = counts.get(kind, -1) + 1
        named[f"{document.name}{kind}-{i}"] = (document.name, *block)
    return named


BLOCKS = {name: block for doc in DOCUMENTS for name, block in _named(doc).items()}
RUNNABLE = [name for name, (_, info, code, before) in BLOCKS.items() if _kind(info, code, before) in ("script", "torchrun")]
FRAGMENTS = [name for name, (_, info, code, before) in BLOCKS.items() if _kind(info, code, before) == "fragment"]
# README.md-0 .. : the README's python snippets keep these names (tests/test_import_path.py runs one)
SNIPPETS = {name: BLOCKS[name][2] for name in RUNNABLE}


OPTIONAL = ("jax", "jax_tvm_ffi", "tvm")  # the extras a snippet may need; any other module must be there


def _missing_module(code: str) -> str | None:
    """The first optional module the snippet needs that is not installed (tvm and jax are extras;
    ffi_dsa's JAX integration needs jax_tvm_ffi too). Any other missing module fails the snippet."""
    imported = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    if "jax" in imported:
        imported.add("jax_tvm_ffi")
    return next((m for m in sorted(imported) if m in OPTIONAL and importlib.util.find_spec(m) is None), None)


def test_the_readme_has_a_snippet_for_every_caller():
    if not README.is_file():
        pytest.skip(f"no README.md beside the tests ({README})")
    readme = [code for name, (doc, info, code, _) in BLOCKS.items() if doc == "README.md" and name in RUNNABLE]
    missing = [caller for caller, mark in CALLERS.items() if not any(mark in code for code in readme)]
    assert missing == [], f"README.md has no runnable ```python snippet for {missing}"


def test_every_code_block_is_run_or_marked():
    """Each block is a runnable snippet, a marked fragment, one of the commands .ci/run runs, or
    notation; nothing else (an unmarked shell block, a ```bash that nothing runs)."""
    if not README.is_file():
        pytest.skip(f"no README.md beside the tests ({README})")
    commands = _commands()
    assert len(commands) == 2, commands
    for name, (_, info, code, before) in BLOCKS.items():
        kind = _kind(info, code, before)
        assert kind != "unknown", f"{name}: a ```{info} block neither runs nor says it is a fragment"
        if kind == "command":
            assert code.strip() in commands, f"{name}: a shell block that is none of .ci/readme_commands.sh's"
        if kind == "notation":
            with pytest.raises(SyntaxError):
                ast.parse(code)  # Python would have to run: a ```python block, or a marked fragment
        if kind == "torchrun":
            assert "torchrun" in before, f"{name}: its text must say that it runs under torchrun"


@pytest.mark.parametrize("name", FRAGMENTS)
def test_fragment_parses_and_calls_integration_as_it_is(name):
    """A fragment of an engine's code: it parses, and each call of a function it imports from
    integration/ (copied beside the engine's indexer) passes arguments that function takes."""
    code = BLOCKS[name][2]
    tree = ast.parse(code)
    imported = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (CHECKOUT / "integration" / f"{node.module}.py").is_file():
            source = ast.parse((CHECKOUT / "integration" / f"{node.module}.py").read_text())
            defined = {f.name: f for f in source.body if isinstance(f, ast.FunctionDef)}
            for alias in node.names:
                assert alias.name in defined, f"integration/{node.module}.py defines no {alias.name}"
                imported[alias.asname or alias.name] = defined[alias.name]
    assert imported, f"{name}: a fragment that calls nothing of integration/ (what is it checked against?)"
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id in imported]
    assert calls, f"{name}: imports {sorted(imported)} but calls none"
    for call in calls:
        params = imported[call.func.id].args
        names = [a.arg for a in (*params.posonlyargs, *params.args, *params.kwonlyargs)]
        assert len(call.args) <= len(params.posonlyargs) + len(params.args), f"{name}: too many arguments"
        unknown = [k.arg for k in call.keywords if k.arg not in names]
        assert unknown == [], f"{name}: {call.func.id} takes no {unknown}"


@pytest.mark.parametrize("name", RUNNABLE)
def test_snippet_runs_by_itself(name, tmp_path):
    code = SNIPPETS[name]
    missing = _missing_module(code)
    if missing:
        pytest.skip(f"the snippet needs {missing}, which is not installed")
    script = tmp_path / "snippet.py"
    script.write_text(code)
    # the ffi_dsa this suite imports (the installed one in CI, else the checkout), from outside the checkout
    command = [sys.executable, str(script)]
    torchrun = TORCHRUN.match(code)
    if torchrun:
        with socket.socket() as s:
            s.bind(("localhost", 0))
            port = s.getsockname()[1]
        command = [sys.executable, "-m", "torch.distributed.run", "--master-addr", "localhost",
                   "--master-port", str(port), *torchrun.group(1).split(), str(script)]
    done = subprocess.run(command, cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"the snippet failed:\n{code}\n--- stderr ---\n{done.stderr[-4000:]}"
