# The two commands README.md quotes verbatim (one place for both): .ci/run sources this file,
# checks that README.md still contains each string exactly, and runs them as they stand.
# shellcheck shell=bash disable=SC2034
DEMO_CMD='python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 . && python -m ffi_dsa demo'
TEST_CMD='python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 ".[test]" && python -m pytest -q'
