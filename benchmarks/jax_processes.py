"""JAX with one process per device: launch N processes of a ``jax.distributed`` program on this host
(the coordinator on localhost), and the check each process of the default program runs.

    python benchmarks/jax_processes.py --processes 2                  # the check, 2 CPU processes
    python benchmarks/jax_processes.py --processes 2 --platform gpu   # one GPU each
    python benchmarks/jax_processes.py --processes 4 --script my_server.py -- --my-flag 1

Process i runs ``python SCRIPT --process-id i --processes N --coordinator localhost:PORT
--platform P [the arguments after --]`` (PORT: a free one), so SCRIPT calls
``ffi_dsa.jax_distributed.initialize`` with those (the default script is this file, whose processes
run the check below). Each process's lines are echoed as they come, prefixed ``[i]``; the launch
fails when any process exits non-zero or the whole launch outlives ``--timeout`` (every process
still running is then killed). On the CPU each process gets ``FFI_DSA_NUM_THREADS`` = cores / N
(unless set), so N processes do not each start a thread per core.

The check: every process computes its rows in each layout of ``check_batches`` (a pool per process,
the same with two queries per row and 32 heads, one pool shared by all) through
``ffi_dsa.jax_distributed``, and compares them with the float64 reference (the contract's
tolerance) and byte for byte with the single-device call on the same rows.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import ffi_dsa
from ffi_dsa import jax_distributed as jd
from ffi_dsa.contract import HEAD_DIM, PAGE_BYTES, PAGE_FP8_BYTES, PAGE_TOKENS
from ffi_dsa.workloads import make_batch

CHECK_SCRIPT = str(Path(__file__).resolve())  # this file: its processes run the check
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


def launch(processes: int, script: str = CHECK_SCRIPT, args=(), platform: str = "cpu",
           timeout: float = 300.0, echo: bool = True) -> list[Finished]:
    """Run `processes` copies of ``python script`` as one jax.distributed job; returns each
    process's outcome once all have ended (or the deadline has passed and the rest were killed)."""
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    coordinator = f"localhost:{free_port()}"
    env = process_env(processes, platform)
    children, pumps, finished = [], [], []
    for i in range(processes):
        cmd = [sys.executable, str(script), "--process-id", str(i), "--processes", str(processes),
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
    for pump, child in zip(pumps, children):
        pump.join(timeout=5)
        child.stdout.close()  # each pipe is read to its end by then; an unclosed one is a ResourceWarning
    return finished


def failures(finished: list[Finished]) -> list[str]:
    """One line per process that did not exit 0."""
    return [f"process {f.process_id}: " + ("killed at the deadline" if f.returncode is None else f"exit {f.returncode}")
            for f in finished if f.returncode != 0]


# ---- the check each process of the default script runs -----------------------------------------

# Every length the contract singles out, and rows longer than K, on each process.
CHECK_LENGTHS = (0, 1, 100, 2047, 2048, 2049, 3000, 4100)


def _with_ties(batch, seed: int):
    """Copy some tokens' keys and scales onto their row's next token: equal scores, so the smaller
    position must win, on both sides of the K-th place of the long rows."""
    rng = np.random.default_rng(seed)
    pages = batch.k_cache.view(np.uint8).reshape(-1, PAGE_BYTES)
    lens = np.asarray(batch.seq_lens).reshape(len(batch.seq_lens), -1).max(axis=1)
    for b, n in enumerate(lens):
        for t in rng.integers(0, max(int(n) - 1, 1), size=min(int(n) // 2, 64)):
            src, dst = int(t), int(t) + 1
            ps, ss = int(batch.block_table[b, src // PAGE_TOKENS]), src % PAGE_TOKENS
            pd, sd = int(batch.block_table[b, dst // PAGE_TOKENS]), dst % PAGE_TOKENS
            pages[pd, sd * HEAD_DIM:(sd + 1) * HEAD_DIM] = pages[ps, ss * HEAD_DIM:(ss + 1) * HEAD_DIM]
            off_s, off_d = PAGE_FP8_BYTES + 4 * ss, PAGE_FP8_BYTES + 4 * sd
            pages[pd, off_d:off_d + 4] = pages[ps, off_s:off_s + 4]
    return batch


def check_batches(process_id: int, num_processes: int, seed: int):
    """What process `process_id` checks: (layout, shared_pool, its arguments, the op's options), the
    arguments being numpy ``(q bytes, k_cache, weights, seq_lens, block_table)`` of its rows;
    ``k_cache`` is its own pool, or with ``shared_pool`` the pool every process holds. Deterministic:
    a caller can rebuild them to check the ids independently."""
    lens = np.array(CHECK_LENGTHS)
    own = _with_ties(make_batch(lens, seed=seed + 7919 * (process_id + 1)), seed + process_id)
    rng = np.random.default_rng(seed + 31 * process_id)
    mtp_lens = np.stack([lens, np.maximum(lens - rng.integers(0, 3, size=len(lens)), 0)], axis=1)
    mtp = make_batch(mtp_lens, queries=2, heads=32, seed=seed + 7919 * (process_id + 1) + 1)
    shared = _with_ties(make_batch(np.tile(lens, num_processes), seed=seed + 1), seed + 1)  # same everywhere
    rows = slice(process_id * len(lens), (process_id + 1) * len(lens))
    mine = (shared.q[rows], shared.k_cache, shared.weights[rows], shared.seq_lens[rows], shared.block_table[rows])
    # positions, and a max_seq_len below the longest rows (a bound never changes the answer)
    positions = {"ids": "positions", "max_seq_len": 1024}
    return [("pool_per_process", False, own.args(), {}), ("pool_per_process_mtp", False, mtp.args(), {}),
            ("shared_pool", True, mine, {}), ("pool_per_process_positions", False, own.args(), positions),
            ("pool_per_process_mtp_positions", False, mtp.args(), {"ids": "positions"})]


def _expected_bytes(args, topk: int, options: dict) -> np.ndarray:
    """The single-process call on this process's device: the bytes the distributed call must give."""
    import jax
    import jax.numpy as jnp

    device = jax.local_devices()[0]
    q, *rest = args
    placed = [jax.device_put(jnp.asarray(q).view(jnp.float8_e4m3fn), device)] + \
             [jax.device_put(jnp.asarray(a), device) for a in rest]
    return np.asarray(ffi_dsa.topk_indexer(*placed, topk=topk, **options))


def run_check(process_id: int, num_processes: int, topk: int, seed: int) -> tuple[dict, dict]:
    """Every layout on this process's rows, checked against the float64 reference (SPEC tolerance)
    and byte for byte against the single-device call on the same rows: (report, the ids of each
    layout)."""
    import jax.numpy as jnp

    mesh = jd.global_mesh()
    report = {"process": process_id, "processes": num_processes, "devices": len(mesh.devices),
              "rows": {}, "problems": []}
    outputs = {}
    for name, shared_pool, args, options in check_batches(process_id, num_processes, seed):
        q = jnp.asarray(args[0]).view(jnp.float8_e4m3fn)
        step = jd.data_parallel_topk(mesh, topk, shared_pool=shared_pool, **options)
        arrays = jd.global_arrays(mesh, (q, *args[1:]), replicated=(1,) if shared_pool else ())
        mine = jd.local_rows(step(*arrays))
        outputs[name] = mine
        report["rows"][name] = int(mine.shape[0])
        report["problems"] += [f"{name}: {p}" for p in ffi_dsa.check_topk(mine, *args, ids=options.get("ids", "slots"))]
        if not np.array_equal(mine, _expected_bytes(args, topk, options)):
            report["problems"].append(f"{name}: differs from the single-device call on the same rows")
    return report, outputs


def check_main(argv) -> int:
    parser = argparse.ArgumentParser(description="One process of a jax.distributed check of ffi_dsa "
                                     "(launch N of them with python benchmarks/jax_processes.py)")
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--coordinator", required=True, help="host:port of process 0")
    parser.add_argument("--platform", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="a folder: write this process's ids there "
                        "(process<i>.npz, one array per layout) for a caller to check independently")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    jd.initialize(args.process_id, args.processes, args.coordinator, args.platform)
    report, outputs = run_check(args.process_id, args.processes, args.topk, args.seed)
    report["seconds"] = round(time.perf_counter() - start, 2)
    if args.out:
        np.savez(f"{args.out}/process{args.process_id}.npz", **outputs)
    print(json.dumps(report), flush=True)
    import jax

    jax.distributed.shutdown()
    return 1 if report["problems"] else 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--process-id" in argv:  # one launched process of the check
        return check_main(argv)
    rest = []
    if "--" in argv:
        rest, argv = argv[argv.index("--") + 1:], argv[:argv.index("--")]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--platform", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--script", default=CHECK_SCRIPT, help="what each process runs (python SCRIPT; default: the check)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole launch")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    finished = launch(args.processes, args.script, rest, args.platform, args.timeout)
    bad = failures(finished)
    print(f"{args.processes} processes of {args.script} on {args.platform}: "
          f"{'all exited 0' if not bad else '; '.join(bad)} ({time.perf_counter() - start:.1f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
