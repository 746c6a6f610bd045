"""The serving-engine wirings (integration/sglang_indexer.py, integration/vllm_indexer.py) against the
chain each engine runs today, written in plain torch (engine_chains.py: DeepGEMM's paged logits in
float64, a top-k under the contract's order, the engine's ids).

Each wiring is called with the engine's own tensors and layouts (SGLang: q ``[num_tokens, H, 128]``,
the cache as ``[pages, 8448]`` bytes, weights ``[num_tokens, H, 1]``, its target-verify layout;
vLLM: q ``[B, next_n, H, 128]``, the cache as ``[blocks, 64, 132]``, context lengths ``[B, next_n]``
or ``[B, 1]``, a weights buffer and an output buffer larger than the batch) on rows of length 0, 1,
< 2048, 2048, > 2048 with garbage in the block table past each row, and checked:

* on exact data (small integers, unit scales: ties and 0.0 plateaus everywhere) byte for byte
  against the chain;
* on random data with copied keys (exact ties) with the contract's tolerance (``ffi_dsa.check_topk``
  on the float64 scores), and exactly on every row of at most K tokens, where nothing is chosen;
* every output element written (poisoned buffers), nothing written past the batch's rows;
* bad arguments refused naming the engine's tensor.

vLLM's wiring asks the op for positions (``ids="positions"``) and passes vLLM's ``max_seq_len``: any
bound (below the rows' lengths, equal, above, none) gives the same bytes. The cases taking ``device``
run on CPU and, marked cuda, on a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ffi_dsa
from ffi_dsa.contract import NUM_HEADS, NUM_HEADS_NARROW, PAGE_TOKENS
from ffi_dsa.workloads import make_batch

from conftest import SENTINEL, assert_all_written, fill_past_rows, load_script, make_exact_batch, poisoned
from engine_chains import duplicate_neighbours, paged_mqa_logits, slots, topk_positions

engine_args = load_script("integration/engine_args.py")
sglang_indexer = load_script("integration/sglang_indexer.py")
vllm_indexer = load_script("integration/vllm_indexer.py")

K = 2048
LENS = [0, 1, 5, 64, 700, 2047, 2048, 2049, 3000, 4100]
HEADS = pytest.mark.parametrize("heads", [NUM_HEADS, NUM_HEADS_NARROW], ids=["H64", "H32"])


def batch_of(lens, *, exact: bool, seed: int, queries=None, heads=NUM_HEADS):
    """A batch of these lengths (exact data, or random data with copied keys), garbage in every
    table entry past a row's pages and a spare page or two."""
    make = make_exact_batch if exact else make_batch
    batch = make(lens, seed=seed, queries=queries, heads=heads, spare_pages=2)
    if not exact:
        duplicate_neighbours(batch, seed)
    fill_past_rows(batch, seed)
    return batch


def chain_positions(q4, k_cache, weights, lens, table):
    """The engine's chain: logits over the table's width, then the top-k positions of each row."""
    scores, visible = paged_mqa_logits(q4, k_cache, weights, lens, table, table.shape[1] * PAGE_TOKENS)
    return topk_positions(scores, visible, K), visible


def assert_matches_chain(got, expected, visible, exact: bool) -> None:
    """Exact data: byte for byte. Random data: every row of at most K tokens exactly (the row's
    every token, in position order), the rest by the tolerance checks the callers make."""
    got = got.cpu()
    assert got.dtype == torch.int32 and got.shape == expected.shape
    rows = torch.arange(got.shape[0]) if exact else torch.nonzero(visible <= K).flatten()
    assert rows.numel() > 0
    assert torch.equal(got[rows], expected[rows].to(torch.int32)), (
        f"rows {[int(r) for r in rows if not torch.equal(got[r], expected[r].to(torch.int32))][:8]} differ")


# ---------------------------------------------------------------------------------------------- SGLang

def sglang_tensors(batch, device):
    """The batch as SGLang's decode path holds it: q_fp8 [num_tokens, H, 128], kv_cache_fp8 [pages,
    8448] uint8, weights [num_tokens, H, 1], seqlens_32, block_tables."""
    q, k_cache, weights, seq_lens, table = batch.to_torch(device)
    heads = q.shape[-2]
    return (q.reshape(-1, heads, q.shape[-1]), k_cache.view(torch.uint8).reshape(k_cache.shape[0], -1),
            weights.reshape(-1, heads, 1), seq_lens, table)


