"""The suite's own switches (tests/conftest.py): without a GPU the tests marked cuda are deselected
with one summary line saying so, skips are summed up one line per reason, and ``--part I/N`` splits
a run into N shares that together run every test once (benchmarks/device_run.sh test runs them at
once)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import CHECKOUT, CUDA, script_env

# a file of CPU tests beside one whose tests are all marked cuda
FILES = [str(CHECKOUT / "tests" / name) for name in ("test_options.py", "test_cuda_paths.py")]


def _pytest(*args: str, cwd) -> subprocess.CompletedProcess:
    """pytest in a child, from outside the checkout (its sources must not shadow the package)."""
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd,
                          env=script_env(), capture_output=True, text=True, timeout=300)


def _collected(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_parts_split_the_run_and_gpu_tests_are_deselected_in_one_line(tmp_path):
    whole = _pytest("--collect-only", "-q", *FILES, cwd=tmp_path)
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-2000:]
    everything = _collected(whole)
    assert len(everything) > 10
    if not CUDA:
        assert not any("test_cuda_paths.py" in t for t in everything), "a test marked cuda was collected"
        assert "marked cuda deselected: torch.cuda.is_available() is False" in whole.stdout
    parts = [_collected(_pytest("--collect-only", "-q", f"--part={i}/2", *FILES, cwd=tmp_path)) for i in (1, 2)]
    assert sorted(parts[0] + parts[1]) == sorted(everything)
    assert not set(parts[0]) & set(parts[1])
    assert abs(len(parts[0]) - len(parts[1])) <= 1, "the shares must be even"


def test_a_bad_part_is_a_usage_error(tmp_path):
    done = _pytest("--collect-only", "-q", "--part=3/2", FILES[0], cwd=tmp_path)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    assert "--part must be I/N with 1 <= I <= N" in done.stderr


def test_skips_are_listed_one_line_per_reason(tmp_path):
    test = tmp_path / "test_two_reasons.py"
    test.write_text("import pytest\n\n"
                    "@pytest.mark.parametrize('i', range(3))\n"
                    "def test_a(i):\n    pytest.skip('needs a thing')\n\n"
                    "@pytest.mark.skip(reason='needs another thing')\n"
                    "def test_b():\n    pass\n")
    # the suite's summary hook alone, loaded under a name of its own (this folder's conftest is "conftest")
    (tmp_path / "conftest.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('suite_conftest', {str(CHECKOUT / 'tests' / 'conftest.py')!r})\n"
        "suite = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(suite)\n"
        "pytest_terminal_summary = suite.pytest_terminal_summary\n")
    done = _pytest("-q", str(test), cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert "3  needs a thing  (test_two_reasons.py)" in lines, done.stdout
    assert "1  needs another thing  (test_two_reasons.py)" in lines, done.stdout
