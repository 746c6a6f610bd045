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
* ``stamp_select``: a measuring instrument that changes no output: each select (a query row's on
  the fused path, after its row's last page; each ``SelectRowsKernel`` CTA's on the split path,
  once the scoring kernel's keys are readable) stamps the GPU's global timer when it may start and
  when its last id is written, and the SM's cycle counter at the end of each phase;
  :func:`select_stamps` reads them (``benchmarks/kernel_timeline.py``: the fused path's select
  tail, and both paths' phases). On the split path each ``ScorePagesKernel`` CTA (a stamped
  instance of the kernel) also stamps its start and end and the milestones of its chain to the
  first page; :func:`score_stamps` reads them.
* ``select_threads``: ``SelectRowsKernel``'s CTA size where a query row gets one CTA: ``0`` the
  schedule's choice (512 threads, two CTAs an SM, when a launch has more such rows than SMs, unless
  they are at most twice the SMs and 288 and the planned row is longer than such a CTA stages, up
  to 32K keys; else 1024, one an SM), or ``512`` / ``1024`` for every such launch. Clusters (long
  rows) always take 1024. ``512`` falls back to 1024 on a GPU where two such CTAs do not fit an SM.
  1024-thread CTAs of one a row, more than the SMs (up to 288), select the rows longest first (the
  same bytes).

The settings live in the CUDA module (cuda/include/ffi_dsa/launch/tuning.h), which is loaded (and,
without a prebuilt one, compiled) on first use.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import numpy as np

from . import _ffi_api

_UNCHANGED = -1


def _number(name: str, value) -> int:
    if value is None:
        return _UNCHANGED
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
    if value < 0:  # the native call reads -1 as "unchanged"
        raise ValueError(f"{name} must not be negative, got {value}")
    return int(value)


def _flag(name: str, value) -> int:
    if value is None:
        return _UNCHANGED
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True, False or None, got {value!r}")
    return int(value)


def set_cuda_options(*, fused: bool | None = None, pdl: bool | None = None,
                     max_select_cluster: int | None = None, select_floor: bool | None = None,
                     stamp_select: bool | None = None, select_threads: int | None = None) -> dict:
    """Set the options given (None leaves one as it is) and return all of them as they were before,
    to restore with ``set_cuda_options(**previous)``. ValueError (and no change) for a value the
    kernels do not support."""
    cluster = _number("max_select_cluster", max_select_cluster)
    threads = _number("select_threads", select_threads)
    previous = _ffi_api.cuda().set_cuda_options(_flag("fused", fused), _flag("pdl", pdl), cluster,
                                                _flag("select_floor", select_floor),
                                                _flag("stamp_select", stamp_select), threads)
    return _as_options(previous)


def cuda_options() -> dict:
    """The options the next CUDA call uses: ``{"fused": bool, "pdl": bool, "max_select_cluster": int,
    "select_floor": bool, "stamp_select": bool, "select_threads": int}``."""
    return _as_options(_ffi_api.cuda().cuda_options())


# A select's phases in order, each ending at the stamp of the same place in SelectStamps.
SELECT_PHASES = ("binned", "threshold", "members", "resolve", "emit")


class SelectStamps(NamedTuple):
    """One select's stamps (cuda/include/ffi_dsa/impls/sm90_select_stamps.cuh): the global timer
    (ns) when it may start and when its last id is written, and the SM's cycle counter at the start
    and at the end of each phase; on the fused path also the global timer when the CTA starts on the
    row's pages (``start_ns - score_ns``: the page loop's own time), and ``bin_keys``, not a time: the
    row's keys in the threshold bin, which the resolve ranks. A phase a select did not reach
    (``select_floor``) is 0, and so is ``bin_keys`` then."""

    start_ns: int
    done_ns: int
    start: int       # cycles: the select may start
    binned: int      # the histogram complete (the split path: the keys staged too)
    threshold: int   # the threshold bin found
    members: int     # the member pass and the totals
    resolved: int    # the cut decided
    done: int        # the last id written
    score_ns: int    # the fused kernel's CTA starts on the row's pages (global timer; 0 on the split path)
    bin_keys: int    # the row's keys in the threshold bin (a count)

    def phases(self) -> dict[str, int]:
        """Each phase's cycles (binned, threshold, members, resolve, emit) and the whole select's."""
        marks = [self.start, self.binned, self.threshold, self.members, self.resolved, self.done]
        out = {name: marks[i + 1] - marks[i] for i, name in enumerate(SELECT_PHASES)}
        out["select"] = self.done - self.start
        return out


