"""torch on several devices: one call per rank with torch.distributed (integration/torch_ranks.py).

Two ranks are spawned in a subprocess (gloo on the CPU; NCCL with one GPU per rank when two GPUs
exist), each calls ``torch.ops.dsa.topk_indexer`` once on its own rows and device, and rank 0
gathers the rows back. The result must be the bytes of ``ffi_dsa.call`` on the whole batch on the
same device type, for B divisible by the world size, not divisible, and smaller than it (a rank
with no rows).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ffi_dsa.integration import torch_ranks
from ffi_dsa.workloads import make_batch

from conftest import assert_same_as_call

REPO = Path(__file__).resolve().parent.parent
WORLD = 2
K = 64
SEED = 3
BATCH_SIZES = (8, 7, 1)
TWO_GPUS = torch.cuda.device_count() >= WORLD


@pytest.mark.parametrize("device", [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not TWO_GPUS, reason="needs 2 GPUs")]),
])
def test_two_ranks_give_the_single_process_bytes(device, tmp_path):
    out = tmp_path / "ids.npz"
    child = subprocess.run(
        [sys.executable, "-m", "ffi_dsa.integration.torch_ranks", "--world-size", str(WORLD), "--device", device,
         "--batch-sizes", ",".join(map(str, BATCH_SIZES)), "--topk", str(K), "--seed", str(SEED), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240)
    assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-4000:]
    got = np.load(out)
    for i, batch_size in enumerate(BATCH_SIZES):
        batch = make_batch(torch_ranks.batch_lens(batch_size, SEED + i), seed=SEED + i, spare_pages=3)
        ids = got[f"batch{i}"]
        assert_same_as_call(ids, batch, K, device=device)


@pytest.mark.parametrize("batch_size", [0, 1, 2, 7, 8, 13])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_rank_rows_split_like_tensor_split(batch_size, world):
    want = [len(part) for part in torch.tensor_split(torch.arange(batch_size), world)]
    rows = [torch_ranks.rank_rows(batch_size, rank, world) for rank in range(world)]
    assert [r.stop - r.start for r in rows] == want
    assert [r.start for r in rows] == [sum(want[:rank]) for rank in range(world)]
