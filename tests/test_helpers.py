"""The Python helpers the tests and users rely on: pack_k_cache / unpack_k_cache (docs/contract.md §1),
the float64 reference (§2), and check_topk (§4) — including a
"test the tester" check that check_topk really reports broken answers.
"""

from __future__ import annotations

import struct

import ml_dtypes
import numpy as np
import pytest
import torch

import ffi_dsa
from ffi_dsa.workloads import make_batch

from conftest import (
    FP8,
    fp8_bytes,
    make_exact_batch,
    row_ids,
    run_dps,
    scores_of_row,
    set_token,
    token_id,
)


def _keys(num_pages, seed):
    """Random keys whose per-token magnitudes span 6 decades, one all-zero token, one negative amax."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((num_pages, 64, 128)).astype(np.float32)
    k *= (10.0 ** rng.uniform(-3, 3, size=(num_pages, 64, 1))).astype(np.float32)
    k[0, 5] = 0.0
    k[0, 6, 17] = -1000.0 * np.abs(k[0, 6]).max()
    return k


# ----------------------------------------------------------------------------------------------
# pack_k_cache / unpack_k_cache
# ----------------------------------------------------------------------------------------------

def test_pack_round_trip_within_fp8_precision():
    """unpack(pack(k)) gives fp8 * scale within e4m3 precision of k, with scale = amax / 448."""
    k = _keys(3, seed=90)
    packed = ffi_dsa.pack_k_cache(k)
    assert packed.shape == (3, 64, 1, 132) and packed.dtype == np.int8
    fp8, scale = ffi_dsa.unpack_k_cache(packed)
    assert fp8.shape == (3, 64, 128) and scale.shape == (3, 64)

    amax = np.abs(k).max(axis=-1)
    expected_scale = np.where(amax > 0, amax / np.float32(448.0), 1.0).astype(np.float32)
    assert np.array_equal(scale, expected_scale.astype(np.float64))
    assert scale[0, 5] == 1.0, "an all-zero token gets scale 1"
    assert np.abs(fp8).max(axis=-1)[amax > 0].min() == 448.0, "each token's amax maps to fp8 448"

    back = fp8 * scale[..., None]
    # e4m3: 3 mantissa bits (relative error <= 2**-4); subnormals below 2**-6 have spacing 2**-9.
    bound = np.maximum(np.abs(k) * 2.0**-4, scale[..., None] * 2.0**-10) * (1 + 1e-6)
    err = np.abs(back - k)
    assert (err <= bound).all(), f"worst error / bound: {(err / bound).max()}"
    assert (back[0, 5] == 0).all()


def test_pack_layout_is_deepgemm_fp8_rows_then_scales():
    """Page layout: 64 token rows of 128 fp8 bytes first, then 64 little-endian float32 scales; the
    [num_pages, 64, 1, 132] shape is only a byte container."""
    k = _keys(2, seed=91)
    raw = ffi_dsa.pack_k_cache(k).view(np.uint8).reshape(2, 8448)
    for p, s in [(0, 0), (0, 63), (1, 17), (0, 6)]:
        amax = np.abs(k[p, s]).max()
        scale = np.float32(amax / np.float32(448.0))
        assert raw[p, 8192 + 4 * s: 8192 + 4 * s + 4].tobytes() == struct.pack("<f", scale)
        assert np.array_equal(raw[p, 128 * s: 128 * (s + 1)], fp8_bytes(k[p, s] / scale))
    # "row" i of the container is bytes i*132 .. i*132+131 of the page, not token i
    container = ffi_dsa.pack_k_cache(k).view(np.uint8)
    assert np.array_equal(container[1, 1, 0], raw[1, 132:264])


def _assert_same_packing(got, expected, device):
    """Byte-for-byte on the CPU. On CUDA the scales must match exactly, but torch's GPU division and
    fp8 cast may round a quotient that sits on an fp8 rounding boundary the other way (seen on an
    H100: one byte in 32768 off by one fp8 step), so fp8 bytes may differ by one step, rarely."""
    got = got.view(np.uint8).reshape(-1, 8448)
    expected = expected.view(np.uint8).reshape(-1, 8448)
    assert np.array_equal(got[:, 8192:], expected[:, 8192:])
    if device == "cpu":
        assert np.array_equal(got, expected)
        return
    a = got[:, :8192].view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    b = expected[:, :8192].view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    differ = a != b
    assert differ.mean() < 1e-3
    steps = np.abs(got[:, :8192].astype(np.int16) - expected[:, :8192].astype(np.int16))[differ]
    assert np.all((steps == 1) & (np.sign(a[differ]) == np.sign(b[differ])))


def test_pack_torch_and_numpy_agree_byte_for_byte(device):
    """pack_k_cache on a torch tensor (float32 or bf16, any device) gives the numpy bytes and stays on
    the tensor's device."""
    k = _keys(4, seed=92)
    expected = ffi_dsa.pack_k_cache(k)
    got = ffi_dsa.pack_k_cache(torch.from_numpy(k).to(device))
    assert got.device.type == device and got.dtype == torch.int8 and tuple(got.shape) == (4, 64, 1, 132)
    _assert_same_packing(got.cpu().numpy(), expected, device)

    k_bf16 = torch.from_numpy(k).to(torch.bfloat16)
    got_bf16 = ffi_dsa.pack_k_cache(k_bf16.to(device))
    _assert_same_packing(got_bf16.cpu().numpy(), ffi_dsa.pack_k_cache(k_bf16.float().numpy()), device)