def select_stamps(device: int, slots: int, *, clear: bool = True) -> list[SelectStamps | None]:
    """The ``stamp_select`` stamps of slots ``0 .. slots - 1`` written on CUDA device ``device`` so
    far, or ``None`` for a slot no stamped select started. Slot ``rank * query_rows + query_row``:
    the query row's select (``b * N + j``), by the CTA of that rank in the row's cluster on the split
    path (rank 0 alone for a row selected by one CTA; always 0 on the fused path). A query row that
    needs no scores has no select and no stamps, nor has a slot past the module's stamp buffer
    (a few thousand slots: those are always ``None``). Synchronizes the device; ``clear`` zeroes the
    stamps afterwards. Call it once before capturing stamped calls in a CUDA graph: the first call
    allocates the device's stamp buffer, which a capture cannot."""
    return _stamp_slots(_ffi_api.cuda().select_stamps(int(device), int(slots), bool(clear)), SelectStamps, slots)


def _stamp_slots(native_words, kind, slots: int) -> list:
    """`slots` slots of `kind` (a NamedTuple of int words) from the module's words, None for a slot
    nothing stamped (start_ns 0) and for the slots past what the module's buffer holds."""
    words = list(native_words)
    per_slot = len(kind._fields)
    held = len(words) // per_slot  # the module's buffer ends there: nothing stamps a later slot
    if held > slots or len(words) != held * per_slot:
        raise RuntimeError(f"internal: {len(words)} stamp words for {slots} slots of {per_slot}")
    out = []
    for i in range(held):
        stamp = kind(*words[i * per_slot:(i + 1) * per_slot])
        out.append(stamp if stamp.start_ns else None)
    return out + [None] * (slots - held)


# The milestones of a scoring CTA's chain to its first page, in order, each a span ending at the stamp
# of the same name in ScoreStamps (from the one before it; "q_ready" and "first_page" both from
# "issued": the Q and the page are loaded side by side).
SCORE_SPANS = ("waited", "ranged", "issued", "q_ready", "first_page", "end")
# Inside two of them: "ranged" = "lens" (thread 0's seq_lens entry arrived) + "scanned" + the rest,
# "issued" = "q_issued" (the first Q's TMA) + "ids" (the first page id arrived) + the rest; and
# "l2_hit", one load of a line L2 holds, timed inside the CTA to compare the loads with. Where the
# thread that finds the CTA's first row issues its first loads (the first row among the first 640,
# every decode batch), they come before "ranged" (the barrier after the range): "q_issued" and
# "issued" then read negative, and "ranged" holds the whole early issue.
SCORE_INNER_SPANS = ("lens", "scanned", "q_issued", "ids", "l2_hit")


class ScoreStamps(NamedTuple):
    """One ``ScorePagesKernel`` CTA's stamps (cuda/include/ffi_dsa/impls/sm90_score_stamps.cuh): the
    global timer (ns) at its first instruction and when its last math warpgroup is done, and the
    SM's cycle counter at its start and at each milestone. ``ranged`` and everything after it are 0
    for a CTA with no pages (more CTAs than pages)."""

    start_ns: int
    end_ns: int
    start: int       # cycles: the CTA's first instruction
    waited: int      # past the grid wait (the stream's previous kernel done)
    ranged: int      # its page range and first row known
    issued: int      # the first page's TMA issued
    q_ready: int     # the first segment's Q arrived
    first_page: int  # the first page arrived
    end: int         # the last math warpgroup done
    lens: int = 0      # thread 0's seq_lens entry arrived
    scanned: int = 0   # the first tile of rows scanned
    q_issued: int = 0  # the first Q's TMA issued
    ids: int = 0       # the first page's id arrived
    l2_hit: int = 0    # not a mark: cycles of one load that hits L2

    @property
    def has_pages(self) -> bool:
        return self.ranged != 0

    def spans(self) -> dict[str, int]:
        """Each span's cycles (SCORE_SPANS and SCORE_INNER_SPANS) and the CTA's whole ("cta")."""
        before = {"waited": self.start, "ranged": self.waited, "issued": self.ranged, "q_ready": self.issued,
                  "first_page": self.issued, "end": self.first_page, "lens": self.waited, "scanned": self.lens,
                  "q_issued": self.ranged, "ids": self.q_issued, "l2_hit": 0}
        out = {name: getattr(self, name) - before[name] for name in (*SCORE_SPANS, *SCORE_INNER_SPANS)}
        out["cta"] = self.end - self.start
        return out


def score_stamps(device: int, ctas: int, *, clear: bool = True) -> list[ScoreStamps | None]:
    """The ``stamp_select`` stamps of ``ScorePagesKernel``'s CTAs ``0 .. ctas - 1`` written on CUDA
    device ``device`` so far (the last stamped call's: each CTA writes its own slot), or ``None`` for
    a CTA that did not start (or past the module's buffer, which holds more slots than any grid has
    CTAs). Synchronizes the device; ``clear`` zeroes them afterwards. As for :func:`select_stamps`,
    call it once before capturing stamped calls."""
    return _stamp_slots(_ffi_api.cuda().score_stamps(int(device), int(ctas), bool(clear)), ScoreStamps, ctas)


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
            "stamp_select": bool(native["stamp_select"]), "select_threads": int(native["select_threads"])}
