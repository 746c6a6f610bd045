"""Shared fixtures and builders for the ffi_dsa test suite (the contract: docs/contract.md).

* ``device``: every device test runs on "cpu" and "cuda"; the cuda cases carry ``@pytest.mark.cuda``
  and are deselected when ``torch.cuda.is_available()`` is False (one summary line says so).
* ``--part I/N``: every N-th collected test, for splitting a long run (benchmarks/device_run.sh).
* ``poisoned`` / ``run_dps``: outputs are filled with a sentinel before each call, and every element is
  checked to have been overwritten afterwards.
* ``make_exact_batch``: batches whose scores are exact in any accumulation order (small integers in
  q, k and weights, unit scales), so the tie rule can be checked exactly against ``ffi_dsa.reference``.
* ``set_token`` / ``token_id``: edit one token of the paged cache through the contract's page layout (docs/contract.md §1).
* ``load_script`` / ``script_env``: the checkout's scripts (benchmarks/, integration/), loaded or run
  against the ffi_dsa this suite imports.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

import ffi_dsa
import ffi_dsa.torch_ops  # noqa: F401  (registers torch.ops.dsa.*)
from ffi_dsa.contract import DEFAULT_TOPK as DEFAULT_K
from ffi_dsa.contract import HEAD_DIM, NUM_HEADS, PAGE_BYTES, PAGE_FP8_BYTES, PAGE_TOKENS
from ffi_dsa.cuda_options import using_cuda_options
from ffi_dsa.decode import output_shape
from ffi_dsa.workloads import Batch, make_batch

SENTINEL = 0x7EEEEEEE      # never a valid id (ids are < num_pages * 64) and never -1
FP8 = ml_dtypes.float8_e4m3fn
FP8_NAN_BYTES = (0x7F, 0xFF)  # e4m3fn has no inf: these two bytes are its NaNs

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
CHECKOUT = Path(__file__).resolve().parent.parent
# how many GPU tests a run without a GPU deselected (pytest_collection_modifyitems)
_GPU_DESELECTED = pytest.StashKey[int]()
# The folder holding the ffi_dsa this suite imports (the installed one in CI, else the checkout).
FFI_DSA_PARENT = str(Path(ffi_dsa.__file__).resolve().parent.parent)


def script_env() -> dict:
    """The environment of a script or snippet run in a process of its own: it imports the ffi_dsa
    this suite imports first, then whatever the caller's PYTHONPATH holds (a machine that gets its
    packages through PYTHONPATH, such as carried wheels unpacked into a folder, has them in the
    child too; the interpreter's own site-packages come with sys.executable)."""
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([FFI_DSA_PARENT, *kept]))


def load_script(relative: str):
    """A script of the checkout (``benchmarks/torch_ranks.py``) as a module, loaded as running it
    would: its folder first on sys.path while it imports its siblings."""
    path = CHECKOUT / relative
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def pytest_addoption(parser):
    parser.addoption("--part", default=None, metavar="I/N",
                     help="run the I-th of N interleaved shares of the collected tests (every N-th test, "
                          "starting at the I-th), so that N runs together run the suite once "
                          "(benchmarks/device_run.sh test runs N of them at once)")


def _part(config) -> tuple[int, int] | None:
    """--part I/N as (I, N), or None; a UsageError for anything but 1 <= I <= N."""
    value = config.getoption("--part")
    if value is None:
        return None
    try:
        i, n = (int(x) for x in value.split("/"))
    except ValueError:
        i = n = 0
    if not 1 <= i <= n:
        raise pytest.UsageError(f"--part must be I/N with 1 <= I <= N (e.g. 1/2), got {value!r}")
    return i, n


