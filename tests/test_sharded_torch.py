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

from ffi_dsa.contract import NUM_HEADS, NUM_HEADS_NARROW
from ffi_dsa.integration import torch_ranks

from conftest import assert_same_as_call

REPO = Path(__file__).resolve().parent.parent
WORLD = 2
K = 64
SEED = 3
BATCH_SIZES = (8, 7, 1)
TWO_GPUS = torch.cuda.device_count() >= WORLD


# (queries, heads): the single-query form, and N query tokens per row (docs/contract.md §7)
FORMS = [pytest.param((None, NUM_HEADS), id="rank3"), pytest.param((2, NUM_HEADS_NARROW), id="n2_h32")]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("device", [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not TWO_GPUS, reason="needs 2 GPUs")]),
])
def test_two_ranks_give_the_single_process_bytes(device, form, tmp_path):
    queries, heads = form
    out = tmp_path / "ids.npz"
    shape_args = ["--heads", str(heads)] + ([] if queries is None else ["--queries", str(queries)])
    child = subprocess.run(
        [sys.executable, "-m", "ffi_dsa.integration.torch_ranks", "--world-size", str(WORLD), "--device", device,
         "--batch-sizes", ",".join(map(str, BATCH_SIZES)), "--topk", str(K), "--seed", str(SEED), "--out", str(out),
         *shape_args],
        cwd=REPO, capture_output=True, text=True, timeout=240)
    assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-4000:]
    got = np.load(out)
    for i, batch_size in enumerate(BATCH_SIZES):
        batch = torch_ranks.rank_batch(batch_size, SEED + i, queries, heads)
        ids = got[f"batch{i}"]
        assert ids.shape == batch.output_shape(K)
        assert_same_as_call(ids, batch, K, device=device)


@pytest.mark.parametrize("batch_size", [0, 1, 2, 7, 8, 13])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_rank_rows_split_like_tensor_split(batch_size, world):
    want = [len(part) for part in torch.tensor_split(torch.arange(batch_size), world)]
    rows = [torch_ranks.rank_rows(batch_size, rank, world) for rank in range(world)]
    assert [r.stop - r.start for r in rows] == want
    assert [r.start for r in rows] == [sum(want[:rank]) for rank in range(world)]
