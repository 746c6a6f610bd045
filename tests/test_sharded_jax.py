"""JAX on several devices: batch-sharded jit (custom_partitioning) and a user's shard_map.

The cases need 4 JAX CPU devices, which only exist when XLA_FLAGS asks for them before JAX starts
its CPU backend. In an ordinary pytest run (one device, the backend already started by other
modules) ``test_cases_in_a_4_device_process`` runs this very file again in a fresh interpreter
with ``--xla_force_host_platform_device_count=4`` and requires every case to pass there; the cases
(``TestFourDevices``) are not collected here. With the flag already set, they run directly.

Every result is compared byte for byte with ``ffi_dsa.call`` (numpy) on the unsharded inputs, and
the compiled HLO is checked for collectives: a batch split over devices must be one local call per
device with no all-gather / all-to-all of the batch operands or of the output.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with torch tests
jax = pytest.importorskip("jax")
pytest.importorskip("jax_tvm_ffi")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from ffi_dsa.contract import MAX_QUERIES, NUM_HEADS, NUM_HEADS_NARROW  # noqa: E402
import ffi_dsa  # noqa: E402
from ffi_dsa import decode, jax_ops, jax_sharding, prefill  # noqa: E402
from ffi_dsa.prefill_workloads import make_prefill_batch  # noqa: E402
from ffi_dsa.workloads import make_batch  # noqa: E402

from conftest import assert_exact, call_result, script_env  # noqa: E402
from mtp_batches import Form, mtp_batch  # noqa: E402

DEVICES = 4
K = 16
ON_4 = len(jax.devices("cpu")) >= DEVICES


def _jax_gpus():
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


GPUS = _jax_gpus()
MTP_FORMS = [Form(2, NUM_HEADS), Form(MAX_QUERIES, NUM_HEADS_NARROW, per_query_lens=True)]
COLLECTIVE = re.compile(r"= (\w+\[[\d,]*\])\S* (all-gather|all-to-all|collective-permute|all-reduce|reduce-scatter)"
                        r"(-start)?\(")
# (on the GPU the call also returns its XLA scratch: "(s32[4,16]{1,0}, u8[1024]{0}) custom-call(")
LOCAL_CALL = re.compile(r"= \(?(s32\[[\d,]*\])\S*?(?:, u8\[\d+\]\S*\))? custom-call\([^\n]*custom_call_target=\""
                        + jax_ops.target(decode.OP))
jitted = jax.jit(ffi_dsa.topk_indexer, static_argnames=("topk", "sorted"))


def test_cases_in_a_4_device_process(tmp_path):
    if ON_4:
        pytest.skip("this process has the devices: TestFourDevices runs here")
    flags = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={DEVICES}"
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__).resolve()),
         "-k", "TestFourDevices"],
        cwd=tmp_path, env={**script_env(), "XLA_FLAGS": flags.strip()},
        capture_output=True, text=True, timeout=300)
    summary = child.stdout.strip().splitlines()[-1] if child.stdout.strip() else ""
    print(f"4-device subprocess: {summary}")
    assert child.returncode == 0, child.stdout[-6000:] + child.stderr[-3000:]
    assert re.search(r"\d+ passed", summary) and not re.search(r"failed|skipped|error", summary), summary


def mesh_of(shape=(DEVICES,), names=("x",), devices=None) -> Mesh:
    devices = jax.devices("cpu") if devices is None else devices
    return Mesh(np.array(devices[:math.prod(shape)]).reshape(shape), names)


def jax_args(batch):
    q, *rest = batch.args()
    return [jnp.asarray(q).view(jnp.float8_e4m3fn), *map(jnp.asarray, rest)]


def put(mesh, args, specs):
    return [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, specs)]


def batch_specs(axes=("x",), cache=P()):
    row = P(axes if len(axes) > 1 else axes[0])
    return [row, cache, row, row, row]


def hlo(fn, *args) -> str:
    return fn.lower(*args).compile().as_text()


def collectives(text: str) -> list[tuple[str, str]]:
    """(result shape, kind) of every collective in compiled HLO."""
    return [(m.group(1), m.group(2)) for m in COLLECTIVE.finditer(text)]


def local_calls(text: str) -> list[str]:
    """Output shapes of the kernel's custom calls in compiled (per-device) HLO."""
    return LOCAL_CALL.findall(text)