def pytest_collection_modifyitems(config, items):
    """Without a GPU, everything marked ``cuda`` (tests or device params) is deselected: the summary
    says how many in one line (pytest_terminal_summary), instead of one skip per test burying the
    skips that do matter. ``--part I/N`` then keeps every N-th of the rest."""
    deselected = [] if CUDA else [item for item in items if "cuda" in item.keywords]
    config.stash[_GPU_DESELECTED] = len(deselected)
    kept = [item for item in items if "cuda" not in item.keywords] if deselected else list(items)
    part = _part(config)
    if part:
        i, n = part
        deselected += [item for k, item in enumerate(kept) if k % n != i - 1]
        kept = kept[i - 1::n]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """One line for the GPU tests left out, then one line per skip reason (pytest's -ra lists one
    per test location), so that a reason that matters is not lost among the ones that do not."""
    gpu = config.stash.get(_GPU_DESELECTED, 0)
    if gpu:
        terminalreporter.write_line(f"ffi_dsa: {gpu} test{'s' if gpu != 1 else ''} marked cuda deselected: "
                                    "torch.cuda.is_available() is False here (they run where it is True)")
    reasons: dict[str, list[str]] = {}
    for report in terminalreporter.stats.get("skipped", []):
        if isinstance(report.longrepr, tuple):
            path, _, reason = report.longrepr
            reasons.setdefault(reason.removeprefix("Skipped: "), []).append(Path(path).name)
    if reasons:
        terminalreporter.write_sep("-", "skipped, by reason")
        for reason, files in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
            terminalreporter.write_line(f"{len(files):5d}  {reason}  ({', '.join(sorted(set(files)))})")


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture(autouse=True)
def _restore_current_cuda_device():
    """Each test starts on the CUDA device the session started on. JAX moves the CUDA runtime's
    current device behind torch's back (measured on a 2-GPU H200 machine: `jax.devices("gpu")` leaves
    GPU 1 current, a later JAX op GPU 0). Without this, torch's "cuda" would mean different GPUs in
    different tests, while torch.cuda.graph keeps capturing on a stream made on the GPU of the
    first capture: a graph test then captures nothing. (That the op itself never changes the current
    device is asserted in test_cuda.py::test_second_gpu_while_the_first_is_current.)"""
    if not CUDA:
        yield
        return
    before = torch.cuda.current_device()
    yield
    if torch.cuda.current_device() != before:
        torch.cuda.set_device(before)


# ----------------------------------------------------------------------------------------------
# Outputs: poison, run, check that everything was written.
# ----------------------------------------------------------------------------------------------

def poisoned(shape, device="cpu", dtype=torch.int32, value=SENTINEL):
    """A torch output buffer filled with `value` (the sentinel by default)."""
    return torch.full(shape, value, dtype=dtype, device=device)


def poisoned_np(shape, dtype=np.int32, value=SENTINEL):
    return np.full(shape, value, dtype=dtype)


def assert_all_written(out) -> None:
    host = out.cpu().numpy() if isinstance(out, torch.Tensor) else np.asarray(out)
    unwritten = np.argwhere(host == SENTINEL)
    assert unwritten.size == 0, f"{len(unwritten)} output elements were never written, first at {unwritten[:3].tolist()}"


def run_dps(args, topk=DEFAULT_K, *, sorted=False, validate=False, **options) -> np.ndarray:
    """``ffi_dsa.call`` into a poisoned torch buffer on the arguments' device; returns host int32
    (``[B, K]``, or ``[B, N, K]`` for a rank-4 q). `options`: the call's others (``ids``,
    ``max_seq_len``).

    Checks that every element of the output was written.
    """
    q = args[0]
    out = poisoned(output_shape(tuple(q.shape), topk), q.device)
    ffi_dsa.call(*args, out, sorted=sorted, validate=validate, **options)
    assert_all_written(out)
    return out.cpu().numpy()


# Every cap on the split path's select clusters (ffi_dsa.cuda_options max_select_cluster), largest first.
CLUSTER_CAPS = (16, 8, 4, 2, 1)


def run_under_every_cluster_cap(args, *, sorted=False, name: str = "") -> np.ndarray:
    """``run_dps`` on the split path under every cap of CLUSTER_CAPS; asserts that every cap gives
    the same bytes and returns them (a row's cluster size must not change its output)."""
    outs = {}
    for cap in CLUSTER_CAPS:
        with using_cuda_options(max_select_cluster=cap, fused=False):
            outs[cap] = run_dps(args, sorted=sorted)
    first = outs[CLUSTER_CAPS[0]]
    for cap in CLUSTER_CAPS[1:]:
        np.testing.assert_array_equal(outs[cap], first, err_msg=f"{name}: max_select_cluster={cap}")
    return first


def fill_past_rows(batch: Batch, seed: int) -> None:
    """Random page ids, valid or not, in every block-table entry past each row's longest length
    (what a serving engine's table holds there: only a row's own pages may count)."""
    rng = np.random.default_rng(seed)
    longest = np.asarray(batch.seq_lens, np.int64).reshape(len(batch.seq_lens), -1).max(axis=1, initial=0)
    width, num_pages = batch.block_table.shape[1], batch.k_cache.shape[0]
    for b, n in enumerate(longest):
        used = (int(n) + PAGE_TOKENS - 1) // PAGE_TOKENS
        batch.block_table[b, used:] = rng.integers(-3, num_pages + 3, size=width - used)


