"""Launch N processes of a ``jax.distributed`` program on this host, the coordinator on localhost.

    python -m ffi_dsa.integration.jax_processes --processes 2                  # the check, 2 CPU processes
    python -m ffi_dsa.integration.jax_processes --processes 2 --platform gpu   # one GPU each
    python -m ffi_dsa.integration.jax_processes --processes 4 --module my.server -- --my-flag 1

Process i runs ``python -m MODULE --process-id i --processes N --coordinator localhost:PORT
--platform P [the arguments after --]`` (PORT: a free one), so MODULE calls
``jax_distributed.initialize`` with those (the default module is ``jax_distributed``'s check). Each
process's lines are echoed as they come, prefixed ``[i]``; the launch fails when any process exits
non-zero or the whole launch outlives ``--timeout`` (every process still running is then killed).
On the CPU each process gets ``FFI_DSA_NUM_THREADS`` = cores / N (unless set), so N processes do not
each start a thread per core.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

CHECK_MODULE = "ffi_dsa.integration.jax_distributed"
# after one process failed, how long the others get to end on their own before they are killed
FAILED_PEER_GRACE_S = 10.0


@dataclass
class Finished:
    """One process of a launch: its exit status (None: killed at the deadline) and its output lines."""

    process_id: int
    returncode: int | None
    lines: list[str] = field(default_factory=list)


def free_port() -> int:
    """A TCP port nothing listens on now (the coordinator binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def process_env(processes: int, platform: str, base=None) -> dict:
    env = dict(os.environ if base is None else base)
    if platform == "cpu":
        env.setdefault("FFI_DSA_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // processes)))
    else:
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return env


def _pump(stream, finished: Finished, echo: bool) -> None:
    for line in stream:
        line = line.rstrip("\n")
        finished.lines.append(line)
        if echo:
            print(f"[{finished.process_id}] {line}", flush=True)


def launch(processes: int, module: str = CHECK_MODULE, args=(), platform: str = "cpu",
           timeout: float = 300.0, echo: bool = True) -> list[Finished]:
    """Run `processes` copies of ``python -m module`` as one jax.distributed job; returns each
    process's outcome once all have ended (or the deadline has passed and the rest were killed)."""
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    coordinator = f"localhost:{free_port()}"
    env = process_env(processes, platform)
    children, pumps, finished = [], [], []
    for i in range(processes):
        cmd = [sys.executable, "-m", module, "--process-id", str(i), "--processes", str(processes),
               "--coordinator", coordinator, "--platform", platform, *args]
        child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        done = Finished(i, None)
        pump = threading.Thread(target=_pump, args=(child.stdout, done, echo), daemon=True)
        pump.start()
        children.append(child)
        pumps.append(pump)
        finished.append(done)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes = [child.poll() for child in children]
        if all(c is not None for c in codes):
            break
        if any(c not in (None, 0) for c in codes):
            # the others may wait for the failed one at a barrier forever: a short grace, then the kill
            deadline = min(deadline, time.monotonic() + FAILED_PEER_GRACE_S)
        time.sleep(0.05)
    for child, done in zip(children, finished):
        if child.poll() is None:
            child.kill()
            child.wait()
        else:
            done.returncode = child.returncode
    for pump in pumps:
        pump.join(timeout=5)
    return finished


def failures(finished: list[Finished]) -> list[str]:
    """One line per process that did not exit 0."""
    return [f"process {f.process_id}: " + ("killed at the deadline" if f.returncode is None else f"exit {f.returncode}")
            for f in finished if f.returncode != 0]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = []
    if "--" in argv:
        rest, argv = argv[argv.index("--") + 1:], argv[:argv.index("--")]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--platform", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--module", default=CHECK_MODULE, help="what each process runs (python -m MODULE)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole launch")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    finished = launch(args.processes, args.module, rest, args.platform, args.timeout)
    bad = failures(finished)
    print(f"{args.processes} processes of {args.module} on {args.platform}: "
          f"{'all exited 0' if not bad else '; '.join(bad)} ({time.perf_counter() - start:.1f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
