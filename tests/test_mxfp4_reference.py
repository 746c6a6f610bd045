"""The MXFP4 float64 reference and its check (ffi_dsa.reference_mxfp4_scores, reference_mxfp4,
check_mxfp4_topk) on a hand-computed example, and the check catching broken answers, so that the
tests measured against them can fail; and the MXFP4 constants Python reads against contract.h."""

from __future__ import annotations

import re

import numpy as np

import ffi_dsa
from ffi_dsa import _build, contract
from ffi_dsa.mxfp4_cache import pack_nibbles

from mxfp4_helpers import codes_of, make_exact_mxfp4_batch, run_mxfp4, set_q_scale, set_token, token_id


def _hand_example():
    """One query row, 3 tokens, every head alike (q = 1.5 on element 0 and 2 on element 33, scale
    bytes 128 and 126: factors 2 and 1/2), unit weights: token 0 (k0 = 1, byte 127) scores
    64 * 1.5 * 1 * 2 = 192; token 1 (k33 = -6, byte 129 on block 1) relu(2 * -6 * 2^(126 + 129 - 254)) = 0;
    token 2 (k0 = 0.5, k33 = 4, bytes 129 / 127) 64 * (1.5 * 0.5 * 2^(128 + 129 - 254) + 2 * 4 * 2^-1) = 640."""
    batch = make_exact_mxfp4_batch([3], seed=1, q_values=(0.0,), k_values=(0.0,), w_values=(1.0,), scale_offsets=(0,))
    q = np.zeros(128)
    q[0], q[33] = 1.5, 2.0
    batch.q[0] = pack_nibbles(codes_of(q))
    for h in range(64):
        set_q_scale(batch, 0, h, [128, 126, 127, 127])
    keys = [({0: 1.0}, [127] * 4), ({33: -6.0}, [127, 129, 127, 127]), ({0: 0.5, 33: 4.0}, [129, 127, 127, 127])]
    for t, (values, scale) in enumerate(keys):
        k = np.zeros(128)
        for d, v in values.items():
            k[d] = v
        set_token(batch, 0, t, values=k, scale_bytes=scale)
    return batch


def test_reference_scores_on_a_hand_computed_example():
    batch = _hand_example()
    (row,) = ffi_dsa.reference_mxfp4_scores(*batch.args())
    assert row.scores.tolist() == [192.0, 0.0, 640.0]
    # max M[t], M = sum_h |w| sum_c scale * sum_d |q k|: token 1's, which relu hides, 64 * 2 * 6 * 2^1
    assert row.magnitude == 1536.0
    assert ffi_dsa.reference_mxfp4(*batch.args(), topk=4, sorted=True).tolist() == \
        [[token_id(batch, 0, 2), token_id(batch, 0, 0), token_id(batch, 0, 1), -1]]


def test_kernel_on_the_hand_computed_example():
    batch = _hand_example()
    ids = [token_id(batch, 0, t) for t in range(3)]
    assert run_mxfp4(batch, 4).tolist() == [[*ids, -1]]
    assert run_mxfp4(batch, 2, sorted=True).tolist() == [[ids[2], ids[0]]]


def test_check_catches_broken_answers():
    batch = make_exact_mxfp4_batch([500, 300], seed=2, active_dims=8)
    good = ffi_dsa.reference_mxfp4(*batch.args(), topk=16)
    assert ffi_dsa.check_mxfp4_topk(good, *batch.args()) == []
    scores = ffi_dsa.reference_mxfp4_scores(*batch.args())[0].scores
    worst = int(np.argmin(scores))
    bad = good.copy()
    best = np.argsort(-scores, kind="stable")[:15]
    bad[0] = sorted(token_id(batch, 0, int(t)) for t in [*best, worst])
    assert any("below the K-th score" in p for p in ffi_dsa.check_mxfp4_topk(bad, *batch.args()))
    dup = good.copy()
    dup[1, 1] = dup[1, 0]
    assert any("duplicate" in p for p in ffi_dsa.check_mxfp4_topk(dup, *batch.args()))
    unsorted = good[:, ::-1].copy()
    assert any("ascending token position" in p for p in ffi_dsa.check_mxfp4_topk(unsorted, *batch.args()))


def test_mxfp4_constants_are_those_of_contract_h():
    header = (_build.native_dir() / "include" / "ffi_dsa" / "contract.h").read_text()
    written = dict(re.findall(r"constexpr int (k\w+) = (\d+);", header))
    assert int(written["kMxfp4Block"]) == contract.MXFP4_BLOCK == 32
    assert int(written["kUe8m0Bias"]) == contract.UE8M0_BIAS and int(written["kUe8m0NaN"]) == contract.UE8M0_NAN
    assert contract.MXFP4_BLOCKS * contract.MXFP4_BLOCK == contract.HEAD_DIM
    assert contract.MXFP4_HEAD_BYTES * 2 == contract.HEAD_DIM
    assert contract.MXFP4_TOKEN_BYTES == contract.MXFP4_HEAD_BYTES + contract.MXFP4_BLOCKS == 68
    assert contract.MXFP4_PAGE_BYTES == contract.PAGE_TOKENS * contract.MXFP4_TOKEN_BYTES == 4352
    assert contract.MXFP4_PAGE_VALUE_BYTES == contract.PAGE_TOKENS * contract.MXFP4_HEAD_BYTES
    assert contract.MXFP4_IDS == contract.DECODE_IDS
