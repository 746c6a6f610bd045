"""Options that are switches take switches: ``sorted``, ``validate`` and the bool options of the
framework modules accept Python and numpy bools only, on every entry point, and anything else is a
TypeError naming the option and the type it got, raised before anything is written (truthiness
would read ``"no"`` as True). ``validate=True`` on traced JAX arrays says what to do instead."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ffi_dsa
from ffi_dsa import _arrays
from ffi_dsa.prefill_workloads import make_prefill_batch
from ffi_dsa.workloads import make_batch

from conftest import SENTINEL, poisoned, poisoned_np

NOT_BOOLS = ["no", "", 1, 0, None, 1.0, [True], np.int32(1), np.array([True])]
K = 64


def _kind(value) -> str:
    """How the message spells the type of `value`."""
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _raises_naming(option: str, value):
    return pytest.raises(TypeError, match=rf"^{option} must be a bool \(True or False\), got {_kind(value)}")


@pytest.mark.parametrize("value", NOT_BOOLS, ids=repr)
def test_strict_bool_refuses_everything_but_bools(value):
    with _raises_naming("sorted", value):
        _arrays._strict_bool("sorted", value)


@pytest.mark.parametrize("value", [True, False, np.True_, np.False_, np.bool_(1)], ids=repr)
def test_strict_bool_takes_python_and_numpy_bools(value):
    got = _arrays._strict_bool("validate", value)
    assert type(got) is bool and got == bool(value)


@pytest.mark.parametrize("option", ["sorted", "validate"])
@pytest.mark.parametrize("value", NOT_BOOLS, ids=repr)
def test_decode_entry_points_refuse_a_non_bool(option, value):
    batch = make_batch([300, 70], seed=500)
    out = poisoned_np((2, K))
    with _raises_naming(option, value):
        ffi_dsa.call(*batch.args(), out, **{option: value})
    assert (out == SENTINEL).all(), f"{option}={value!r} wrote the output"
    with _raises_naming(option, value):
        ffi_dsa.topk_indexer(*batch.args(), topk=K, **{option: value})


@pytest.mark.parametrize("option", ["sorted", "validate"])
@pytest.mark.parametrize("value", ["no", 1, None], ids=repr)
def test_prefill_entry_points_refuse_a_non_bool(option, value):
    chunk = make_prefill_batch([300, 100], queries=[8, 4], seed=501)
    out = poisoned_np((chunk.rows, K))
    with _raises_naming(option, value):
        ffi_dsa.prefill_call(*chunk.args(), out, **{option: value})
    assert (out == SENTINEL).all(), f"{option}={value!r} wrote the output"
    with _raises_naming(option, value):
        ffi_dsa.prefill_topk_indexer(*chunk.args(), topk=K, **{option: value})


def test_numpy_bools_are_the_bools_they_hold():
    batch = make_batch([300, 70], seed=502)
    for value in (True, False):
        expected = ffi_dsa.topk_indexer(*batch.args(), topk=K, sorted=value, validate=value)
        got = ffi_dsa.topk_indexer(*batch.args(), topk=K, sorted=np.bool_(value), validate=np.bool_(value))
        np.testing.assert_array_equal(got, expected)
    assert not np.array_equal(ffi_dsa.topk_indexer(*batch.args(), topk=K, sorted=True),
                              ffi_dsa.topk_indexer(*batch.args(), topk=K, sorted=False)), "the orders must differ"


def test_the_torch_ops_take_sorted_as_torch_takes_a_bool():
    """The schema's ``bool sorted``: torch converts before the kernel runs, as for any torch op's bool
    (docs/callers.md): a str is torch's RuntimeError naming the argument; an int is its truth value."""
    args = make_batch([300, 70], seed=503).to_torch("cpu")
    out = poisoned((2, K))
    with pytest.raises(RuntimeError, match="'sorted'"):
        torch.ops.dsa.topk_indexer_out(*args, out, sorted="no")
    with pytest.raises(RuntimeError, match="'sorted'"):
        torch.ops.dsa.topk_indexer(*args, topk=K, sorted="no")
    assert (out == SENTINEL).all()
    assert torch.equal(torch.ops.dsa.topk_indexer(*args, topk=K, sorted=1),
                       torch.ops.dsa.topk_indexer(*args, topk=K, sorted=True))


