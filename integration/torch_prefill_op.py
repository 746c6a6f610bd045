"""torch custom ops of the prefill indexer (docs/contract.md, prefill), registered as torch_op.py
registers decode's, by the low-level ``Library`` route (torch_op.py says why):

    torch.ops.dsa.prefill_topk_indexer(q, k, k_scale, weights, ks, ke, topk=2048, sorted=False,
                                       ids="relative") -> Tensor
    torch.ops.dsa.prefill_topk_indexer_out(q, k, k_scale, weights, ks, ke, topk_indices, sorted=False,
                                           ids="relative") -> ()

The functional op returns int32 ``[M, topk]`` on q's device; the out variant writes ``[M, K]`` in
place. Both have fake kernels (``torch.compile(fullgraph=True, dynamic=True)``, opcheck), and both
run on CPU and CUDA tensors (the CUDA call syncs nothing and allocates nothing but the functional
op's output, so it can be captured in a CUDA graph).
"""

from __future__ import annotations

import torch

from ..api import checked_topk
from ..contract import DEFAULT_TOPK
from ..prefill import ARG_NAMES, named_argument_error, absolute_ids, kernel_for
from .torch_op import register_pair, registered, same_device

NAMESPACE = "dsa"

_SCHEMA = (
    "prefill_topk_indexer(Tensor q, Tensor k, Tensor k_scale, Tensor weights, Tensor ks, Tensor ke, "
    f'int topk={DEFAULT_TOPK}, bool sorted=False, str ids="relative") -> Tensor'
)
_SCHEMA_OUT = (
    "prefill_topk_indexer_out(Tensor q, Tensor k, Tensor k_scale, Tensor weights, Tensor ks, Tensor ke, "
    'Tensor(a!) topk_indices, bool sorted=False, str ids="relative") -> ()'
)


def _output_shape(q, topk) -> tuple:
    """[M, topk]; a q of another rank still gets a shape, so that the C++ check names the mistake."""
    return (q.shape[0] if q.dim() else 0, topk)


# ---- real kernels (CPU and CUDA dispatch keys) ------------------------------------------------

def _prefill_kernel(q, k, k_scale, weights, ks, ke, topk=DEFAULT_TOPK, sorted=False, ids="relative"):
    absolute = absolute_ids(ids)
    if topk < 0:
        checked_topk(topk)
    try:
        # Dispatch on q's device: a mismatched argument reaches the C++ placement check.
        kernel = kernel_for(q.device.type)
        out = torch.empty(_output_shape(q, topk), dtype=torch.int32, device=q.device)
        kernel(q, k, k_scale, weights, ks, ke, out, sorted, absolute)
    except (TypeError, AttributeError) as err:  # the dispatcher lets None through for a Tensor
        raise named_argument_error(err, (q, k, k_scale, weights, ks, ke)) from None
    return out


def _prefill_out_kernel(q, k, k_scale, weights, ks, ke, topk_indices, sorted=False, ids="relative"):
    absolute = absolute_ids(ids)
    try:
        kernel_for(q.device.type)(q, k, k_scale, weights, ks, ke, topk_indices, sorted, absolute)
    except (TypeError, AttributeError) as err:
        raise named_argument_error(err, (q, k, k_scale, weights, ks, ke, topk_indices)) from None


# ---- fake (meta) kernels ---------------------------------------------------------------------

def _prefill_fake(q, k, k_scale, weights, ks, ke, topk=DEFAULT_TOPK, sorted=False, ids="relative"):
    absolute_ids(ids)
    if isinstance(topk, int):
        checked_topk(topk)
    same_device((q, k, k_scale, weights, ks, ke), ARG_NAMES)
    return q.new_empty(_output_shape(q, topk), dtype=torch.int32)


def _prefill_out_fake(q, k, k_scale, weights, ks, ke, topk_indices, sorted=False, ids="relative"):
    absolute_ids(ids)
    same_device((q, k, k_scale, weights, ks, ke, topk_indices), ARG_NAMES)


# Keep the Library object alive: dropping it would unregister the ops.
_LIB = None if registered("prefill_topk_indexer") else register_pair(
    "prefill_topk_indexer", (_SCHEMA, _SCHEMA_OUT), (_prefill_kernel, _prefill_out_kernel),
    (_prefill_fake, _prefill_out_fake))

prefill_topk_indexer_op = torch.ops.dsa.prefill_topk_indexer.default
prefill_topk_indexer_out_op = torch.ops.dsa.prefill_topk_indexer_out.default


def prefill_topk_indexer(q, k, k_scale, weights, ks, ke, topk: int = DEFAULT_TOPK, sorted: bool = False,
                         ids: str = "relative"):
    """``torch.ops.dsa.prefill_topk_indexer`` (functional): int32 ``[M, topk]`` on q's device."""
    return prefill_topk_indexer_op(q, k, k_scale, weights, ks, ke, topk, sorted, ids)


def prefill_topk_indexer_out(q, k, k_scale, weights, ks, ke, topk_indices, sorted: bool = False,
                             ids: str = "relative") -> None:
    """``torch.ops.dsa.prefill_topk_indexer_out`` (DPS): writes ``topk_indices`` ``[M, K]`` in place."""
    prefill_topk_indexer_out_op(q, k, k_scale, weights, ks, ke, topk_indices, sorted, ids)


__all__ = ["prefill_topk_indexer", "prefill_topk_indexer_out", "prefill_topk_indexer_op",
           "prefill_topk_indexer_out_op", "NAMESPACE"]