def assert_validate_raises(batch: Batch, name: str, device, topk: int = 64) -> None:
    """With ``validate=True`` both entry points raise ValueError naming ``name`` (an argument entry
    the kernels would mask) and the DPS call writes nothing; without it the same input runs."""
    args = batch.to_torch(device)
    out = poisoned(batch.output_shape(topk), device)
    with pytest.raises(ValueError, match=re.escape(name)):
        ffi_dsa.call(*args, out, validate=True)
    assert (out == SENTINEL).all()
    with pytest.raises(ValueError, match=re.escape(name)):
        ffi_dsa.topk_indexer(*args, topk=topk, validate=True)
    run_dps(args, topk=topk)


def assert_valid_topk(out, batch_or_args, *, sorted=False):
    """The contract's tolerance rule (``ffi_dsa.check_topk``) holds for every row."""
    args = batch_or_args.args() if isinstance(batch_or_args, Batch) else batch_or_args
    problems = ffi_dsa.check_topk(out, *args, sorted=sorted)
    assert problems == [], "\n".join(problems[:10])


def call_result(batch: Batch, topk=DEFAULT_K, *, sorted=False, device="cpu", shape=None, **options) -> np.ndarray:
    """``ffi_dsa.call`` on the batch's inputs on `device` ("cpu": numpy, "cuda": torch tensors), into a
    poisoned buffer of `shape` (default ``batch.output_shape``; ``[B * N, K]`` is the other accepted
    form), checked to be fully written: the bytes every other caller (torch op, JAX, TVM) must
    reproduce on that device. Across devices the contract promises only the tolerance rule (FP8
    tensor cores add differently). `options`: the call's others (``ids``, ``max_seq_len``)."""
    shape = batch.output_shape(topk) if shape is None else shape
    if device == "cpu":
        out = poisoned_np(shape)
        ffi_dsa.call(*batch.args(), out, sorted=sorted, **options)
    else:
        out = poisoned(shape, device)
        ffi_dsa.call(*batch.to_torch(device), out, sorted=sorted, **options)
        out = out.cpu().numpy()
    assert_all_written(out)
    return out


def assert_same_as_call(got: np.ndarray, batch: Batch, topk=DEFAULT_K, *, sorted=False, device="cpu",
                        **options) -> None:
    """A caller's host copy of its result on `device` equals ``call_result`` on the same device (with
    the same `options`) byte for byte and is a valid top-K."""
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, call_result(batch, topk, sorted=sorted, device=device, **options))
    assert ffi_dsa.check_topk(got, *batch.args(), sorted=sorted, ids=options.get("ids", "slots")) == []


def assert_exact(out, batch: Batch, topk=DEFAULT_K, *, sorted=False, name="", ids="slots"):
    """Byte-exact agreement with the float64 reference (only meaningful on exact-score data), in the
    output shape of the batch's q; `out` may be numpy, torch (any device) or JAX; `name` prefixes
    the failure message."""
    expected = ffi_dsa.reference(*batch.args(), topk=topk, sorted=sorted, ids=ids)
    out = out.cpu().numpy() if isinstance(out, torch.Tensor) else np.asarray(out)
    assert out.dtype == np.int32, f"{name}: dtype {out.dtype}"
    assert out.shape == expected.shape, f"{name}: shape {out.shape}, expected {expected.shape}"
    assert_rows_equal(out, expected, f"{name}: vs the reference")


def assert_rows_equal(got, expected, what: str) -> None:
    """Byte equality of two outputs, one row per query row (any output shape); the message names the
    differing rows and shows the first difference."""
    got, expected = (np.asarray(x) for x in (got, expected))
    got, expected = got.reshape(-1, got.shape[-1]), expected.reshape(-1, expected.shape[-1])
    bad = np.nonzero((got != expected).any(axis=1))[0]
    if bad.size:
        r = int(bad[0])
        col = int(np.argmax(got[r] != expected[r]))
        raise AssertionError(f"{what}: rows {bad.tolist()[:8]} differ; row {r} first differs at column {col}: got "
                             f"{got[r, col:col + 6].tolist()}, expected {expected[r, col:col + 6].tolist()}")


# ----------------------------------------------------------------------------------------------
# Editing the paged cache through the contract's page layout (docs/contract.md §1).
# ----------------------------------------------------------------------------------------------

def fp8_bytes(values) -> np.ndarray:
    """float values -> float8_e4m3fn bytes (uint8)."""
    return np.asarray(values, dtype=np.float32).astype(FP8).view(np.uint8)


def page_bytes(batch: Batch) -> np.ndarray:
    """A writable ``[num_pages, 8448]`` uint8 view of the batch's cache."""
    view = batch.k_cache.view(np.uint8).reshape(-1, PAGE_BYTES)
    assert np.shares_memory(view, batch.k_cache)
    return view