def lens(batch_size: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.integers(0, 400, size=batch_size)]


def page_local_pools(seed: int):
    """Per device, 2 rows and a pool of its own pages, padded to a common page count, and the same
    rows as one unsharded batch over the concatenated pools (page ids offset by device)."""
    parts = [make_batch(lens(2, seed + d), seed=seed + d, max_pages=7) for d in range(DEVICES)]
    pages = max(p.k_cache.shape[0] for p in parts) + 1
    caches, tables_local, tables_global = [], [], []
    for d, p in enumerate(parts):
        pad = np.zeros((pages - p.k_cache.shape[0], *p.k_cache.shape[1:]), p.k_cache.dtype)
        caches.append(np.concatenate([p.k_cache, pad]))
        tables_local.append(p.block_table)
        tables_global.append(np.where(p.block_table >= 0, p.block_table + d * pages, -1).astype(np.int32))
    cat = lambda xs: np.concatenate(xs)  # noqa: E731
    whole = type(parts[0])(cat([p.q for p in parts]), cat(caches), cat([p.weights for p in parts]),
                           cat([p.seq_lens for p in parts]), cat(tables_global))
    return whole, cat(tables_local), pages


def test_sharding_rule_shares_b_only_among_dims_of_size_b():
    """dim 0 of q, seq_lens, block_table and the output is the factor b; the cache and a
    weights operand whose dim 0 is not B (a [B * N, H] form) stay replicated."""
    from jax.interpreters import mlir

    with mlir.ir.Context(), mlir.ir.Location.unknown():
        i32 = mlir.ir.IntegerType.get_signless(32)

        def t(*shape):
            return mlir.ir.RankedTensorType.get(shape, i32)

        rule, extra = jax_sharding._sharding_rule_for(decode.OP.row_args)(None, [t(4, 64, 128), t(9, 64, 1, 132), t(8, 64), t(4), t(4, 3)],
                                                  [t(4, 16)])
    assert rule == "b a0d1 a0d2, a1d0 a1d1 a1d2 a1d3, a2d0 a2d1, b, b a4d1 -> b a5d1"
    assert "b" not in extra["need_replication_factors"] and "a2d0" in extra["need_replication_factors"]

    with mlir.ir.Context(), mlir.ir.Location.unknown():
        i32 = mlir.ir.IntegerType.get_signless(32)

        def t(*shape):
            return mlir.ir.RankedTensorType.get(shape, i32)

        # q [B, N, H, 128], weights [B, N, H], seq_lens [B, N], output [B, N, K]: b is dim 0 only
        rule, _ = jax_sharding._sharding_rule_for(decode.OP.row_args)(None, [t(4, 2, 32, 128), t(9, 64, 1, 132), t(4, 2, 32), t(4, 2),
                                                     t(4, 3)], [t(4, 2, 16)])
    assert rule == ("b a0d1 a0d2 a0d3, a1d0 a1d1 a1d2 a1d3, b a2d1 a2d2, b a3d1, b a4d1 -> b a5d1 a5d2")


@pytest.mark.cuda
@pytest.mark.parametrize("gpus", [2, 4], ids=["two_gpus", "four_gpus"])
@pytest.mark.parametrize("how", ["jit", "shard_map"])
@pytest.mark.parametrize("form", [None, Form(2, NUM_HEADS)], ids=["N1", "N2"])
def test_gpus_one_local_call_each(gpus, how, form):
    """The CPU cases' core on a mesh of 2 or 4 GPUs (skipped where the machine has fewer): 4 rows per
    GPU, no collective, the bytes of ffi_dsa.call on one GPU; also with N = 2 query tokens per row.
    On the GPU the call also takes its XLA scratch output (jax_ops._local_call)."""
    if len(GPUS) < gpus:
        pytest.skip(f"needs {gpus} JAX GPUs, found {len(GPUS)}")
    rows = 4 * gpus
    batch = make_batch(lens(rows, 11), seed=11) if form is None else mtp_batch(form, lens(rows, 11), seed=11)
    mesh = mesh_of((gpus,), ("x",), GPUS)
    args = put(mesh, jax_args(batch), batch_specs())
    if how == "jit":
        fn = jax.jit(lambda *a: ffi_dsa.topk_indexer(*a, topk=K))
    else:
        fn = jax.jit(jax.shard_map(lambda *a: ffi_dsa.topk_indexer(*a, topk=K), mesh=mesh,
                                   in_specs=tuple(batch_specs()), out_specs=P("x")))
    text = hlo(fn, *args)
    assert collectives(text) == []
    local_shape = "4," + (f"{K}" if form is None else f"{form.queries},{K}")
    assert local_calls(text) == [f"s32[{local_shape}]"]
    assert "u8[" in text.split("custom_call_target=\"" + jax_ops.target(decode.OP))[0].rsplit("\n", 1)[-1]  # its scratch
    np.testing.assert_array_equal(np.asarray(fn(*args)), call_result(batch, K, device="cuda"))


