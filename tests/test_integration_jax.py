"""JAX: the XLA FFI target through ffi_dsa.jax_ops, eager, under jax.jit and jax.vmap.

Results are compared byte for byte with ``ffi_dsa.call`` (numpy) on the same inputs and checked
with ``ffi_dsa.check_topk``. GPU cases need a JAX CUDA backend and carry ``@pytest.mark.cuda``.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with torch tests
jax = pytest.importorskip("jax")
pytest.importorskip("jax_tvm_ffi")
import jax.numpy as jnp  # noqa: E402

import ffi_dsa  # noqa: E402
from ffi_dsa.contract import MAX_QUERIES, NUM_HEADS, NUM_HEADS_NARROW  # noqa: E402
from ffi_dsa import decode, jax_ops  # noqa: E402
from ffi_dsa.workloads import make_batch  # noqa: E402

from conftest import assert_exact, assert_same_as_call, call_result, load_script  # noqa: E402
from mtp_batches import FORMS, Form, mtp_batch  # noqa: E402


def _jax_gpu():
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        return None


GPU = _jax_gpu()
PLATFORMS = ["cpu", pytest.param("gpu", marks=[pytest.mark.cuda,
                                                pytest.mark.skipif(GPU is None, reason="needs a JAX GPU")])]
K = 16
LENS = [150, 3, 0, 300]
jitted = jax.jit(ffi_dsa.topk_indexer, static_argnames=("topk", "sorted"))


@pytest.fixture(params=PLATFORMS)
def platform(request):
    return request.param


def on(platform, batch, q_dtype=jnp.float8_e4m3fn):
    device = jax.devices("cpu")[0] if platform == "cpu" else GPU
    q = jnp.asarray(batch.q).view(q_dtype)
    return [jax.device_put(a, device) for a in (q, *map(jnp.asarray, batch.args()[1:]))]


def torch_device(platform: str) -> str:
    return "cpu" if platform == "cpu" else "cuda"


def assert_same(got, batch, topk=K, sorted=False):
    platform = next(iter(got.devices())).platform
    assert_same_as_call(np.asarray(got), batch, topk, sorted=sorted, device=torch_device(platform))


@pytest.mark.parametrize("sorted_", [False, True])
@pytest.mark.parametrize("q_dtype", [jnp.float8_e4m3fn, jnp.uint8])
def test_eager_and_jit_match_call(platform, sorted_, q_dtype):
    batch = make_batch(LENS, seed=1, spare_pages=3)
    args = on(platform, batch, q_dtype)
    assert_same(ffi_dsa.topk_indexer(*args, topk=K, sorted=sorted_), batch, sorted=sorted_)
    got = jitted(*args, topk=K, sorted=sorted_)
    assert got.devices() == args[0].devices()
    assert_same(got, batch, sorted=sorted_)


def test_package_entry_point_routes_jax_arrays(platform):
    batch = make_batch(LENS, seed=2)
    got = ffi_dsa.topk_indexer(*on(platform, batch), topk=K)
    assert isinstance(got, jax.Array)
    assert_same(got, batch)


def test_default_topk_is_2048(platform):
    batch = make_batch([2100, 5], seed=3)
    got = jitted(*on(platform, batch))
    assert got.shape == (2, 2048)
    assert_same(got, batch, topk=2048)


def test_inside_a_larger_jit(platform):
    batch = make_batch(LENS, seed=4)

    @jax.jit
    def step(q, k_cache, weights, seq_lens, block_table):
        idx = ffi_dsa.topk_indexer(q, k_cache, weights * 2.0, seq_lens, block_table, topk=K)
        return idx, (idx >= 0).sum(axis=1)

    idx, count = step(*on(platform, batch))
    assert_same(idx, batch)
    np.testing.assert_array_equal(np.asarray(count), np.minimum(batch.seq_lens, K))


def launches(jaxpr: str) -> int:
    """Kernel calls in a jaxpr: it holds each call once per platform branch (the GPU form takes an
    XLA scratch output, the CPU form none; jax_ops._local_call), so count the CPU form's."""
    cpu_form = re.findall(r"\bi32\[[\d,]*\] = ffi_call\[", jaxpr)
    assert len(cpu_form) * 2 == jaxpr.count("ffi_call["), jaxpr
    return len(cpu_form)


def test_vmap_with_shared_cache_folds_into_the_batch(platform):
    """Two requests of 4 rows sharing one page pool: one launch of 8 rows, same bytes as 2 calls."""
    a = make_batch(LENS, seed=5, spare_pages=3)
    q, k, w, s, bt = on(platform, a)
    qs, ws, ss, bts = (jnp.stack([x, x[::-1]]) for x in (q, w, s, bt))
    fn = jax.jit(jax.vmap(lambda q_, w_, s_, t_: ffi_dsa.topk_indexer(q_, k, w_, s_, t_, topk=K)))
    jaxpr = str(jax.make_jaxpr(fn)(qs, ws, ss, bts))
    assert launches(jaxpr) == 1 and "i32[8,16] = ffi_call" in jaxpr
    assert "while[" not in jaxpr and "scan[" not in jaxpr
    got = np.asarray(fn(qs, ws, ss, bts))
    assert got.shape == (2, 4, K)
    want = call_result(a, K, device=torch_device(platform))
    np.testing.assert_array_equal(got[0], want)
    np.testing.assert_array_equal(got[1], want[::-1])
    # only q batched; others broadcast
    got_q = np.asarray(jax.vmap(lambda q_: ffi_dsa.topk_indexer(q_, k, w, s, bt, topk=K))(qs))
    np.testing.assert_array_equal(got_q[0], want)