def test_unpack_accepts_torch():
    k = _keys(2, seed=93)
    packed = ffi_dsa.pack_k_cache(k)
    a = ffi_dsa.unpack_k_cache(packed)
    b = ffi_dsa.unpack_k_cache(torch.from_numpy(packed))
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


@pytest.mark.parametrize("shape", [(2, 64, 127), (2, 32, 128), (64, 128), (1, 64, 128, 1)])
def test_pack_rejects_wrong_shapes(shape):
    with pytest.raises(ValueError, match="num_pages, 64, 128"):
        ffi_dsa.pack_k_cache(np.ones(shape, np.float32))
    with pytest.raises(ValueError):
        ffi_dsa.pack_k_cache(torch.ones(shape))


# ----------------------------------------------------------------------------------------------
# reference on a hand-computed example
# ----------------------------------------------------------------------------------------------

def _hand_example():
    """1 row, 3 tokens on page 2 of a 3-page pool; only heads 0 and 1 and dims 0 and 1 are non-zero.

        q[0] = [1, 2],  q[1] = [-1, 0.5],  w[0] = 0.5, w[1] = 2   (other heads: q = 0, w = 1)
        token 0: fp8 [ 2, 1], scale  0.5 -> k = [ 1, 0.5]: head0 1 + 1 = 2,   head1 -1 + 0.25 = -0.75
                 score = 0.5 * 2 + 2 * relu(-0.75)           = 1
        token 1: fp8 [-4, 3], scale  1   -> k = [-4, 3]:   head0 -4 + 6 = 2,  head1 4 + 1.5 = 5.5
                 score = 0.5 * 2 + 2 * 5.5                   = 12
        token 2: fp8 [ 1, 1], scale -2   -> k = [-2, -2]:  head0 -2 - 4 = -6, head1 2 - 1 = 1
                 score = 0.5 * relu(-6) + 2 * 1              = 2
        (scale applied after the relu would give token 2: 0.5 * relu(3) * -2 + 2 * relu(-0.5) * -2 = -3)
    """
    batch = make_batch([3], seed=94, spare_pages=2)
    batch.block_table[0, 0] = 2
    q = np.zeros((1, 64, 128), np.float32)
    q[0, 0, :2] = [1, 2]
    q[0, 1, :2] = [-1, 0.5]
    batch.q[...] = fp8_bytes(q)
    batch.weights[...] = 1.0
    batch.weights[0, :2] = [0.5, 2.0]
    for t, (key, scale) in enumerate([([2, 1], 0.5), ([-4, 3], 1.0), ([1, 1], -2.0)]):
        full = np.zeros(128, np.float32)
        full[:2] = key
        set_token(batch, 0, t, key=full, scale=scale)
    return batch


def test_reference_scores_on_a_hand_computed_example():
    batch = _hand_example()
    (row,) = ffi_dsa.reference_scores(*batch.args())
    assert row.positions.tolist() == [0, 1, 2]
    assert row.ids.tolist() == [128, 129, 130]
    assert row.scores.tolist() == [1.0, 12.0, 2.0]


def test_reference_selection_on_the_hand_computed_example():
    batch = _hand_example()
    ref = lambda k, s=False: ffi_dsa.reference(*batch.args(), topk=k, sorted=s).tolist()  # noqa: E731
    assert ref(4) == [[128, 129, 130, -1]]                  # ascending position, -1 tail
    assert ref(4, True) == [[129, 130, 128, -1]]            # scores 12, 2, 1
    assert ref(2) == [[129, 130]]
    assert ref(1) == [[129]]


