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
* ``select_floor``: a measuring instrument, and the one option that changes what a call writes:
  ``SelectRowsKernel`` stops once it has staged and binned its keys and writes no output, so
  ``benchmarks/kernel_timeline.py --floor`` can time the split path's fixed cost (the kernel
  boundary and the staging) apart from the select's work. Never for results.
* ``stamp_fused_tail``: a measuring instrument that changes no output: each ``FusedRowsKernel`` CTA
  stamps the GPU's global timer when its row's last page is scored and when its last id is
  written; :func:`fused_tail_stamps` reads them (``benchmarks/kernel_timeline.py``: the fused
  path's select tail).

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
                     max_select_cluster: int | None = None, select_floor: bool | None = None,
                     stamp_fused_tail: bool | None = None) -> dict:
    """Set the options given (None leaves one as it is) and return all of them as they were before,
    to restore with ``set_cuda_options(**previous)``. ValueError (and no change) for a value the
    kernels do not support."""
    cluster = _UNCHANGED if max_select_cluster is None else int(max_select_cluster)
    previous = _ffi_api.cuda().set_cuda_options(_flag("fused", fused), _flag("pdl", pdl), cluster,
                                                _flag("select_floor", select_floor),
                                                _flag("stamp_fused_tail", stamp_fused_tail))
    return _as_options(previous)


def cuda_options() -> dict:
    """The options the next CUDA call uses: ``{"fused": bool, "pdl": bool, "max_select_cluster": int,
    "select_floor": bool, "stamp_fused_tail": bool}``."""
    return _as_options(_ffi_api.cuda().cuda_options())


def fused_tail_stamps(device: int, rows: int, *, clear: bool = True) -> list[tuple[int, int, int] | None]:
    """The ``stamp_fused_tail`` stamps of rows ``0 .. rows - 1`` written by the fused calls on CUDA
    device ``device`` so far, as ``(scored_ns, done_ns, cycles)`` per row, or ``None`` for a row no
    stamped call wrote: the global timer (ns) when the row's last page was scored and when its last
    id was written, and the SM cycles between the two. Synchronizes the device; ``clear`` zeroes the
    stamps afterwards. Call it once before capturing stamped calls in a CUDA graph: the first call
    allocates the device's stamp buffer, which a capture cannot."""
    words = list(_ffi_api.cuda().fused_tail_stamps(int(device), int(rows), bool(clear)))
    per_row = len(words) // rows if rows else 0  # the module's words a row: (scored, done, cycles, written)
    out = []
    for r in range(rows):
        scored, done, cycles, written = words[r * per_row:r * per_row + 4]
        out.append((scored, done, cycles) if written else None)
    return out


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
            "max_select_cluster": int(native["max_select_cluster"]), "select_floor": bool(native["select_floor"]),
            "stamp_fused_tail": bool(native["stamp_fused_tail"])}