def test_vmap_with_batched_cache_runs_each_element(platform):
    a, b = make_batch(LENS, seed=6, spare_pages=3), make_batch(LENS, seed=7, spare_pages=3)
    stacked = [jnp.stack(pair) for pair in zip(on(platform, a), on(platform, b))]
    fn = jax.jit(jax.vmap(lambda *x: ffi_dsa.topk_indexer(*x, topk=K)))
    assert "i32[4,16] = ffi_call" in str(jax.make_jaxpr(fn)(*stacked))  # per element, in a loop
    got = np.asarray(fn(*stacked))
    np.testing.assert_array_equal(got[0], call_result(a, K, device=torch_device(platform)))
    np.testing.assert_array_equal(got[1], call_result(b, K, device=torch_device(platform)))


def test_empty_batch(platform):
    args = on(platform, make_batch([]))
    assert jitted(*args, topk=K).shape == (0, K)
    stacked_q = jnp.stack([args[0]] * 3)
    assert jax.vmap(lambda q: ffi_dsa.topk_indexer(q, *args[1:], topk=K))(stacked_q).shape == (3, 0, K)


@pytest.mark.parametrize("index, edit, error, match", [
    (2, lambda x: x.astype(jnp.float16), TypeError, "weights must be float32"),
    (0, lambda x: x.astype(jnp.float32), TypeError, "q_index_fp8"),
    (0, lambda x: x.astype(jnp.complex64), TypeError, "q_index_fp8"),
    (1, lambda x: x[..., :100], ValueError, "k_index_cache_fp8"),
    (4, lambda x: x[:2], ValueError, "block_table"),
    (3, lambda x: x[:, None, None], ValueError, "seq_lens must have rank 1"),  # [B, 1] is N = 1's [B, N]
    (3, lambda x: jnp.stack([x] * 2, axis=1), ValueError, "seq_lens dimension 1"),  # [B, 2] for N = 1
])
def test_errors_raise_before_xla(platform, index, edit, error, match):
    args = on(platform, make_batch(LENS, seed=8))
    args[index] = edit(args[index])
    with pytest.raises(error, match=match):
        ffi_dsa.topk_indexer(*args, topk=K)
    with pytest.raises(error, match=match):
        jitted(*args, topk=K)


def test_topk_errors(platform):
    args = on(platform, make_batch(LENS, seed=9))
    with pytest.raises(ValueError, match="^topk must be <= 2048"):
        jitted(*args, topk=4096)
    with pytest.raises(ValueError, match="topk must be >= 0"):
        jitted(*args, topk=-1)
    with pytest.raises(TypeError, match="static"):
        jax.jit(ffi_dsa.topk_indexer)(*args, topk=K)


def test_shape_check_is_the_cpp_one():
    """The Python side has no checks of its own: check_shapes forwards to the exported C++."""
    jax_ops.check_shapes.cache_clear()
    dtypes = ("float8_e4m3fn", "int8", "float32", "int32", "int32")
    heads = rf"\(H, index heads\) must be {NUM_HEADS} or {NUM_HEADS_NARROW}"
    with pytest.raises(ValueError, match=rf"^q \(q_index_fp8\) dimension 1 {heads}"):
        jax_ops.check_shapes(decode.OP, ((2, 63, 128), (3, 64, 1, 132), (2, 64), (2,), (2, 3)), dtypes, K)
    with pytest.raises(ValueError, match=rf"^q \(q_index_fp8\) dimension 2 {heads}"):
        jax_ops.check_shapes(decode.OP, ((2, 2, 63, 128), (3, 64, 1, 132), (2, 2, 64), (2,), (2, 3)), dtypes, K)
    n = MAX_QUERIES + 1
    too_many = rf"^q \(q_index_fp8\) dimension 1 \(N, query tokens per row\) must be in 1..{MAX_QUERIES}"
    with pytest.raises(ValueError, match=too_many):
        jax_ops.check_shapes(decode.OP, ((2, n, 64, 128), (3, 64, 1, 132), (2, n, 64), (2,), (2, 3)), dtypes, K)
    # the output shape check_shapes hands C++ is the one the call will have: valid MTP shapes pass
    jax_ops.check_shapes(decode.OP, ((2, 2, 32, 128), (3, 64, 1, 132), (4, 32), (2, 2), (2, 3)), dtypes, K)


# ---- several query tokens per row (MTP) and 32 heads: docs/contract.md §7 ---------------------