@pytest.mark.parametrize("option", ["sorted", "validate"])
def test_jax_refuses_a_non_bool(option):
    jnp = pytest.importorskip("jax.numpy")
    pytest.importorskip("jax_tvm_ffi")
    batch = make_batch([300, 70], seed=504)
    q = jnp.asarray(batch.q).view(jnp.float8_e4m3fn)
    with _raises_naming(option, "no"):
        ffi_dsa.topk_indexer(q, *map(jnp.asarray, batch.args()[1:]), topk=K, **{option: "no"})


def test_jax_validate_on_traced_arrays_says_what_to_do():
    jax = pytest.importorskip("jax")
    pytest.importorskip("jax_tvm_ffi")
    import jax.numpy as jnp

    batch = make_batch([300, 70], seed=505)
    q = jnp.asarray(batch.q).view(jnp.float8_e4m3fn)
    rest = list(map(jnp.asarray, batch.args()[1:]))
    step = jax.jit(lambda *a: ffi_dsa.topk_indexer(*a, topk=K, validate=True))
    with pytest.raises(ValueError, match=r"^validate=True reads the inputs' values on the host, but .*traced") as err:
        step(q, *rest)
    assert "ffi_dsa.validate_pages(k_cache, seq_lens, block_table)" in str(err.value)
    assert "validate=False" in str(err.value)
    # what it says to do works: validate the concrete arrays, then the jitted step without validate
    ffi_dsa.validate_pages(*rest[0:1], *rest[2:])
    eager = ffi_dsa.topk_indexer(q, *rest, topk=K, validate=True)
    jitted = jax.jit(lambda *a: ffi_dsa.topk_indexer(*a, topk=K))(q, *rest)
    np.testing.assert_array_equal(np.asarray(jitted), np.asarray(eager))
    chunk = make_prefill_batch([300, 100], queries=[8, 4], seed=506)
    args = [jnp.asarray(a) for a in chunk.args()]
    with pytest.raises(ValueError, match=r"ffi_dsa\.validate_prefill\(k, ks, ke\)"):
        jax.jit(lambda *a: ffi_dsa.prefill_topk_indexer(*a, topk=K, validate=True))(*args)


def test_the_framework_modules_bool_options_are_strict():
    pytest.importorskip("jax_tvm_ffi")
    import jax

    from ffi_dsa import decode, jax_distributed, tvm_relax

    with _raises_naming("sorted", "yes"):
        tvm_relax.global_name(decode.OP, sorted="yes")
    assert tvm_relax.global_name(decode.OP, sorted=np.True_) == "ffi_dsa.topk_indexer_sorted"
    mesh = jax.sharding.Mesh(np.array(jax.devices("cpu")[:1]), (jax_distributed.AXIS,))
    with _raises_naming("shared_pool", "no"):
        jax_distributed.data_parallel_topk(mesh, K, shared_pool="no")
    with _raises_naming("sorted", 1):
        jax_distributed.data_parallel_topk(mesh, K, sorted=1)


def test_the_relax_modules_bool_options_are_strict():
    pytest.importorskip("tvm", reason="the Relax module needs apache-tvm")
    from ffi_dsa import tvm_relax

    with _raises_naming("with_max_seq_len", 1):
        tvm_relax.indexer_module(with_max_seq_len=1)
    with _raises_naming("sorted", "no"):
        tvm_relax.prefill_module(sorted="no")


def test_the_reference_and_its_checks_take_bools_only():
    batch = make_batch([300, 70], seed=507)
    chunk = make_prefill_batch([300, 100], queries=[8, 4], seed=508)
    idx = ffi_dsa.topk_indexer(*batch.args(), topk=K)
    with _raises_naming("sorted", "no"):
        ffi_dsa.check_topk(idx, *batch.args(), sorted="no")
    with _raises_naming("sorted", 1):
        ffi_dsa.reference(*batch.args(), topk=K, sorted=1)
    with _raises_naming("sorted", "no"):
        ffi_dsa.check_prefill_topk(ffi_dsa.prefill_topk_indexer(*chunk.args(), topk=K), *chunk.args(), sorted="no")
    with _raises_naming("sorted", None):
        ffi_dsa.reference_prefill(*chunk.args(), topk=K, sorted=None)
    assert ffi_dsa.check_topk(idx, *batch.args(), sorted=np.False_) == []

