"""The Hopper schedule's choices (cuda/include/ffi_dsa/sm90_schedule.h: PlanSchedule), checked on
the host: a small C++ program includes the header as the launch code does and prints the plan of
each case, which the test compares with what the rule says. The GPU tests see the same choices only
through the kernels a call launches (tests/test_cuda_paths.py)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from ffi_dsa import _build

SMS = 132
PAIRED_UNSORTED, PAIRED_SORTED, STAGED = 20480, 12288, 32768  # an H100's paired limits; kMaxStagedKeys

PROGRAM = r"""
#include "ffi_dsa/sm90_schedule.h"
#include <cstdio>
#include <cstdlib>
using namespace ffi_dsa::sm90;
int main(int argc, char** argv) {
  if (argc == 2) {  // the scoring split's multipliers of 1 .. argv[1] CTAs
    for (int c = 1; c <= std::atoi(argv[1]); ++c) std::printf("%llu\n", (unsigned long long)ScoreShareMultiplier(c));
    return 0;
  }
  // batch queries max_pages planned_tokens paired_staged_keys staged_keys select_threads
  if (argc != 8) return 2;
  int64_t v[7];
  for (int i = 0; i < 7; ++i) v[i] = std::atoll(argv[i + 1]);
  ClusterOccupancy occupancy{};
  for (int c = 1; c <= kMaxSelectCluster; ++c) occupancy.active[c] = c <= 8 ? 132 / c : c <= 14 ? 120 / c : 0;
  const Schedule s = PlanSchedule(v[0], v[1], v[2], v[3], 132, 8192, occupancy, false, v[4], v[5],
                                  static_cast<int>(v[6]));
  std::printf("%d %d %d\n", s.cluster_size, s.select_threads, int(s.longest_first));
  return 0;
}
"""

# (batch, N, planned tokens, paired staged keys (0: two do not fit an SM), knob) -> (cluster, threads, longest first)
CASES = {
    "W4 N=4: 256 rows of up to 32K, past the paired CTA's keys: 1024 threads, longest first":
        ((64, 4, 32768, PAIRED_UNSORTED, 0), (1, 1024, 1)),
    "W4 N=4 sorted: the paired CTA stages less": ((64, 4, 16384, PAIRED_SORTED, 0), (1, 1024, 1)),
    "rows that a paired CTA stages: paired, one wave": ((64, 4, 16384, PAIRED_UNSORTED, 0), (1, 512, 0)),
    "a wide table without max_seq_len: paired (most often short rows)": ((48, 4, 163840, PAIRED_UNSORTED, 0),
                                                                         (1, 512, 0)),
    "W5 N=4: 512 rows, more than 2 x SMs: paired": ((128, 4, 8192, PAIRED_UNSORTED, 0), (1, 512, 0)),
    "280 rows, more than 2 x SMs: paired": ((70, 4, 32768, PAIRED_UNSORTED, 0), (1, 512, 0)),
    "W4 N=2: 128 rows, one wave: 1024 threads in grid order": ((64, 2, 32768, PAIRED_UNSORTED, 0), (1, 1024, 0)),
    "the knob at 512: paired": ((64, 4, 32768, PAIRED_UNSORTED, 512), (1, 512, 0)),
    "the knob at 1024, two waves: longest first": ((50, 4, 8192, PAIRED_UNSORTED, 1024), (1, 1024, 1)),
    "the knob at 1024, 292 rows: past the ranked rows, grid order": ((73, 4, 8192, PAIRED_UNSORTED, 1024),
                                                                       (1, 1024, 0)),
    "two CTAs do not fit an SM: 1024 threads, longest first": ((50, 4, 163840, 0, 0), (1, 1024, 1)),
    "few long rows: clusters, never longest first": ((2, 4, 65536, PAIRED_UNSORTED, 0), (8, 1024, 0)),
}


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler on PATH")
    folder = tmp_path_factory.mktemp("schedule")
    source, binary = folder / "plan.cc", folder / "plan"
    source.write_text(PROGRAM)
    include = _build.native_dir() / "include"
    subprocess.run([compiler, "-O1", "-std=c++17", f"-I{include}", str(source), "-o", str(binary)], check=True)

    def run(batch, queries=None, planned=None, paired_keys=None, knob=None):
        if queries is None:  # the share multipliers of 1 .. batch CTAs
            done = subprocess.run([str(binary), str(batch)], capture_output=True, text=True, timeout=30, check=True)
            return [int(x) for x in done.stdout.split()]
        max_pages = (planned + 63) // 64
        args = [batch, queries, max_pages, planned, paired_keys, STAGED, knob]
        done = subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=30, check=True)
        return tuple(int(x) for x in done.stdout.split())
    return run


@pytest.mark.parametrize("case", list(CASES))
def test_plan_schedule(plan, case):
    given, want = CASES[case]
    assert plan(*given) == want, case


def share_start(total: int, c: int, multiplier: int) -> int:
    """ScorePagesKernel's first flat page of CTA c (sm90_score_pages.cuh: ShareStart) where
    total x CTAs < 2^32: the product of 32-bit total x c and the 64-bit multiplier, shifted."""
    return ((total * c) * multiplier) >> 32


def test_the_scoring_split_tiles_every_page_evenly(plan):
    """For every grid of 1 .. 1024 CTAs and totals up to 2^32 / CTAs (random, and the extremes): the
    multiplied split starts at 0, ends at the total, never decreases, and each CTA's start is
    within a page of total x c / CTAs, so every page goes to one CTA and shares differ by <= 2."""
    import random
    rng = random.Random(4519)
    multipliers = plan(1024)
    assert len(multipliers) == 1024 and multipliers[0] == 1 << 32
    for ctas, m in enumerate(multipliers, start=1):
        assert m == -(-(1 << 32) // ctas)
        largest = ((1 << 32) - 1) // ctas
        for total in {0, 1, ctas - 1, ctas, ctas + 1, largest, *(rng.randrange(largest + 1) for _ in range(6))}:
            starts = [share_start(total, c, m) for c in range(ctas + 1)]
            assert starts[0] == 0 and starts[-1] == total, (ctas, total)
            assert all(a <= b for a, b in zip(starts, starts[1:])), (ctas, total)
            assert all(0 <= s - total * c // ctas <= 1 for c, s in enumerate(starts)), (ctas, total)
