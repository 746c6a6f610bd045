"""benchmarks/kernel_timeline.py's arithmetic on the select stamps, from made-up stamps (no GPU): the
call's tail, the rows' page loops and where they end, the last select's phases and its threshold
bin's keys."""

from __future__ import annotations

import math

import pytest

from ffi_dsa.cuda_options import ScoreStamps, SelectStamps

from conftest import load_script

timeline = load_script("benchmarks/kernel_timeline.py")
HZ = 2e9  # cycles per second of the made-up SM clock: 2 cycles a ns


def fused_stamp(score_ns: int, start_ns: int, own_ns: int, bin_keys: int = 20) -> SelectStamps:
    """A fused row's stamps: its CTA begins on its pages at score_ns, its select starts at start_ns
    and takes own_ns (each of the five phases a fifth, in cycles); bin_keys in its threshold bin."""
    c0 = 10_000
    step = own_ns * 2 // 5
    marks = [c0 + i * step for i in range(6)]
    return SelectStamps(start_ns, start_ns + own_ns, *marks, score_ns, bin_keys)


class Graph:
    def replay(self):
        pass


@pytest.fixture
def calls(monkeypatch):
    """Two calls of three rows. Call 1: loops end 40, 50, 55 µs after the first start; the row
    ending at 50 has the longest select (10 µs), so it ends the call. Call 2: the same, 2 µs later."""
    per_call = []
    for shift, most in ((0, 90), (2_000, 70)):
        per_call.append([fused_stamp(1_000 + shift, 41_000 + shift, 4_000, bin_keys=most),
                         fused_stamp(3_000 + shift, 51_000 + shift, 10_000, bin_keys=30 + shift // 1_000),
                         fused_stamp(2_000 + shift, 56_000 + shift, 3_000)])
    replies = iter(per_call)
    monkeypatch.setattr(timeline, "select_stamps", lambda device, slots: next(replies))
    monkeypatch.setattr(timeline, "_clock_hz", lambda: HZ)
    monkeypatch.setattr(timeline.torch.cuda, "current_device", lambda: 0)
    return per_call


def test_the_stamps_give_the_tail_the_loops_and_their_ends(calls):
    tail, own, phases = timeline.stamped_selects([Graph()], slots=3, replays=2)
    # the last write (51 + 10 = 61 µs) after the last select's start (56 µs)
    assert tail == pytest.approx(5.0)
    assert own == pytest.approx(4.0)  # the median select's own time (4, 10, 3 µs)
    assert phases["select"] == pytest.approx(10.0)  # the select that ends the call
    assert phases["emit"] == pytest.approx(2.0)
    assert phases["loop"] == pytest.approx(48.0)  # loops of 40, 48 and 54 µs
    # ends after the call's first CTA start (1 µs): 40, 50, 55, and the critical row's 50
    assert [phases[k] for k in timeline.LOOP_ENDS] == pytest.approx([40.0, 50.0, 55.0, 50.0])
    # the critical select's bin (30, then 32 keys) and the call's most (90, then 70): medians
    assert (phases["bin_keys"], phases["bin_keys_max"]) == pytest.approx((31.0, 80.0))
    assert timeline.phase_line("W5", phases).endswith("K-th bin keys 31 (the call's most 80)")


def test_the_split_path_has_no_loop(monkeypatch):
    stamp = fused_stamp(0, 5_000, 4_000)._replace(score_ns=0)
    monkeypatch.setattr(timeline, "select_stamps", lambda device, slots: [stamp, None])
    monkeypatch.setattr(timeline, "_clock_hz", lambda: HZ)
    monkeypatch.setattr(timeline.torch.cuda, "current_device", lambda: 0)
    tail, own, phases = timeline.stamped_selects([Graph()], slots=2, replays=1)
    assert tail == pytest.approx(4.0) and own == pytest.approx(4.0)
    assert all(math.isnan(phases[k]) for k in ["loop", *timeline.LOOP_ENDS])


def split_stamp(start_ns: int, own_ns: int) -> SelectStamps:
    """A split-path select's stamps: it may start at start_ns and writes its last id own_ns later."""
    return fused_stamp(0, start_ns, own_ns)._replace(score_ns=0)


def test_query_rows_see_their_causal_lengths():
    """The lengths --rows sets beside each query row's stamps (the contract's, as the reference has them)."""
    assert list(timeline.visible_lengths([5000, 2], 4, 79)) == [4997, 4998, 4999, 5000, 0, 0, 1, 2]
    assert list(timeline.visible_lengths([7, 0], 1, 1)) == [7, 0]


def test_row_waves_give_the_later_wave_the_cost_per_key_and_the_last_rows():
    """Four query rows on two SMs: the two longest start at once (own time 1 + 0.5 µs per 1K keys),
    the two shortest when the first SMs free up; a row without a select (None) and a slot past the
    rows (another CTA of a cluster) are left out."""
    seen = [2000, 8000, 4000, 6000, 100]
    own = {r: 1_000 + seen[r] // 2 for r in range(4)}  # ns: 1 µs + 0.5 µs per 1K keys
    starts = {1: 10_000, 3: 10_200, 2: 10_200 + own[3], 0: 10_000 + own[1]}
    stamps = [split_stamp(starts[r], own[r]) for r in range(4)] + [None, split_stamp(1, 1)]
    head, ended, longest = timeline.row_waves(stamps, seen, "W4")
    # the last id: row 2 starts at 0.2 + 4.0 µs after the first start and takes 3.0 µs
    assert head.startswith("W4  rows: 4 selects, the last id 7.20 us after the first start; 2 start later")
    assert "(the first at 4.20)" in head and head.endswith("~ 1.00 + 0.500 us per 1K keys")
    assert ended.startswith("W4  ended last: r2 4000 keys at 4.20 for 3.00, r0 2000 keys at 5.00 for 2.00")
    assert longest.startswith("W4  longest: r1 8000 keys at 0.00 for 5.00, r3 6000 keys at 0.20 for 4.00")
    assert timeline.row_waves([None, None], [1, 2]) == ["    rows: no select stamped"]


def score_stamp(start_ns: int, cycles: list[int], end_ns: int, inner: tuple[int, ...] = ()) -> ScoreStamps:
    """A scoring CTA's stamps: its start and end on the global timer, its seven cycle marks
    (start, waited, ranged, issued, q_ready, first_page, end), then those inside two spans and the
    L2 hit's cycles (lens, scanned, q_issued, ids, l2_hit), 0 unless given."""
    return ScoreStamps(start_ns, end_ns, *cycles, *inner)


def test_the_scoring_chain_gives_the_median_cta_and_the_last_to_end(monkeypatch):
    """Three CTAs with pages and one without (no range): each span is the median over the CTAs with
    pages; the last to end is the one with the latest global end; the spread and the span count every
    started CTA's start."""
    monkeypatch.setattr(timeline, "_clock_hz", lambda: HZ)
    # cycles at 2 a ns: waited +200 ns, ranged +400, issued +300, Q +1000, page +1200, end +600
    # inside: seq_lens +100 ns after the wait, scanned +150, Q issued +50 after the range, ids +200; L2 hit 300 ns
    a = score_stamp(1_000, [0, 400, 1_200, 1_800, 3_800, 4_200, 5_400], 4_000, (600, 900, 1_300, 1_700, 600))
    b = score_stamp(1_500, [0, 600, 1_400, 2_000, 3_000, 4_000, 6_000], 5_500, (700, 1_000, 1_500, 1_800, 800))
    c = score_stamp(1_200, [0, 400, 1_000, 1_600, 3_600, 4_000, 5_000], 3_900, (600, 900, 1_100, 1_500, 600))
    idle = score_stamp(900, [0, 300, 0, 0, 0, 0, 0], 0)
    chain = timeline.scoring_chain([a, None, b, c, idle])
    assert chain["waited"] == pytest.approx(0.2) and chain["last_waited"] == pytest.approx(0.3)
    assert chain["ranged"] == pytest.approx(0.4) and chain["last_ranged"] == pytest.approx(0.4)
    assert chain["issued"] == pytest.approx(0.3) and chain["last_issued"] == pytest.approx(0.3)
    assert chain["q_ready"] == pytest.approx(1.0) and chain["last_q_ready"] == pytest.approx(0.5)
    assert chain["first_page"] == pytest.approx(1.2) and chain["last_first_page"] == pytest.approx(1.0)
    assert chain["end"] == pytest.approx(0.6) and chain["last_end"] == pytest.approx(1.0)
    assert chain["cta"] == pytest.approx(2.7) and chain["last_cta"] == pytest.approx(3.0)
    assert chain["spread"] == pytest.approx(0.6)  # 0.9 to 1.5 µs, the idle CTA included
    assert chain["span"] == pytest.approx(4.6)  # 0.9 to 5.5 µs
    assert chain["lens"] == pytest.approx(0.1) and chain["scanned"] == pytest.approx(0.15)
    assert chain["q_issued"] == pytest.approx(0.05) and chain["ids"] == pytest.approx(0.2)
    assert chain["l2_hit"] == pytest.approx(0.3) and chain["last_l2_hit"] == pytest.approx(0.4)
    line = timeline.scoring_line("W1", chain)
    assert line.startswith("W1  scoring CTAs' chain, us (median CTA / the last to end): waited 0.20/0.30 |")
    assert "starts spread 0.60, first start to last end  4.60; inside: lens 0.10/0.05 | scanned 0.15/0.15 |" in line
    assert line.endswith("q_issued 0.05/0.05 | ids 0.20/0.15 | l2_hit 0.30/0.40")
    assert timeline.scoring_chain([None, idle]) is None
    assert timeline.scoring_line("W1", None) == "W1  scoring CTAs: none stamped"


def test_stamped_scoring_takes_the_median_call(monkeypatch):
    monkeypatch.setattr(timeline, "_clock_hz", lambda: HZ)
    monkeypatch.setattr(timeline.torch.cuda, "current_device", lambda: 0)
    stamped = [[score_stamp(0, [0, 200, 400, 600, 800, 1_000, 1_200 + 200 * k], 10_000)] for k in (0, 2, 1)]
    calls = iter([[], *stamped, []])
    monkeypatch.setattr(timeline, "score_stamps", lambda device, ctas: next(calls))
    # the first read only clears; one call stamps nothing
    chain = timeline.stamped_scoring([Graph()], replays=4, ctas=1)
    assert chain["end"] == pytest.approx(0.2)  # ends 0.1, 0.3, 0.2 µs after the first page: the median
