"""Command line: ``python -m ffi_dsa {demo,bench,info} ...`` (also installed as ``ffi-dsa``).

  demo   run one realistic decode batch on the best device present, time it, check it
  bench  the benchmarks (benchmarks/bench_cpu.py / bench_gpu.py, which an installed package carries;
         they need torch, and matplotlib for bench_gpu's plot: ``pip install "ffi-dsa[bench]"``);
         options after ``bench`` (other than --device) go to that benchmark: ``bench --device cpu --help``
  info   which native modules this installation uses (installed or JIT-built) and what they target
"""

# `--help` and `info` import neither tvm_ffi nor torch (tvm_ffi imports torch when it is installed,
# most of the time a command takes to start): `import ffi_dsa` loads nothing native, and this module
# and ffi_dsa.demo import the API only in the commands that run the op.

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def benchmarks_dir() -> Path:
    """The benchmark scripts: inside an installed package, or the repository's benchmarks/ folder
    (found as _build.native_dir() finds the sources)."""
    for candidate in (_PACKAGE_DIR / "benchmarks", _PACKAGE_DIR.parent / "benchmarks"):
        if (candidate / "bench_cpu.py").is_file():
            return candidate
    raise SystemExit(f"ffi_dsa bench: the benchmarks are not next to {_PACKAGE_DIR} (neither benchmarks/ inside "
                     "the package nor beside it); reinstall the package")


def _run_benchmark(script: str, argv: list[str]) -> int:
    """Runs benchmarks/`script` as a script (a process of its own, its folder first on sys.path) in
    this interpreter, so it imports the ffi_dsa this command runs."""
    return subprocess.run([sys.executable, str(benchmarks_dir() / script), *argv]).returncode


def _info() -> int:
    # The files _ffi_api would load, found without loading them (a source checkout still JIT-builds
    # the CPU module here, as loading it would).
    from . import _build

    report = {"package": str(_build.LIB_DIR.parent), "installed": _build.manifest() or None,
              "cpu_module": _build.cpu_library(), "gpus": [f"{a}.{b}" for a, b in
                                                          _build.visible_compute_capabilities()]}
    if report["gpus"]:
        try:
            report["cuda_module"] = _build.cuda_library()
        except _build.NativeBuildError as err:
            report["cuda_module"] = f"unavailable: {err}"
    print(json.dumps(report, indent=2))
    return 0


def _cuda_present() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="ffi_dsa", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[1:]))
    sub = parser.add_subparsers(dest="command", metavar="{demo,bench,info}")
    sub.required = True

    from . import demo

    demo_parser = sub.add_parser("demo", help="time and check one realistic decode batch")
    demo.add_arguments(demo_parser)

    bench_parser = sub.add_parser("bench", help="benchmarks (CPU: vs naive torch; CUDA: vs floor and peers)",
                                  add_help=False)
    bench_parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                              help="cpu -> benchmarks/bench_cpu.py, cuda -> benchmarks/bench_gpu.py "
                                   "(default: cuda when torch sees a GPU)")
    sub.add_parser("info", help="which native modules are used, and what they target")

    args, rest = parser.parse_known_args(argv)
    if args.command == "info":
        return _info()
    if args.command == "demo" and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "demo":
        return demo.run(args.device, args.seed, args.rows, args.max_len, args.warmup, args.runs, args.sorted)

    device = args.device
    if device == "auto":
        device = "cuda" if _cuda_present() else "cpu"
    return _run_benchmark("bench_gpu.py" if device == "cuda" else "bench_cpu.py", rest)


if __name__ == "__main__":
    sys.exit(main())
