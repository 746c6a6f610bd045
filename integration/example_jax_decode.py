"""A DeepSeek-V3.2-style indexer inside a jitted JAX decode step, on the CPU or a GPU.

    python integration/example_jax_decode.py [--platform cpu|gpu] [--steps 3]

(it imports the installed ffi_dsa: ``pip install ".[jax]"`` first.)

Each step projects one hidden state per row to 64 index-query heads, quantizes them to FP8 per head
(the scale folded into the head weights) and selects the top-K cached tokens of every row with
``ffi_dsa.topk_indexer`` (on JAX arrays an XLA FFI custom call, ffi_dsa.jax_ops): all in one ``jax.jit``.
Every step is checked against the float64 reference.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import ffi_dsa
from ffi_dsa.contract import DEFAULT_TOPK
from ffi_dsa.contract import HEAD_DIM as DIM
from ffi_dsa.contract import NUM_HEADS as HEADS
from ffi_dsa import topk_indexer
from ffi_dsa.kv_cache import FP8_MAX
from ffi_dsa.workloads import make_batch


def indexer_step(params, x, k_cache, seq_lens, block_table, topk: int):
    """(top-K ids [B, topk], the FP8 q and the head weights the call used) for hidden states x [B, hidden]."""
    q = (x @ params["wq"]).reshape(x.shape[0], HEADS, DIM)
    amax = jnp.max(jnp.abs(q), axis=-1, keepdims=True)
    scale = jnp.where(amax > 0, amax / FP8_MAX, 1.0)                     # per (row, head)
    q_fp8 = (q / scale).astype(jnp.float8_e4m3fn)
    weights = (x @ params["ww"]) * scale[..., 0] * (DIM ** -0.5 * HEADS ** -0.5)  # > 0: folds out of relu
    return topk_indexer(q_fp8, k_cache, weights, seq_lens, block_table, topk=topk), q_fp8, weights


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", default=jax.default_backend(), choices=["cpu", "gpu"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--context", type=int, default=3000, help="tokens cached per row")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--topk", type=int, default=DEFAULT_TOPK)
    args = parser.parse_args(argv)
    device = jax.devices(args.platform)[0]

    # A paged FP8 cache of ragged rows over a shuffled page pool (docs/contract.md, page layout).
    batch = make_batch([max(args.context - 7 * b, 0) for b in range(args.batch)], seed=0)
    cache = [jax.device_put(a, device) for a in (batch.k_cache, batch.seq_lens, batch.block_table)]
    rng = np.random.default_rng(0)
    params = {"wq": jax.device_put(rng.standard_normal((args.hidden, HEADS * DIM), np.float32) / 16, device),
              "ww": jax.device_put(rng.standard_normal((args.hidden, HEADS), np.float32) / 16, device)}
    step = jax.jit(indexer_step, static_argnames=("topk",))

    for i in range(args.steps):
        x = jax.device_put(rng.standard_normal((args.batch, args.hidden), np.float32), device)
        start = time.perf_counter()
        ids, q_fp8, weights = jax.block_until_ready(step(params, x, *cache, topk=args.topk))
        elapsed = time.perf_counter() - start
        problems = ffi_dsa.check_topk(np.asarray(ids), np.asarray(q_fp8), batch.k_cache, np.asarray(weights),
                                      batch.seq_lens, batch.block_table)
        print(f"step {i}: {'compile + ' if i == 0 else ''}run {elapsed * 1e3:8.1f} ms, "
              f"topk {tuple(ids.shape)} on {device.platform}, rows ok: {not problems}")
        if problems:
            print("\n".join(problems[:5]))
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