class TestFourDevices:
    """The cases: they need the 4 devices (module docstring)."""

    @pytest.mark.parametrize("partitioner", ["shardy", "gspmd"])
    @pytest.mark.parametrize("sorted_", [False, True])
    def test_jit_of_batch_sharded_inputs_is_one_local_call_per_device(self, partitioner, sorted_):
        batch = make_batch(lens(8, 1), seed=1)
        mesh = mesh_of()
        args = put(mesh, jax_args(batch), batch_specs())
        before = jax.config.jax_use_shardy_partitioner
        jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
        try:
            fn = jax.jit(lambda *a: ffi_dsa.topk_indexer(*a, topk=K, sorted=sorted_))
            text = hlo(fn, *args)
            got = fn(*args)
        finally:
            jax.config.update("jax_use_shardy_partitioner", before)
        assert collectives(text) == []
        assert local_calls(text) == [f"s32[2,{K}]"]
        assert got.sharding.spec[0] == "x"
        np.testing.assert_array_equal(np.asarray(got), call_result(batch, K, sorted=sorted_))

    @pytest.mark.parametrize("queries", [[20, 12], [15, 6]], ids=["divides", "padded_by_xla"])
    def test_prefill_rows_split_over_devices(self, queries):
        """Prefill under a jit over the mesh: q, weights, ks and ke split by rows, k and k_scale
        replicated: one local call per device, no collective of the operands, the bytes of the
        one-device call. 21 rows do not divide by 4: XLA pads the last shard with rows the rule empties."""
        chunk = make_prefill_batch([300, 900], queries=queries, seed=5)
        q, k, k_scale, weights, ks, ke = chunk.args()
        mesh = mesh_of()
        rows = len(ks)
        fn = jax.jit(lambda *a: ffi_dsa.prefill_topk_indexer(*a, topk=K))
        if rows % DEVICES:  # a sharding constraint inside the jit: JAX refuses such a split at its boundary
            row = NamedSharding(mesh, P("x"))
            fn = jax.jit(lambda q_, k_, s_, w_, ks_, ke_: ffi_dsa.prefill_topk_indexer(
                jax.lax.with_sharding_constraint(q_, row), k_, s_, jax.lax.with_sharding_constraint(w_, row),
                jax.lax.with_sharding_constraint(ks_, row), jax.lax.with_sharding_constraint(ke_, row), topk=K))
            args = [jnp.asarray(q).view(jnp.float8_e4m3fn), jnp.asarray(k).view(jnp.float8_e4m3fn),
                    *map(jnp.asarray, (k_scale, weights, ks, ke))]
        else:
            specs = [P("x"), P(), P(), P("x"), P("x"), P("x")]
            args = put(mesh, [jnp.asarray(q).view(jnp.float8_e4m3fn), jnp.asarray(k).view(jnp.float8_e4m3fn),
                              *map(jnp.asarray, (k_scale, weights, ks, ke))], specs)
        text = hlo(fn, *args)
        local = -(-rows // DEVICES)
        # (the padded case returns its result replicated: JAX cannot return an unevenly sharded array)
        gathered = [] if rows % DEVICES == 0 else [(f"s32[{local * DEVICES},{K}]", "all-gather")]
        assert collectives(text) == gathered
        assert re.findall(r"= (s32\[[\d,]*\])\S* custom-call\([^\n]*" + jax_ops.target(prefill.OP), text) == [f"s32[{local},{K}]"]
        want = np.full((rows, K), -7, np.int32)
        ffi_dsa.prefill_call(q, k, k_scale, weights, ks, ke, want)
        np.testing.assert_array_equal(np.asarray(fn(*args)), want)

    @pytest.mark.parametrize("how", ["jit", "shard_map"])
    def test_positions_and_a_bound_keep_the_split(self, how):
        """ids="positions" with a max_seq_len below the rows' lengths, batch-sharded under a jit and
        inside a shard_map: one local call per device, the bytes of ffi_dsa.call with the same options."""
        batch = make_batch([390, 5, 0, 300, 1, 399, 200, 64], seed=6)
        mesh = mesh_of()
        args = put(mesh, jax_args(batch), batch_specs())
        options = dict(topk=K, ids="positions", max_seq_len=128)
        if how == "jit":
            fn = jax.jit(lambda *a: ffi_dsa.topk_indexer(*a, **options))
        else:
            fn = jax.jit(jax.shard_map(lambda *a: ffi_dsa.topk_indexer(*a, **options), mesh=mesh,
                                       in_specs=tuple(batch_specs()), out_specs=P("x")))
        text = hlo(fn, *args)
        assert collectives(text) == []
        assert local_calls(text) == [f"s32[2,{K}]"]
        want = call_result(batch, K, ids="positions", max_seq_len=128)
        np.testing.assert_array_equal(np.asarray(fn(*args)), want)
        assert ffi_dsa.check_topk(want, *batch.args(), ids="positions") == []

    def test_only_q_sharded_the_other_row_operands_follow(self):
        batch = make_batch(lens(8, 2), seed=2)
        mesh = mesh_of()
        args = put(mesh, jax_args(batch), [P("x"), P(), P(), P(), P()])
        text = jitted.lower(*args, topk=K).compile().as_text()
        assert collectives(text) == []  # replicated rows are sliced locally, q never gathered
        assert local_calls(text) == [f"s32[2,{K}]"]
        np.testing.assert_array_equal(np.asarray(jitted(*args, topk=K)), call_result(batch, K))


    @pytest.mark.parametrize("axes, local_rows", [(("data",), 4), (("data", "model"), 2)])
    def test_two_axis_mesh(self, axes, local_rows):
        """Batch over one axis of a 2x2 mesh (replicated over the other), or over both."""
        batch = make_batch(lens(8, 3), seed=3)
        mesh = mesh_of((2, 2), ("data", "model"))
        args = put(mesh, jax_args(batch), batch_specs(axes))
        text = jitted.lower(*args, topk=K).compile().as_text()
        assert collectives(text) == []
        assert local_calls(text) == [f"s32[{local_rows},{K}]"]
        np.testing.assert_array_equal(np.asarray(jitted(*args, topk=K)), call_result(batch, K))


    def test_inside_a_larger_jitted_step_the_output_stays_sharded(self):
        batch = make_batch(lens(8, 4), seed=4)
        mesh = mesh_of()
        args = put(mesh, jax_args(batch), batch_specs())

        @jax.jit
        def step(q, k_cache, weights, seq_lens, block_table):
            idx = ffi_dsa.topk_indexer(q, k_cache, weights * 2.0, seq_lens, block_table, topk=K)
            return idx, (idx >= 0).sum(axis=1)

        text = step.lower(*args).compile().as_text()
        assert collectives(text) == []
        idx, count = step(*args)
        assert idx.sharding.spec[0] == "x" and count.sharding.spec[0] == "x"
        np.testing.assert_array_equal(np.asarray(idx), call_result(batch, K))
        np.testing.assert_array_equal(np.asarray(count), np.minimum(batch.seq_lens, K))


    def test_in_a_users_shard_map(self):
        batch = make_batch(lens(8, 5), seed=5)
        mesh = mesh_of()
        specs = batch_specs()
        args = put(mesh, jax_args(batch), specs)
        fn = jax.jit(jax.shard_map(lambda *a: ffi_dsa.topk_indexer(*a, topk=K), mesh=mesh,
                                   in_specs=tuple(specs), out_specs=P("x")))
        text = hlo(fn, *args)
        assert collectives(text) == []
        assert local_calls(text) == [f"s32[2,{K}]"]
        np.testing.assert_array_equal(np.asarray(fn(*args)), call_result(batch, K))


    def test_shard_map_with_page_local_pools(self):
        """Cache sharded by pages, each device's block table holding ids into its own pool: local ids
        out, and ``global_ids`` gives the bytes of the unsharded call over the concatenated pool."""
        whole, local_table, pages = page_local_pools(seed=10)
        mesh = mesh_of()
        q, k_cache, weights, seq_lens, _ = jax_args(whole)
        args = put(mesh, [q, k_cache, weights, seq_lens, jnp.asarray(local_table)], [P("x")] * 5)

        def per_device(q, k_cache, weights, seq_lens, block_table):
            local = ffi_dsa.topk_indexer(q, k_cache, weights, seq_lens, block_table, topk=K)
            return local, jax_sharding.global_ids(local, pages, "x")

        fn = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P("x"),) * 5, out_specs=(P("x"), P("x"))))
        text = hlo(fn, *args)
        assert collectives(text) == []
        local, global_ = map(np.asarray, fn(*args))
        want = call_result(whole, K)
        np.testing.assert_array_equal(global_, want)
        offsets = np.repeat(np.arange(DEVICES) * pages * 64, 2)[:, None]
        np.testing.assert_array_equal(local, np.where(want >= 0, want - offsets, -1))


    def test_plain_jit_with_a_page_sharded_cache_gathers_only_the_cache(self):
        """Under plain jit the block table holds global page ids, so a row may name any page: the rule
        asks for the whole cache (sound), and still gathers nothing of the batch."""
        whole, _, _ = page_local_pools(seed=20)
        mesh = mesh_of()
        args = put(mesh, jax_args(whole), batch_specs(cache=P("x")))
        text = jitted.lower(*args, topk=K).compile().as_text()
        assert {kind for _, kind in collectives(text)} == {"all-gather"}
        assert all(shape.startswith("s8[") for shape, _ in collectives(text)), collectives(text)
        assert local_calls(text) == [f"s32[2,{K}]"]
        np.testing.assert_array_equal(np.asarray(jitted(*args, topk=K)), call_result(whole, K))


    @pytest.mark.parametrize("batch_size", [6, 3])
    def test_b_not_divisible_pad_rows(self, batch_size):
        """pad_rows appends rows of length 0 up to a multiple of the device count; their output rows
        are all -1 and the first B rows are the unsharded call's bytes, under jit and shard_map."""
        batch = make_batch(lens(batch_size, 6), seed=6)
        mesh = mesh_of()
        q, k_cache, weights, seq_lens, block_table = jax_args(batch)
        padded = jax_sharding.pad_rows(q, weights, seq_lens, block_table, DEVICES)
        assert [x.shape[0] for x in padded] == [-(-batch_size // DEVICES) * DEVICES] * 4
        args = put(mesh, [padded[0], k_cache, *padded[1:]], batch_specs())
        want = call_result(batch, K)
        for fn in (jitted, jax.jit(jax.shard_map(lambda *a: ffi_dsa.topk_indexer(*a, topk=K), mesh=mesh,
                                                  in_specs=tuple(batch_specs()), out_specs=P("x")))):
            kwargs = {"topk": K} if fn is jitted else {}
            text = fn.lower(*args, **kwargs).compile().as_text()
            assert collectives(text) == []
            got = np.asarray(fn(*args, **kwargs))
            np.testing.assert_array_equal(got[:batch_size], want)
            assert (got[batch_size:] == -1).all()


    def test_b_not_divisible_sharding_constraint_inside_jit(self):
        """XLA pads the shards itself (2 rows each for 6 rows): one local call of 2 rows per device;
        the only collective is the gather of the result that the jit returns replicated (JAX cannot
        return an unevenly sharded array)."""
        batch = make_batch(lens(6, 7), seed=7)
        mesh = mesh_of()
        args = put(mesh, jax_args(batch), [P()] * 5)
        rows = NamedSharding(mesh, P("x"))

        @jax.jit
        def step(q, k_cache, weights, seq_lens, block_table):
            c = lambda a: jax.lax.with_sharding_constraint(a, rows)  # noqa: E731
            return ffi_dsa.topk_indexer(c(q), k_cache, c(weights), c(seq_lens), c(block_table), topk=K)

        text = step.lower(*args).compile().as_text()
        assert local_calls(text) == [f"s32[2,{K}]"]
        assert collectives(text) == [(f"s32[8,{K}]", "all-gather")]
        np.testing.assert_array_equal(np.asarray(step(*args)), call_result(batch, K))


    def test_replicated_inputs_run_the_whole_batch_on_every_device(self):
        batch = make_batch(lens(6, 8), seed=8)
        mesh = mesh_of()
        args = put(mesh, jax_args(batch), [P()] * 5)
        text = jitted.lower(*args, topk=K).compile().as_text()
        assert collectives(text) == []
        assert local_calls(text) == [f"s32[6,{K}]"]
        np.testing.assert_array_equal(np.asarray(jitted(*args, topk=K)), call_result(batch, K))


    @pytest.mark.parametrize("form", MTP_FORMS, ids=lambda f: f.id)
    def test_mtp_batch_sharded_is_one_local_call_per_device(self, form):
        """q [B, N, H, 128], weights [B, N, H], seq_lens [B] or [B, N]: split over B only, one local
        call of [2, N, K] per device, no collective."""
        batch = mtp_batch(form, lens(8, 12), seed=12)
        mesh = mesh_of()
        args = put(mesh, jax_args(batch), batch_specs())
        text = jitted.lower(*args, topk=K).compile().as_text()
        assert collectives(text) == []
        assert local_calls(text) == [f"s32[2,{form.queries},{K}]"]
        got = jitted(*args, topk=K)
        assert got.sharding.spec[0] == "x"
        assert_exact(got, batch, K)

    def test_mtp_weights_as_query_rows_run_whole(self):
        """weights [B * N, H] have no B dimension: the call runs whole on every device (correct bytes,
        the [B, N, H] form is the one that keeps the split)."""
        batch = mtp_batch(MTP_FORMS[0], lens(8, 13), seed=13)
        q, k_cache, weights, seq_lens, block_table = jax_args(batch)
        mesh = mesh_of()
        args = put(mesh, [q, k_cache, weights.reshape(-1, weights.shape[-1]), seq_lens, block_table],
                   batch_specs())
        text = jitted.lower(*args, topk=K).compile().as_text()
        assert local_calls(text) == [f"s32[8,{MTP_FORMS[0].queries},{K}]"]
        assert_exact(jitted(*args, topk=K), batch, K)

    @pytest.mark.parametrize("form", MTP_FORMS, ids=lambda f: f.id)
    def test_mtp_b_not_divisible(self, form):
        """pad_rows with N queries per row (weights in both forms), and XLA's own padding of a sharding
        constraint inside a jit (its padding rows get length 0 in either seq_lens form)."""
        batch = mtp_batch(form, lens(6, 14), seed=14)
        mesh = mesh_of()
        q, k_cache, weights, seq_lens, block_table = jax_args(batch)
        for w in (weights, weights.reshape(-1, weights.shape[-1])):
            padded = jax_sharding.pad_rows(q, w, seq_lens, block_table, DEVICES)
            got = np.asarray(jitted(padded[0], k_cache, *padded[1:], topk=K))
            assert_exact(got[:6], batch, K)
            assert (got[6:] == -1).all() and got.shape[0] == 8
        rows = NamedSharding(mesh, P("x"))

        @jax.jit
        def step(q, k_cache, weights, seq_lens, block_table):
            c = lambda a: jax.lax.with_sharding_constraint(a, rows)  # noqa: E731
            return ffi_dsa.topk_indexer(c(q), k_cache, c(weights), c(seq_lens), c(block_table), topk=K)

        args = put(mesh, jax_args(batch), [P()] * 5)
        assert local_calls(step.lower(*args).compile().as_text()) == [f"s32[2,{form.queries},{K}]"]
        assert_exact(step(*args), batch, K)

    def test_empty_batch_sharded(self):
        batch = make_batch([], seed=9)
        mesh = mesh_of()
        args = put(mesh, jax_args(batch), batch_specs())
        assert jitted(*args, topk=K).shape == (0, K)


if not ON_4:  # the cases run in the 4-device subprocess; here they would only add skip lines
    del TestFourDevices
