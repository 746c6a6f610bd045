# The two commands README.md quotes verbatim (one place for both): .ci/run sources this file,
# checks that README.md still contains each string exactly, and runs them as they stand. The demo
# needs only the package on a machine without an NVIDIA GPU (it runs on the CPU there, as in CI);
# where nvidia-smi lists a GPU it also installs torch, which the CUDA path of the demo takes its
# device tensors from. The tests need torch's CPU build.
# `ffi-dsa` and `pytest` (not `python -m ...`) keep the checkout off sys.path, so both run what
# `pip install` built; `-v` shows the native build's progress.
# shellcheck shell=bash disable=SC2034
DEMO_CMD='python3 -m venv .venv && . .venv/bin/activate && pip install -v . $(nvidia-smi -L >/dev/null 2>&1 && echo torch) && ffi-dsa demo'
TEST_CMD='python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -v ".[test]" && pytest -q'
