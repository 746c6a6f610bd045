"""A DeepSeek-V3.2-style indexer layer inside a compiled decode step, on CPU or CUDA.

    python integration/example_torch_decode.py [--device cuda] [--backend aot_eager] [--steps 4]

(it imports the installed ffi_dsa: ``pip install ".[torch]"`` first.)

Each step takes one new hidden state per row, projects it to 64 index-query heads (quantized to
FP8 per head, the scale folded into the head weights), appends the token's index key to the paged
FP8 cache (DeepGEMM layout: 64 fp8 rows, then 64 float32 scales per page) and selects the top-K
cached tokens with ``torch.ops.dsa.topk_indexer`` — all in one ``torch.compile(fullgraph=True,
dynamic=True)`` graph. Every step is checked against the float64 reference.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch import nn

import ffi_dsa
import ffi_dsa.torch_ops  # noqa: F401  (registers torch.ops.dsa.*)
from ffi_dsa.contract import DEFAULT_TOPK
from ffi_dsa.contract import HEAD_DIM as DIM
from ffi_dsa.contract import NUM_HEADS as HEADS
from ffi_dsa.contract import PAGE_TOKENS as PAGE
from ffi_dsa.kv_cache import FP8_MAX


def quantize_fp8(x: torch.Tensor):
    """Per-row FP8 quantization over the last dim: (fp8 values, float32 scale)."""
    amax = x.abs().amax(dim=-1, keepdim=True).float()
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (x.float() / scale).to(torch.float8_e4m3fn), scale.squeeze(-1)


class Indexer(nn.Module):
    """Lightning indexer of one decode token per row; returns the top-K token ids of each row."""

    def __init__(self, hidden: int = 512, topk: int = DEFAULT_TOPK):
        super().__init__()
        self.topk = topk
        self.wq = nn.Linear(hidden, HEADS * DIM, bias=False)
        self.wk = nn.Linear(hidden, DIM, bias=False)
        self.weights_proj = nn.Linear(hidden, HEADS, bias=False)
        self.scale = DIM ** -0.5 * HEADS ** -0.5

    def append_key(self, x, k_cache, seq_lens, block_table):
        """Quantize the new token's key and write it into its page slot (in place)."""
        k_fp8, k_scale = quantize_fp8(self.wk(x))                              # [B, 128], [B]
        pos = (seq_lens - 1).long()
        page = block_table.gather(1, (pos // PAGE)[:, None]).squeeze(1).long()
        slot = pos % PAGE
        pages = k_cache.view(torch.uint8).view(k_cache.shape[0], PAGE * (DIM + 4))
        cols = torch.arange(DIM, device=x.device)
        pages[page[:, None], slot[:, None] * DIM + cols] = k_fp8.view(torch.uint8)
        cols = torch.arange(4, device=x.device)
        pages[page[:, None], PAGE * DIM + slot[:, None] * 4 + cols] = k_scale.view(torch.uint8).view(-1, 4)

    def forward(self, x, k_cache, seq_lens, block_table):
        self.append_key(x, k_cache, seq_lens, block_table)
        q = self.wq(x).view(x.shape[0], HEADS, DIM)
        q_fp8, q_scale = quantize_fp8(q)                                        # scale per (row, head)
        weights = self.weights_proj(x).float() * q_scale * self.scale          # > 0 scale folds out of relu
        return torch.ops.dsa.topk_indexer(q_fp8, k_cache, weights, seq_lens, block_table, self.topk)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (inductor, aot_eager, ...)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--context", type=int, default=3000, help="tokens already cached per row")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--topk", type=int, default=DEFAULT_TOPK)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)

    # A paged cache with room for `steps` more tokens per row; rows own shuffled pages of one pool.
    B, max_pages = args.batch, (args.context + args.steps + PAGE - 1) // PAGE
    num_pages = B * max_pages + 3
    keys = torch.randn(num_pages, PAGE, DIM)
    k_cache = ffi_dsa.pack_k_cache(keys).to(device)
    block_table = torch.randperm(num_pages)[: B * max_pages].view(B, max_pages).int().to(device)
    seq_lens = torch.full((B,), args.context, dtype=torch.int32, device=device)
    seq_lens -= torch.arange(B, dtype=torch.int32, device=device) * 7  # ragged rows

    model = Indexer(topk=args.topk).to(device).eval()
    step = torch.compile(model, backend=args.backend, fullgraph=True, dynamic=True)

    with torch.inference_mode():
        for i in range(args.steps):
            seq_lens += 1
            x = torch.randn(B, model.wq.in_features, device=device)
            start = time.perf_counter()
            topk = step(x, k_cache, seq_lens, block_table)
            if device.type == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            # Recompute q and weights eagerly for the reference check (the cache already holds the key).
            q_fp8, q_scale = quantize_fp8(model.wq(x).view(B, HEADS, DIM))
            weights = model.weights_proj(x).float() * q_scale * model.scale
            problems = ffi_dsa.check_topk(topk, q_fp8, k_cache, weights, seq_lens, block_table)
            print(f"step {i}: {'compile + ' if i == 0 else ''}run {elapsed * 1e3:8.1f} ms, "
                  f"topk {tuple(topk.shape)}, rows ok: {not problems}")
            if problems:
                print("\n".join(problems[:5]))
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
