"""Compare the SASS of every kernel in two builds of the CUDA module, kernel by kernel.

    python benchmarks/sass_compare.py BEFORE.so AFTER.so [--cuobjdump PATH]

A change meant to move host code only (launch files, translation units, the binding) must leave
every kernel's machine code as it was. This dumps both modules with ``cuobjdump -sass``, splits the
dump into one listing per kernel (its mangled name), drops what names the build rather than the code
(the fatbin headers and the source file each cubin came from), and says for every kernel whether
its listing is byte-identical; it exits 1 when any kernel differs or exists in only one build.
Each kernel may sit in a different cubin of the two modules (one translation unit or several).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys

_FUNCTION = re.compile(r"^\s*Function : (\S+)\s*$")
# lines about the container, not the code: the fatbin's headers and the file each cubin came from
_HEADER = re.compile(r"^\s*(Fatbin (elf|ptx) code:|=+$|arch = |code version = |host = |compile_size = |"
                     r"compressed|identifier = |code for sm_|\.target\s)")


def kernels(module: str, cuobjdump: str) -> dict[str, str]:
    """Each kernel's SASS listing in `module`, by mangled name."""
    dump = subprocess.run([cuobjdump, "-sass", module], capture_output=True, text=True, check=True).stdout
    found: dict[str, list[str]] = {}
    current = None
    for line in dump.splitlines():
        match = _FUNCTION.match(line)
        if match:
            current = match.group(1)
            if current in found:
                raise SystemExit(f"{module}: kernel {current} appears twice (compiled in two translation units)")
            found[current] = []
        elif current is not None and line.strip() and not _HEADER.match(line):
            found[current].append(line.rstrip())
    return {name: "\n".join(lines) for name, lines in found.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump")
    args = parser.parse_args(argv)
    before, after = kernels(args.before, args.cuobjdump), kernels(args.after, args.cuobjdump)
    differ = 0
    for name in sorted(before.keys() | after.keys()):
        if name not in before or name not in after:
            verdict = "only in " + ("after" if name not in before else "before")
        elif before[name] == after[name]:
            digest = hashlib.sha256(before[name].encode()).hexdigest()[:12]
            verdict = f"identical ({before[name].count(chr(10)) + 1} lines, sha256 {digest})"
        else:
            verdict = "DIFFERENT"
        differ += not verdict.startswith("identical")
        print(f"{name}: {verdict}")
    print(f"{len(before.keys() | after.keys())} kernels, {differ} not identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
