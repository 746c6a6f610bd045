"""JAX on several devices: the batch-partitioning rule of the XLA FFI call, and helpers for shard_map.

Rows are independent and every argument but the cache is per row, so a batch split over devices is
one local call per device on its own rows, with the whole (replicated) cache:

* Plain ``jax.jit``: ``jax_ops`` wraps each op's call in ``custom_partitioning`` with the rule
  below. The batch dimension (dim 0 of the per-row operands, ``Op.row_args``: decode's q, weights,
  seq_lens, block_table; prefill's q, weights, ks, ke; and of the output) keeps the sharding of its
  operands; every other dimension, and the whole cache (prefill: k and k_scale), is replicated. So
  batch-sharded inputs give one local call per device and a batch-sharded output, with no
  collective. A cache sharded by pages is all-gathered first (the block table holds global page ids
  there, and a row may name any page): page-local pools belong in ``shard_map``, below.
* A user's ``jax.shard_map``: the call inside is already per device (JAX inlines the local call).
  With the cache sharded by pages too (``in_specs`` ``P(axis)`` for it), each device's block table
  holds page ids into its own shard and the ids returned are local ones (``local page * 64 + slot``),
  which is what a sparse-attention kernel reading that device's pool wants; ``global_ids`` turns
  them into ids of the concatenated pool. (With ``ids="positions"`` the ids are positions in each
  row, the same whatever pool holds its pages.)
* B not divisible by the device count: JAX refuses such a sharding at the jit boundary, so either
  the rows are padded up front (``pad_rows``: extra rows of length 0, whose output rows are all -1,
  sliced off afterwards; the way in for jit arguments and for shard_map), or a batch sharding
  constraint inside a jit lets XLA pad the shards itself: the rule then gives the padding rows
  length 0 so they cost nothing, and the padded rows never reach the result.
* Replicated batch operands: every device runs the whole batch (the rule never gathers; it only
  keeps what the operands have).
* Several query tokens per row (q ``[B, N, H, 128]``, docs/contract.md §7): the split is still over
  B only; N, H and the N of seq_lens ``[B, N]`` are replicated like any other dimension. Weights in
  their ``[B * N, H]`` form have no B dimension, so such a call runs whole on every device; the
  ``[B, N, H]`` form (the same bytes) keeps the split.

Shardy (JAX's default partitioner) uses the ``sharding_rule``; the older GSPMD partitioner uses
``infer_sharding_from_operands``. Both end in ``_partition``, which picks the local call.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.interpreters import mlir
from jax.sharding import NamedSharding, PartitionSpec as P

from .contract import PAGE_TOKENS


def _shape(ir_type) -> list[int]:  # the rule callback receives MLIR types, not avals
    return list(mlir.ir.RankedTensorType(ir_type).shape)


def _sharding_rule_for(row_args):
    """Einsum-like rule: factor ``b`` is dim 0 of the per-row operands (positions `row_args`) and of
    the output; every other dimension (the cache's included) is its own factor that must stay
    replicated. An operand whose dim 0 is not B (a ``[B * N, H]`` weights form) gets no ``b``: the
    partition then runs the call whole (``_batch_axes``)."""
    def rule(mesh, value_types, result_types):
        del mesh
        shapes = [_shape(t) for t in (*value_types, result_types[0])]
        batch = shapes[0][0] if shapes[0] else None
        names, replicated = [], []
        for i, shape in enumerate(shapes):
            dims = [f"a{i}d{j}" for j in range(len(shape))]
            if (i in row_args or i == len(value_types)) and dims and shape[0] == batch:
                dims[0] = "b"
            replicated += [d for d in dims if d != "b"]
            names.append(" ".join(dims))
        rule_text = f"{', '.join(names[:-1])} -> {names[-1]}"
        return rule_text, {"need_replication_factors": tuple(replicated)}
    return rule


def _batch_axes(arg_shapes, result_shape, row_args):
    """The mesh axes dim 0 of the batch operands is sharded over (None: replicated), or None when
    an operand's dim 0 is not the batch (such a call is run replicated, whole)."""
    batch = arg_shapes[0].shape[0] if arg_shapes[0].shape else None
    rows = [arg_shapes[i] for i in row_args] + [result_shape]
    if batch is None or any(not r.shape or r.shape[0] != batch for r in rows):
        return None
    for r in rows:
        spec = getattr(r.sharding, "spec", None)
        if spec and spec[0] is not None:
            return spec[0]
    return None


def _replicate_rest(mesh, axes, ndim: int, row: bool) -> NamedSharding:
    return NamedSharding(mesh, P(axes if row else None, *([None] * (ndim - 1))))


def _rows_emptied(operands, valid, length_args):
    """The operands with the rows where `valid` is False made empty: their length operands (decode's
    seq_lens, prefill's ks and ke) zeroed, so they cost nothing and the kernel reads nothing of theirs."""
    out = list(operands)
    for i in length_args:
        x = out[i]
        mask = valid.reshape(valid.shape[0], *([1] * (x.ndim - 1)))  # seq_lens [B] or [B, N]
        out[i] = jnp.where(mask, x, 0).astype(x.dtype)
    return out


def batch_partitioned(local_call, row_args, length_args):
    """``local_call(*operands)`` wrapped so that XLA's partitioner runs it once per device on that
    device's rows (module docstring). `row_args`: the positions of the per-row operands (the others
    are replicated); `length_args`: those that say how long a row is, zeroed in the rows XLA pads a
    shard with, for a batch that does not divide by the shards."""

    @custom_partitioning
    def op(*operands):
        return local_call(*operands)

    def partition(mesh, arg_shapes, result_shape):
        axes = _batch_axes(arg_shapes, result_shape, row_args)
        arg_shardings = tuple(_replicate_rest(mesh, axes, len(a.shape), i in row_args)
                              for i, a in enumerate(arg_shapes))
        out_sharding = _replicate_rest(mesh, axes, len(result_shape.shape), True)
        batch = arg_shapes[0].shape[0]
        names = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
        shards = math.prod(mesh.shape[a] for a in names)
        if batch % shards == 0:
            return mesh, local_call, out_sharding, arg_shardings
        per_shard = -(-batch // shards)

        def lower(*operands):
            # The rows XLA pads the last shards with may hold any values: emptied, they cost nothing.
            row = jax.lax.axis_index(names) * per_shard + jnp.arange(per_shard, dtype=jnp.int32)
            return local_call(*_rows_emptied(operands, row < batch, length_args))

        return mesh, lower, out_sharding, arg_shardings

    def infer_sharding_from_operands(mesh, arg_shapes, result_shape):
        return _replicate_rest(mesh, _batch_axes(arg_shapes, result_shape, row_args), len(result_shape.shape), True)

    op.def_partition(partition, infer_sharding_from_operands=infer_sharding_from_operands,
                     sharding_rule=_sharding_rule_for(row_args))
    return op


def pad_rows(q, weights, seq_lens, block_table, multiple: int):
    """The per-row operands with rows of length 0 appended so that B is a multiple of
    ``multiple`` (e.g. the device count). Those rows' output is all -1: slice ``[:B]``."""
    batch = q.shape[0]
    extra = -batch % multiple
    if extra == 0:
        return q, weights, seq_lens, block_table

    def pad(x):  # dim 0 holds a whole number of entries per row (N of them for weights [B * N, H])
        rows = extra * (x.shape[0] // batch)
        return jnp.concatenate([x, jnp.zeros((rows, *x.shape[1:]), x.dtype)])

    return pad(q), pad(weights), pad(seq_lens), pad(block_table)


def global_ids(local_ids, pages_per_shard: int, axis):
    """Inside ``shard_map`` with the cache sharded by pages over ``axis``: local token ids
    (``local page * 64 + slot``, ``ids="slots"``) -> ids into the concatenated pool; -1 stays -1."""
    offset = jax.lax.axis_index(axis) * (pages_per_shard * PAGE_TOKENS)
    return jnp.where(local_ids >= 0, local_ids + offset.astype(local_ids.dtype), local_ids)


__all__ = ["batch_partitioned", "pad_rows", "global_ids"]