def test_kernel_on_the_hand_computed_example(device):
    batch = _hand_example()
    assert run_dps(batch.to_torch(device), topk=4).tolist() == [[128, 129, 130, -1]]
    assert run_dps(batch.to_torch(device), topk=4, sorted=True).tolist() == [[129, 130, 128, -1]]
    assert run_dps(batch.to_torch(device), topk=2).tolist() == [[129, 130]]


# ----------------------------------------------------------------------------------------------
# check_topk catches broken answers (so the tolerance tests can fail)
# ----------------------------------------------------------------------------------------------

@pytest.fixture
def checked():
    """A random batch, K = 16, and its exact reference answer (which check_topk accepts)."""
    batch = make_batch([500, 300, 10], seed=95, spare_pages=3)
    k = 16
    good = ffi_dsa.reference(*batch.args(), topk=k)
    assert ffi_dsa.check_topk(good, *batch.args()) == []
    good_sorted = ffi_dsa.reference(*batch.args(), topk=k, sorted=True)
    assert ffi_dsa.check_topk(good_sorted, *batch.args(), sorted=True) == []
    return batch, good, good_sorted


def _problems(out, batch, **kw):
    problems = ffi_dsa.check_topk(out, *batch.args(), **kw)
    assert isinstance(problems, list)
    return problems


def test_check_topk_catches_a_wrong_selection(checked):
    """The K-th best token replaced by the worst one (position order kept): reported."""
    batch, good, _ = checked
    scores = scores_of_row(batch, 0)
    top = np.argsort(-scores, kind="stable")[:16]
    worst = int(np.argmin(scores))
    bad = good.copy()
    bad[0] = row_ids(batch, 0, sorted(top[:-1].tolist() + [worst]))
    problems = _problems(bad, batch)
    assert any("row 0" in p and "below the K-th score" in p for p in problems), problems


def test_check_topk_catches_a_duplicate(checked):
    batch, good, _ = checked
    bad = good.copy()
    bad[1, 1] = bad[1, 0]
    assert any("row 1" in p and "duplicate" in p for p in _problems(bad, batch))


def test_check_topk_catches_a_missing_or_extra_minus_one(checked):
    batch, good, _ = checked
    assert (good[2, 10:] == -1).all()
    extra = good.copy()
    extra[2, 10] = token_id(batch, 1, 0)         # an id where -1 is expected
    assert any("row 2" in p for p in _problems(extra, batch))
    missing = good.copy()
    missing[0, 15] = -1                          # -1 where an id is expected
    assert any("row 0" in p for p in _problems(missing, batch))
    early = good.copy()
    early[2, 3] = -1                             # right count, -1 not at the tail
    early[2, 10] = good[2, 3]
    assert any("row 2" in p for p in _problems(early, batch))


def test_check_topk_catches_ids_outside_the_row(checked):
    batch, good, _ = checked
    other_row = good.copy()
    other_row[0, 0] = token_id(batch, 1, 5)      # a token of row 1, not of row 0
    assert any("row 0" in p and "not in the row" in p for p in _problems(other_row, batch))
    spare_page = batch.k_cache.shape[0] - 1      # a page no row uses
    assert spare_page not in batch.block_table
    unused = good.copy()
    unused[1, 0] = spare_page * 64
    assert any("row 1" in p for p in _problems(unused, batch))
    garbage = good.copy()
    garbage[1, 0] = 10**6
    assert any("row 1" in p for p in _problems(garbage, batch))


def test_check_topk_catches_a_token_on_an_invalid_page():
    batch = make_exact_batch([200], seed=96)
    batch.block_table[0, 1] = 99                 # page id outside [0, num_pages): tokens 64..127 are out
    good = ffi_dsa.reference(*batch.args(), topk=150)
    assert ffi_dsa.check_topk(good, *batch.args()) == []
    bad = good.copy()
    bad[0, 0] = 99 * 64                          # a chosen id replaced by a token of the invalid page
    assert any("not in the row" in p for p in _problems(bad, batch))


