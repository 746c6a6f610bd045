"""Helper of test_cpu_portability.py, run as a script (natively or under qemu-user): loads a built
CPU module with tvm_ffi alone (no torch, which is slow to start under emulation), runs one batch
per variant the CPU offers, and prints a JSON line: the variants offered, the auto pick, and each
variant's output as a list.

    python cpu_variant_probe.py MODULE.so
"""

from __future__ import annotations

import json
import sys

import numpy as np
import tvm_ffi

ROWS, PAGES_PER_ROW, TOPK = 3, 40, 300
FP8_NAN_MAGNITUDE, FP8_ONE = 0x7F, 0x38


def batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    pages = ROWS * PAGES_PER_ROW
    q = rng.integers(0, 256, size=(ROWS, 64, 128), dtype=np.uint8)
    q[(q & 0x7F) == FP8_NAN_MAGNITUDE] = FP8_ONE
    k = rng.integers(0, 256, size=(pages, 64 * 132), dtype=np.uint8)
    fp8 = k[:, : 64 * 128]
    fp8[(fp8 & 0x7F) == FP8_NAN_MAGNITUDE] = FP8_ONE
    k[:, 64 * 128:] = np.full((pages, 64), 0.75, "<f4").view(np.uint8)
    weights = rng.standard_normal((ROWS, 64)).astype(np.float32)
    lens = np.array([2500, 777, 64 * PAGES_PER_ROW], np.int32)
    table = rng.permutation(pages).astype(np.int32).reshape(ROWS, PAGES_PER_ROW)
    return q, k.reshape(pages, 64, 1, 132), weights, lens, table


def main(path: str) -> None:
    module = tvm_ffi.load_module(path)
    args = batch()
    kernels = [str(name) for name in module["cpu_kernels"]()]
    outputs = {}
    for name in kernels:
        module["set_cpu_kernel"](name)
        out = np.full((ROWS, TOPK), -7, np.int32)
        module["topk_indexer"](*args, out, False, False, 0)  # sorted, positions, max_seq_len
        outputs[name] = out.tolist()
    module["set_cpu_kernel"]("auto")
    print(json.dumps({"kernels": kernels, "auto": str(module["cpu_kernel"]()), "outputs": outputs}))


if __name__ == "__main__":
    main(sys.argv[1])
