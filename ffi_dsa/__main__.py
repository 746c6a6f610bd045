"""Command line: ``python -m ffi_dsa {demo,bench,info} ...`` (also installed as ``ffi-dsa``).

  demo   run one realistic decode batch on the best device present, time it, check it
  bench  the benchmarks (ffi_dsa.benchmarks.bench_cpu / bench_gpu; they need torch, and matplotlib
         for bench_gpu's plot: ``pip install "ffi-dsa[bench]"``); options after ``bench`` (other than
         --device) go to that benchmark: ``bench --device cpu --help``
  info   which native modules this installation uses (installed or JIT-built) and what they target
"""

# `--help` and `info` import neither tvm_ffi nor torch (tvm_ffi imports torch when it is installed,
# most of the time a command takes to start): this module and ffi_dsa.demo import them only in the
# commands that run the op.

from __future__ import annotations

import argparse
import importlib
import json
import sys


def _import_benchmark(module: str):
    try:
        return importlib.import_module(f"ffi_dsa.benchmarks.{module}")
    except ImportError as err:
        if err.name in ("torch", "matplotlib"):
            raise SystemExit(f"ffi_dsa bench: the benchmark {module} needs {err.name}, which is not installed: "
                             'pip install "ffi-dsa[bench]" (or torch / matplotlib yourself)') from None
        raise


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


def _load_package() -> None:
    """What `import ffi_dsa` loads outside this command, for the commands that run the op: the API,
    and torch.ops.dsa.* where torch is importable (the benchmarks call them)."""
    from . import api  # noqa: F401

    try:
        import torch  # noqa: F401
    except ImportError:
        return
    from .integration import torch_op  # noqa: F401


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
                              help="cpu -> ffi_dsa.benchmarks.bench_cpu, cuda -> ffi_dsa.benchmarks.bench_gpu "
                                   "(default: cuda when torch sees a GPU)")
    sub.add_parser("info", help="which native modules are used, and what they target")

    args, rest = parser.parse_known_args(argv)
    if args.command == "info":
        return _info()
    if args.command == "demo" and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    _load_package()
    if args.command == "demo":
        return demo.run(args.device, args.seed, args.rows, args.max_len, args.warmup, args.runs, args.sorted)

    device = args.device
    if device == "auto":
        device = "cuda" if _cuda_present() else "cpu"
    module = _import_benchmark("bench_gpu" if device == "cuda" else "bench_cpu")
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