def test_check_topk_catches_wrong_order(checked):
    batch, good, good_sorted = checked
    reversed_ = good.copy()
    reversed_[0] = good[0, ::-1]
    assert any("ascending token position" in p for p in _problems(reversed_, batch))
    assert not np.array_equal(good[0], good_sorted[0])
    assert any("descending score" in p for p in _problems(good, batch, sorted=True))


def test_check_topk_catches_nan_chosen_over_a_number():
    batch = make_exact_batch([100], seed=97)
    nan_t = 50
    set_token(batch, 0, nan_t, scale=float("nan"))
    good = ffi_dsa.reference(*batch.args(), topk=10)
    assert token_id(batch, 0, nan_t) not in good[0]
    bad = good.copy()
    id_to_pos = {token_id(batch, 0, t): t for t in range(100)}
    positions = sorted([id_to_pos[int(i)] for i in good[0, 1:]] + [nan_t])
    bad[0] = row_ids(batch, 0, positions)
    assert any("NaN" in p for p in _problems(bad, batch))


def test_check_topk_tolerates_swaps_within_the_tolerance_only():
    """The contract's tolerance (docs/contract.md §4): a near-tie at the cut (within 1e-3 * max|score|) may swap; a clear loser may not."""
    batch = make_batch([3000], seed=98)
    row = ffi_dsa.reference_scores(*batch.args())[0]
    order = np.argsort(-row.scores, kind="stable")
    tol = 1e-3 * np.abs(row.scores).max()
    gaps = -np.diff(row.scores[order])
    k = int(np.nonzero((gaps > 0) & (gaps < tol / 2))[0][0]) + 1   # a K whose cut is a near-tie
    assert 0 < row.scores[order[k - 1]] - row.scores[order[k]] < tol
    swapped = np.sort(np.concatenate([order[: k - 1], order[k:k + 1]]))
    out = np.array([row.ids[swapped]], np.int32)
    assert ffi_dsa.check_topk(out, *batch.args()) == []
    far = np.sort(np.concatenate([order[: k - 1], order[-1:]]))
    out = np.array([row.ids[far]], np.int32)
    assert ffi_dsa.check_topk(out, *batch.args()) != []


def test_fp8_helper_round_trips_small_integers():
    """The exact-data builder relies on small integers being exact in float8_e4m3fn."""
    vals = np.arange(-16, 17, dtype=np.float32)
    assert np.array_equal(fp8_bytes(vals).view(FP8).astype(np.float32), vals)
    assert ml_dtypes.finfo(FP8).max == 448.0


def test_check_topk_tolerance_has_a_magnitude_term():
    """The contract's second tolerance term (docs/contract.md §4): 2**-12 * max_t M[t], the magnitude of
    the sums behind the scores. A swap at the cut by more than 1e-3 * max|score| passes only when the
    row's magnitude term covers it."""
    from ffi_dsa.decode_reference import RowScores

    scores = np.array([10.0, 9.99, 9.0, 5.0])
    row = RowScores(positions=np.arange(4), ids=np.arange(4) + 640, scores=scores, magnitude=0.0)
    out = np.array([[640, 642]], np.int32)  # the 3rd best (9.0) instead of the 2nd (9.99): 0.99 below
    args = make_batch([4], seed=99).args()
    assert ffi_dsa.check_topk(out, *args, rows=[row]) != []           # 0.99 > 1e-3 * 10
    row.magnitude = 2.0 ** 12 * 1.0                                   # covers a gap of 1.0
    assert ffi_dsa.check_topk(out, *args, rows=[row]) == []
    out = np.array([[640, 643]], np.int32)                            # 5.0: 4.99 below, still too far
    assert ffi_dsa.check_topk(out, *args, rows=[row]) != []


def test_reference_magnitude_is_the_sum_of_absolute_products():
    """RowScores.magnitude = max_t sum_h |w_h| * sum_d |q_hd * k_td| (float64)."""
    batch = make_batch([70], seed=97)
    row = ffi_dsa.reference_scores(*batch.args())[0]
    q = batch.q.view(ml_dtypes.float8_e4m3fn).astype(np.float64)[0]
    fp8, scale = ffi_dsa.unpack_k_cache(batch.k_cache)
    t = np.arange(70)
    page = batch.block_table[0, t // 64]
    keys = fp8[page, t % 64] * scale[page, t % 64][:, None]
    per_token = (np.abs(keys)[:, None, :] * np.abs(q)[None]).sum(axis=2) @ np.abs(batch.weights[0].astype(np.float64))
    assert np.isclose(row.magnitude, per_token.max(), rtol=1e-12)