def page_slot(batch: Batch, b: int, t: int) -> tuple[int, int]:
    """Where token `t` of row `b` lives: (block_table[b, t // 64], t % 64)."""
    return int(batch.block_table[b, t // PAGE_TOKENS]), t % PAGE_TOKENS


def token_id(batch: Batch, b: int, t: int) -> int:
    """The global id of token `t` of row `b`: page * 64 + slot."""
    page, slot = page_slot(batch, b, t)
    return page * PAGE_TOKENS + slot


def tie_rule_winners(scores: np.ndarray, k: int) -> np.ndarray:
    """The positions the contract's tie rule picks from a row of exact scores whose K-th place is a
    tie (asserted: the data must make one), independently of any reference: every token above the
    cut, then the tied tokens with the smallest positions, in ascending position."""
    ranked = np.sort(scores)[::-1]
    cut = ranked[k - 1]
    assert ranked[k] == cut, "test data must have a tie straddling the K-th place"
    above = np.nonzero(scores > cut)[0]
    tied = np.nonzero(scores == cut)[0][: k - len(above)]
    return np.sort(np.concatenate([above, tied]))


def row_ids(batch: Batch, b: int, positions) -> list[int]:
    return [token_id(batch, b, int(t)) for t in positions]


def set_key_bytes(batch: Batch, page: int, slot: int, raw: np.ndarray) -> None:
    page_bytes(batch)[page, slot * HEAD_DIM:(slot + 1) * HEAD_DIM] = raw


def set_scale(batch: Batch, page: int, slot: int, scale: float) -> None:
    off = PAGE_FP8_BYTES + 4 * slot
    page_bytes(batch)[page, off:off + 4] = np.array([scale], dtype="<f4").view(np.uint8)


def set_token(batch: Batch, b: int, t: int, key=None, scale=None, raw=None) -> int:
    """Overwrite token `t` of row `b`: its 128 key values (or raw fp8 bytes) and/or its scale.

    Returns the token's global id.
    """
    page, slot = page_slot(batch, b, t)
    if key is not None:
        set_key_bytes(batch, page, slot, fp8_bytes(np.broadcast_to(np.asarray(key, np.float32), (HEAD_DIM,))))
    if raw is not None:
        set_key_bytes(batch, page, slot, np.asarray(raw, dtype=np.uint8))
    if scale is not None:
        set_scale(batch, page, slot, scale)
    return page * PAGE_TOKENS + slot


def make_exact_batch(seq_lens, *, seed: int, q_values=(-2, -1, 0, 1, 2), k_values=(-2, -1, 0, 1, 2),
                     w_values=(-2, -1, 1, 2), active_dims: int = HEAD_DIM, spare_pages: int = 0,
                     max_pages: int | None = None, queries: int | None = None, heads: int = NUM_HEADS) -> Batch:
    """A batch whose scores are exact in float32 whatever the accumulation order.

    q, k and weights are small integers (exactly representable in fp8 / float32), only the first
    `active_dims` dims of q and k are non-zero, and every scale is 1.0. With |q|, |k|, |w| <= 2:
    |logit| <= 128 * 4 = 512 and |score| <= 64 * 2 * 512 = 65536 < 2**24, so every partial sum is an
    integer float32 represents exactly. Pages are a shuffled pool, so global-id order differs from
    position order. ``queries`` and ``heads`` as in ``make_batch`` (docs/contract.md §7).
    """
    batch = make_batch(seq_lens, seed=seed, spare_pages=spare_pages, max_pages=max_pages, scale_range=None,
                       queries=queries, heads=heads)
    rng = np.random.default_rng(seed + 1_000_003)
    num_pages = batch.k_cache.shape[0]

    q = rng.choice(np.asarray(q_values, np.float32), size=batch.q.shape)
    q[..., active_dims:] = 0
    batch.q[...] = fp8_bytes(q)
    batch.weights[...] = rng.choice(np.asarray(w_values, np.float32), size=batch.weights.shape)

    k = rng.choice(np.asarray(k_values, np.float32), size=(num_pages, PAGE_TOKENS, HEAD_DIM))
    k[..., active_dims:] = 0
    pages = page_bytes(batch)
    pages[:, :PAGE_FP8_BYTES] = fp8_bytes(k).reshape(num_pages, -1)
    pages[:, PAGE_FP8_BYTES:] = np.ones((num_pages, PAGE_TOKENS), dtype="<f4").view(np.uint8)
    return batch


def scores_of_row(batch: Batch, b: int) -> np.ndarray:
    """float64 reference scores of row `b`, indexed by position (candidates only)."""
    return ffi_dsa.reference_scores(*batch.args())[b].scores