def sglang_chain(batch, next_n: int):
    q, k_cache, weights, seq_lens, table = batch.to_torch("cpu")
    q4 = q.reshape(table.shape[0], next_n, *q.shape[-2:])
    positions, visible = chain_positions(q4, k_cache, weights.reshape(q4.shape[0] * next_n, -1), seq_lens, table)
    return slots(positions, table, next_n), visible


@HEADS
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "random"])
def test_sglang_decode_is_the_chain(device, heads, exact):
    batch = batch_of(LENS, exact=exact, seed=11 + heads, heads=heads)
    args = sglang_tensors(batch, device)
    out = poisoned((len(LENS), K), device)
    got = sglang_indexer.topk_paged(*args, index_topk=K, out=out)
    assert got is out
    assert_all_written(out)
    expected, visible = sglang_chain(batch, 1)
    assert_matches_chain(out, expected, visible, exact)
    assert ffi_dsa.check_topk(out, *batch.args()) == []


@pytest.mark.parametrize("seq_lens_form", ["B", "BN"])
def test_sglang_next_n_queries_per_request(device, seq_lens_form):
    """q [B * 2, H, 128] with a table per request: seqlens_32 [B] (DeepGEMM's causal rule) or [B, 2]."""
    lens = np.array(LENS)
    seq_lens = lens if seq_lens_form == "B" else np.stack([np.maximum(lens - 3, 0), lens], axis=1)
    batch = batch_of(seq_lens, exact=True, seed=12, queries=2)
    got = sglang_indexer.topk_paged(*sglang_tensors(batch, device), index_topk=K)
    assert got.shape == (2 * len(LENS), K)
    expected, visible = sglang_chain(batch, 2)
    assert_matches_chain(got, expected, visible, exact=True)


def test_sglang_target_verify_layout_equals_the_per_request_one(device):
    """SGLang's target verify repeats the table once per draft token and expands seqlens_32: the same
    ids as the table once per request with q viewed [B, next_n, ...]."""
    next_n = 2
    batch = batch_of(LENS, exact=True, seed=13, queries=next_n)
    q_fp8, kv, weights, seq_lens, table = sglang_tensors(batch, device)
    expanded = (seq_lens[:, None] - (next_n - 1 - torch.arange(next_n, device=device))[None, :]).clamp(min=0)
    repeated = sglang_indexer.topk_paged(q_fp8, kv, weights, expanded.reshape(-1).to(torch.int32),
                                         table.repeat_interleave(next_n, dim=0), index_topk=K)
    grouped = sglang_indexer.topk_paged(q_fp8, kv, weights, seq_lens, table, index_topk=K)
    assert torch.equal(repeated, grouped)
    expected, visible = sglang_chain(batch, next_n)
    assert_matches_chain(grouped, expected, visible, exact=True)


def test_sglang_empty_batch(device):
    batch = batch_of([5], exact=True, seed=14)
    q_fp8, kv, weights, seq_lens, table = sglang_tensors(batch, device)
    got = sglang_indexer.topk_paged(q_fp8[:0], kv, weights[:0], seq_lens[:0], table[:0], index_topk=K)
    assert got.shape == (0, K)


@pytest.mark.parametrize("mistake, name", [
    ("tokens", "q_fp8"), ("cache_width", "kv_cache_fp8"), ("out_shape", "out"), ("lens_dtype", "seqlens_32"),
    ("index_topk", "index_topk"), ("weights_rows", "weights"), ("table_dtype", "block_tables"),
])
def test_sglang_mistakes_name_sglangs_tensor(mistake, name):
    batch = batch_of([70, 3000], exact=True, seed=15)
    q_fp8, kv, weights, seq_lens, table = sglang_tensors(batch, "cpu")
    out = poisoned((2, K))
    kwargs = dict(q_fp8=q_fp8, kv_cache_fp8=kv, weights=weights, seqlens_32=seq_lens, block_tables=table,
                  index_topk=K, out=out)
    broken = {"tokens": dict(q_fp8=torch.cat([q_fp8, q_fp8[:1]])), "cache_width": dict(kv_cache_fp8=kv[:, :8000]),
              "out_shape": dict(out=poisoned((2, 16))), "lens_dtype": dict(seqlens_32=seq_lens.long()),
              "index_topk": dict(index_topk=4096, out=None), "weights_rows": dict(weights=weights[:1]),
              "table_dtype": dict(block_tables=table.long())}[mistake]
    with pytest.raises((ValueError, TypeError), match=rf"^{name}\b"):
        sglang_indexer.topk_paged(**{**kwargs, **broken})
    assert (out == SENTINEL).all(), "an argument mistake wrote the output"