def torch_platform_result(batch, platform, topk=K, sorted=False):
    return call_result(batch, topk, sorted=sorted, device=torch_device(platform))


@pytest.mark.parametrize("sorted_", [False, True])
@pytest.mark.parametrize("form", FORMS)
def test_mtp_eager_and_jit(platform, form, sorted_):
    """[B, N, K] for a rank-4 q ([B, K] for rank 3), eager and under jit: the bytes of ffi_dsa.call
    and of the reference."""
    batch = mtp_batch(form, seed=50)
    args = on(platform, batch)
    for name, got in (("eager", ffi_dsa.topk_indexer(*args, topk=K, sorted=sorted_)),
                      ("jit", jitted(*args, topk=K, sorted=sorted_))):
        assert got.shape == batch.output_shape(K), name
        np.testing.assert_array_equal(np.asarray(got), torch_platform_result(batch, platform, sorted=sorted_))
        assert_exact(got, batch, K, sorted=sorted_, name=name)


def test_mtp_weights_as_query_rows(platform):
    """weights [B * N, H] hold the bytes of [B, N, H]: the same result."""
    batch = mtp_batch(Form(2, NUM_HEADS_NARROW), seed=51)
    q, k, w, s, bt = on(platform, batch)
    assert_exact(jitted(q, k, w.reshape(-1, w.shape[-1]), s, bt, topk=K), batch, K)


@pytest.mark.parametrize("form", [Form(2, NUM_HEADS), Form(MAX_QUERIES, NUM_HEADS_NARROW, per_query_lens=True)],
                         ids=lambda f: f.id)
@pytest.mark.parametrize("weights_rows", [False, True], ids=["weights_BNH", "weights_BxN_H"])
def test_mtp_vmap_with_shared_cache_folds_into_the_batch(platform, form, weights_rows):
    """vmap over a leading axis of rank-4 inputs (both seq_lens forms, both weights forms): one launch
    of V * B rows of N queries, and each element the bytes of its own call."""
    batch = mtp_batch(form, seed=52)
    q, k, w, s, bt = on(platform, batch)
    qs, ws, ss, bts = (jnp.stack([x, x[::-1]]) for x in (q, w, s, bt))
    if weights_rows:
        ws = ws.reshape(2, -1, ws.shape[-1])  # [2, B * N, H]: the same bytes
    fn = jax.jit(jax.vmap(lambda q_, w_, s_, t_: ffi_dsa.topk_indexer(q_, k, w_, s_, t_, topk=K)))
    jaxpr = str(jax.make_jaxpr(fn)(qs, ws, ss, bts))
    rows, n = 2 * len(batch.seq_lens), form.queries
    assert launches(jaxpr) == 1 and f"i32[{rows},{n},{K}] = ffi_call" in jaxpr, jaxpr
    got = np.asarray(fn(qs, ws, ss, bts))
    assert got.shape == (2, *batch.output_shape(K))
    want = torch_platform_result(batch, platform)
    assert_exact(got[0], batch, K)
    np.testing.assert_array_equal(got[0], want)
    np.testing.assert_array_equal(got[1], want[::-1])


def test_mtp_vmap_with_batched_cache_runs_each_element(platform):
    a, b = (mtp_batch(Form(2, NUM_HEADS, per_query_lens=True), seed=s) for s in (53, 54))
    stacked = [jnp.stack(pair) for pair in zip(on(platform, a), on(platform, b))]
    fn = jax.jit(jax.vmap(lambda *x: ffi_dsa.topk_indexer(*x, topk=K)))
    got = np.asarray(fn(*stacked))
    assert_exact(got[0], a, K)
    assert_exact(got[1], b, K)


def test_mtp_empty_batch(platform):
    args = on(platform, mtp_batch(Form(2, NUM_HEADS), [], seed=55))
    assert jitted(*args, topk=K).shape == (0, 2, K)


@pytest.mark.parametrize("index, edit, match", [
    (0, lambda x: jnp.concatenate([x, x[:, :1]] * 2, axis=1), r"^q \(q_index_fp8\) dimension 1 \(N"),  # N = 5
    (2, lambda x: x[:, :1], "weights dimension 1"),
    (3, lambda x: jnp.stack([x] * 3, axis=1), "seq_lens dimension 1"),
])
def test_mtp_errors_raise_before_xla(platform, index, edit, match):
    args = on(platform, mtp_batch(Form(2, NUM_HEADS), seed=56))
    args[index] = edit(args[index])
    with pytest.raises(ValueError, match=match):
        jitted(*args, topk=K)


def test_example_decode_runs(platform, capsys):
    """integration/example_jax_decode.py: the indexer inside a jitted step, every step checked."""
    example_jax_decode = load_script("integration/example_jax_decode.py")
    rc = example_jax_decode.main(["--platform", platform, "--steps", "2", "--batch", "3", "--context", "200",
                                  "--topk", "64"])
    assert rc == 0, capsys.readouterr().out
    assert capsys.readouterr().out.count("rows ok: True") == 2
