"""Command line: ``python -m ffi_dsa {demo,bench} ...`` (also installed as ``ffi-dsa``).

  demo   run one realistic decode batch on the best device present, time it, check it
  bench  the benchmarks of the source repository (benchmarks/bench_cpu.py, bench_gpu.py);
         options after ``bench`` (other than --device) go to that script: ``bench --device cpu --help``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _import_benchmarks(module: str):
    """benchmarks/ is not part of the wheel: it lives next to the package in a source checkout."""
    try:
        return __import__(f"benchmarks.{module}", fromlist=["main"])
    except ImportError as first_error:
        repo = Path(__file__).resolve().parent.parent
        if (repo / "benchmarks" / f"{module}.py").is_file():
            sys.path.insert(0, str(repo))
            sys.modules.pop("benchmarks", None)
            return __import__(f"benchmarks.{module}", fromlist=["main"])
        raise SystemExit(f"ffi_dsa bench: benchmarks/{module}.py not found ({first_error}); the benchmarks "
                         "ship with the source repository, not the wheel: run this from a checkout") from None


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
    sub = parser.add_subparsers(dest="command", metavar="{demo,bench}")
    sub.required = True

    from . import demo

    demo_parser = sub.add_parser("demo", help="time and check one realistic decode batch")
    demo.add_arguments(demo_parser)

    bench_parser = sub.add_parser("bench", help="benchmarks (CPU: vs naive torch; CUDA: vs floor and peers)",
                                  add_help=False)
    bench_parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                              help="cpu -> benchmarks/bench_cpu.py, cuda -> benchmarks/bench_gpu.py "
                                   "(default: cuda when torch sees a GPU)")

    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return demo.run(args.device, args.seed, args.rows, args.max_len, args.warmup, args.runs, args.sorted)

    device = args.device
    if device == "auto":
        device = "cuda" if _cuda_present() else "cpu"
    module = _import_benchmarks("bench_gpu" if device == "cuda" else "bench_cpu")
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
