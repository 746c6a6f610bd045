"""Options of the CUDA path, for tests and A/B timing; in effect for later CUDA calls in this process.

Each option switches between paths that give the same bytes (the GPU tests check that), so none of
them is a tuning knob for users:

* ``fused``: the fused path (``FusedRowsKernel``, one CTA per row) may be chosen where a row fits
  one CTA; ``False`` sends every call to the split path (``ScorePagesKernel`` then
  ``SelectRowsKernel``).
* ``pdl``: the call's first kernel is launched with programmatic dependent launch, so its prologue
  overlaps the end of the stream's previous kernel; ``False`` launches it in plain stream order.
* ``max_select_cluster``: the most CTAs ``SelectRowsKernel`` gives one query row (1, 2, 4, 8 or 16),
  so any Hopper GPU can run the smaller clusters of a part whose GPCs hold fewer SMs.
* ``bin_select``: the split path selects with the bin select (``SelectRowsKernel``: fixed bins
  counted while the keys are staged, two passes, an ordered emit); ``False`` runs the four-pass
  select it replaced (``PassSelectRowsKernel``), kept for A/B timing and byte diffs.
* ``select_floor``: a measuring instrument, and the one option that changes what a call writes:
  ``SelectRowsKernel`` stops once it has staged and binned its keys and writes no output, so
  ``benchmarks/kernel_timeline.py --floor`` can time the split path's fixed cost (the kernel
  boundary and the staging) apart from the select's work. Never for results.

The settings live in the CUDA module (cuda/include/ffi_dsa/launch/tuning.h), which is loaded (and,
without a prebuilt one, compiled) on first use.
"""

from __future__ import annotations

import contextlib

from . import _ffi_api

_UNCHANGED = -1


def _flag(name: str, value) -> int:
    if value is None:
        return _UNCHANGED
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True, False or None, got {value!r}")
    return int(value)


def set_cuda_options(*, fused: bool | None = None, pdl: bool | None = None,
                     max_select_cluster: int | None = None, bin_select: bool | None = None,
                     select_floor: bool | None = None) -> dict:
    """Set the options given (None leaves one as it is) and return all of them as they were before,
    to restore with ``set_cuda_options(**previous)``. ValueError (and no change) for a value the
    kernels do not support."""
    cluster = _UNCHANGED if max_select_cluster is None else int(max_select_cluster)
    previous = _ffi_api.cuda().set_cuda_options(_flag("fused", fused), _flag("pdl", pdl), cluster,
                                                _flag("bin_select", bin_select), _flag("select_floor", select_floor))
    return _as_options(previous)


def cuda_options() -> dict:
    """The options the next CUDA call uses: ``{"fused": bool, "pdl": bool, "max_select_cluster": int,
    "bin_select": bool, "select_floor": bool}``."""
    return _as_options(_ffi_api.cuda().cuda_options())


@contextlib.contextmanager
def using_cuda_options(**options):
    """``with using_cuda_options(fused=False): ...`` sets the options for the block and restores the
    previous ones after it, also when it raises."""
    previous = set_cuda_options(**options)
    try:
        yield
    finally:
        set_cuda_options(**previous)


def _as_options(native) -> dict:
    return {"fused": bool(native["fused"]), "pdl": bool(native["pdl"]),
            "max_select_cluster": int(native["max_select_cluster"]), "bin_select": bool(native["bin_select"]),
            "select_floor": bool(native["select_floor"])}