def test_sglang_under_torch_compile():
    """The wiring traces into one graph (fullgraph) and gives the eager bytes."""
    batch = batch_of([0, 700, 3000], exact=True, seed=16)
    args = sglang_tensors(batch, "cpu")
    compiled = torch.compile(sglang_indexer.topk_paged, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(*args, index_topk=K), sglang_indexer.topk_paged(*args, index_topk=K))


@pytest.mark.cuda
def test_sglang_in_a_cuda_graph():
    """Captured with its static buffers as SGLang's graph runner does, replayed on new values."""
    first, second = (batch_of(LENS, exact=True, seed=s) for s in (17, 18))
    for b in (first, second):  # the same shapes: the second batch's pool and table sized as the first's
        assert b.k_cache.shape == first.k_cache.shape and b.block_table.shape == first.block_table.shape
    static = [t.clone() for t in sglang_tensors(first, "cuda")]
    out = torch.empty((len(LENS), K), dtype=torch.int32, device="cuda")
    sglang_indexer.topk_paged(*static, index_topk=K, out=out)  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sglang_indexer.topk_paged(*static, index_topk=K, out=out)
    for batch in (second, first):
        for buffer, value in zip(static, sglang_tensors(batch, "cuda")):
            buffer.copy_(value)
        out.fill_(SENTINEL)
        graph.replay()
        torch.cuda.synchronize()
        expected, visible = sglang_chain(batch, 1)
        assert_matches_chain(out, expected, visible, exact=True)


# ------------------------------------------------------------------------------------------------ vLLM

def vllm_tensors(batch, device, *, spare_rows: int = 3):
    """The batch as vLLM's decode branch holds it: q [B, next_n, H, 128], kv_cache [blocks, 64, 132]
    uint8, weights [num_tokens, H] with rows past the batch (CUDA-graph padding), seq_lens [B, next_n]
    or [B, 1], block_table, and a poisoned topk_indices_buffer with rows past the batch."""
    q, k_cache, weights, seq_lens, table = batch.to_torch(device)
    if q.dim() == 3:
        q = q[:, None]
    rows, heads = q.shape[0] * q.shape[1], q.shape[2]
    padded_weights = torch.cat([weights.reshape(rows, heads), torch.full((spare_rows, heads), float("nan"),
                                                                          device=device)])
    lens = seq_lens if seq_lens.dim() == 2 else seq_lens[:, None]
    kv = k_cache.view(torch.uint8).reshape(k_cache.shape[0], PAGE_TOKENS, -1)
    return q, kv, padded_weights, lens.contiguous(), table, poisoned((rows + spare_rows, K), device)


def vllm_chain(q, kv, weights, seq_lens, table):
    next_n = q.shape[1]
    lens = seq_lens.reshape(-1) if seq_lens.shape[1] == 1 and next_n > 1 else seq_lens
    return chain_positions(q.cpu(), kv.cpu(), weights[: q.shape[0] * next_n].cpu(), lens.cpu(), table.cpu())


def assert_positions_are_a_valid_topk(got, batch, next_n: int) -> None:
    """Positions -> slots through the block table, then the contract's tolerance check."""
    ids = slots(got.cpu().long(), torch.from_numpy(batch.block_table), next_n)
    assert ffi_dsa.check_topk(ids, *batch.args()) == []


@HEADS
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "random"])
def test_vllm_decode_is_the_chain(device, heads, exact):
    batch = batch_of(LENS, exact=exact, seed=21 + heads, heads=heads)
    q, kv, weights, lens, table, buffer = vllm_tensors(batch, device)
    got = vllm_indexer.decode_topk(q, kv, weights, lens, table, buffer, topk_tokens=K)
    assert got.data_ptr() == buffer.data_ptr() and got.shape == (len(LENS), K)
    assert_all_written(got)
    assert (buffer[len(LENS):] == SENTINEL).all(), "rows past the batch were written"
    expected, visible = vllm_chain(q, kv, weights, lens, table)
    assert_matches_chain(got, expected, visible, exact)
    assert_positions_are_a_valid_topk(got, batch, 1)


@pytest.mark.parametrize("seq_lens_form", ["BN", "B1"])
def test_vllm_native_spec_decode(device, seq_lens_form):
    """next_n = 2 with seq_lens [B, 2] (each query's own length) or [B, 1] (the request's length)."""
    lens = np.array(LENS)
    seq_lens = np.stack([np.maximum(lens - 2, 0), lens], axis=1) if seq_lens_form == "BN" else lens
    batch = batch_of(seq_lens, exact=True, seed=22, queries=2)
    q, kv, weights, lens_t, table, buffer = vllm_tensors(batch, device)
    got = vllm_indexer.decode_topk(q, kv, weights, lens_t, table, buffer, topk_tokens=K)
    assert got.shape == (2 * len(LENS), K)
    assert_all_written(got)
    expected, visible = vllm_chain(q, kv, weights, lens_t, table)
    assert_matches_chain(got, expected, visible, exact=True)
    assert_positions_are_a_valid_topk(got, batch, 2)


@pytest.mark.parametrize("bound", [None, 0, 1, 700, max(LENS), 1 << 20], ids=lambda b: f"max_seq_len={b}")
def test_vllm_max_seq_len_never_changes_the_answer(device, bound):
    """vLLM's attn_metadata.max_seq_len below the longest row (a stale bound), equal, above, or
    none: the same bytes, the chain's."""
    batch = batch_of(LENS, exact=True, seed=25)
    q, kv, weights, lens, table, buffer = vllm_tensors(batch, device)
    got = vllm_indexer.decode_topk(q, kv, weights, lens, table, buffer, topk_tokens=K, max_seq_len=bound)
    assert_all_written(got)
    expected, visible = vllm_chain(q, kv, weights, lens, table)
    assert_matches_chain(got, expected, visible, exact=True)


@pytest.mark.parametrize("bound", [-1, 2.5, "8192"])
def test_vllm_bad_max_seq_len_is_named(bound):
    q, kv, weights, lens, table, buffer = vllm_tensors(batch_of([70, 3000], exact=True, seed=26), "cpu")
    with pytest.raises((ValueError, RuntimeError), match="max_seq_len"):
        vllm_indexer.decode_topk(q, kv, weights, lens, table, buffer, topk_tokens=K, max_seq_len=bound)
    assert (buffer == SENTINEL).all()


@pytest.mark.cuda
def test_vllm_in_a_cuda_graph():
    """Captured with vLLM's static buffers and a max_seq_len below the rows' lengths (a bound from an
    earlier, shorter batch), replayed on new values: the chain's positions, the padding rows of the
    buffer untouched."""
    first, second = (batch_of([3000, 4100, 2049, 5], exact=True, seed=s) for s in (27, 28))
    static = list(vllm_tensors(first, "cuda"))
    bound = 700
    vllm_indexer.decode_topk(*static, topk_tokens=K, max_seq_len=bound)  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = vllm_indexer.decode_topk(*static, topk_tokens=K, max_seq_len=bound)
    for batch in (second, first):
        for buffer, value in zip(static, vllm_tensors(batch, "cuda")):
            buffer.copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        expected, visible = vllm_chain(*static[:5])
        assert_matches_chain(got, expected, visible, exact=True)
        assert (static[-1][got.shape[0]:] == SENTINEL).all()


@pytest.mark.parametrize("mistake, name", [("lens_dtype", "seq_lens"), ("table_dtype", "block_table"),
                                           ("q_dtype", "padded_q_quant_decode_tokens")])
def test_vllm_op_mistakes_name_vllms_tensor(mistake, name):
    q, kv, weights, lens, table, buffer = vllm_tensors(batch_of([70, 3000], exact=True, seed=23), "cpu")
    broken = {"lens_dtype": dict(seq_lens=lens.long()), "table_dtype": dict(block_table=table.long()),
              "q_dtype": dict(padded_q_quant_decode_tokens=q.float())}[mistake]
    kwargs = dict(padded_q_quant_decode_tokens=q, kv_cache=kv, weights=weights, seq_lens=lens, block_table=table,
                  topk_indices_buffer=buffer, topk_tokens=K)
    with pytest.raises((ValueError, TypeError), match=rf"^{name}\b"):
        vllm_indexer.decode_topk(**{**kwargs, **broken})
    assert (buffer == SENTINEL).all()


@pytest.mark.parametrize("mistake, name", [
    ("q_rank", "padded_q_quant_decode_tokens"), ("cache_shape", "kv_cache"), ("buffer_rows", "topk_indices_buffer"),
    ("buffer_width", "topk_indices_buffer"), ("weights_rows", "weights"), ("topk_tokens", "topk_tokens"),
])
def test_vllm_layout_mistakes_name_vllms_tensor(mistake, name):
    """Refused before the op is called (these need no phase 2)."""
    q, kv, weights, lens, table, buffer = vllm_tensors(batch_of([70, 3000], exact=True, seed=24), "cpu")
    wide = poisoned((8, K + 64))
    broken = {"q_rank": dict(padded_q_quant_decode_tokens=q[:, 0]), "cache_shape": dict(kv_cache=kv[:, :32]),
              "buffer_rows": dict(topk_indices_buffer=buffer[:1]), "buffer_width": dict(topk_indices_buffer=wide),
              "weights_rows": dict(weights=weights[:1]), "topk_tokens": dict(topk_tokens=-1)}[mistake]
    kwargs = dict(padded_q_quant_decode_tokens=q, kv_cache=kv, weights=weights, seq_lens=lens, block_table=table,
                  topk_indices_buffer=buffer, topk_tokens=K)
    with pytest.raises((ValueError, TypeError), match=rf"^{name}\b"):
        vllm_indexer.decode_topk(**{**kwargs, **broken})
    assert (buffer == SENTINEL).all() and (wide == SENTINEL).all()


# ------------------------------------------------------------------------------------- the chain itself

def test_the_chain_is_the_float64_reference_on_exact_data():
    """The plain-torch chain the wirings are compared with gives ffi_dsa.reference's ids (exact data,
    N = 1 and N = 2 with per-query lengths): it is the contract's operator, not a copy of our code."""
    lens = np.array(LENS)
    for batch, next_n in ((batch_of(LENS, exact=True, seed=31), 1),
                          (batch_of(np.stack([lens, np.maximum(lens - 1, 0)], axis=1), exact=True, seed=32,
                                    queries=2), 2)):
        q, k_cache, weights, seq_lens, table = batch.to_torch("cpu")
        q4 = q.reshape(table.shape[0], next_n, *q.shape[-2:])
        positions, _ = chain_positions(q4, k_cache, weights.reshape(-1, q.shape[-2]), seq_lens, table)
        expected = ffi_dsa.reference(*batch.args(), topk=K).reshape(-1, K)
        assert torch.equal(slots(positions, table, next_n), torch.from_numpy(expected))


def test_the_chain_comparison_catches_a_wrong_answer():
    """assert_matches_chain fails for one id replaced (exact data), and a random-data row of at most
    K tokens with one id dropped."""
    batch = batch_of(LENS, exact=True, seed=33)
    expected, visible = sglang_chain(batch, 1)
    wrong = expected.clone().to(torch.int32)
    wrong[4, 3] = wrong[4, 2]
    with pytest.raises(AssertionError, match="rows \\[4\\] differ"):
        assert_matches_chain(wrong, expected, visible, exact=True)
    wrong = expected.clone().to(torch.int32)
    wrong[1, 0] = -1
    with pytest.raises(AssertionError):
        assert_matches_chain(wrong, expected, visible, exact=False)


def test_renamed_names_the_engines_argument():
    err = engine_args.renamed(TypeError("q (q_index_fp8) must be float8_e4m3fn, got float32"), sglang_indexer.ENGINE_NAMES)
    assert str(err) == "q_fp8 (ffi_dsa's q) must be float8_e4m3fn, got float32" and isinstance(err, TypeError)
    err = engine_args.renamed(ValueError("topk_indices dimension 0 must be 1"), vllm_indexer.ENGINE_NAMES)
    assert str(err).startswith("topk_indices_buffer (ffi_dsa's topk_indices) dimension 0")
    assert str(engine_args.renamed(ValueError("every argument must be on one device"), ())) == \
        "every argument must be on one device"

