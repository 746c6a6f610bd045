"""The bin select's bins (cuda/include/ffi_dsa/select_bins.h), checked on the host over every 32-bit key.

The CUDA bin select compares keys with a bin's bounds instead of recomputing bins, and places ties
by position inside the NaN and zero bins without ranking them: both are sound only if every bin is
one contiguous key range, the bounds are exact, NaN and exact zero have bins of their own and the
map is monotone. A small C++ program includes the header as the kernels do and walks all 2^32 keys.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from ffi_dsa import _build

PROGRAM = r"""
#include "ffi_dsa/select_bins.h"
#include <cstdio>
using namespace ffi_dsa;
int main() {
  long bad = 0;
  uint32_t prev = SelectBin(kNaNKey);
  if (prev != kNaNBin) { std::printf("NaN key in bin %u\n", prev); ++bad; }
  for (uint64_t k = kNaNKey + 1; k <= 0xFFFFFFFFull; ++k) {
    const uint32_t key = static_cast<uint32_t>(k), bin = SelectBin(key);
    if (bin != prev && bin != prev + 1) {
      if (bad++ < 5) std::printf("key %08x: bin %u after %u (not monotone or a bin empty)\n", key, bin, prev);
    }
    if (bin != prev && (SelectBinHighKey(prev) != key - 1 || SelectBinLowKey(bin) != key)) {
      if (bad++ < 5) std::printf("key %08x: bounds of bins %u / %u wrong\n", key, prev, bin);
    }
    prev = bin;
  }
  if (prev != kSelectBins - 1 || SelectBinHighKey(prev) != 0xFFFFFFFFu) { std::printf("last bin %u\n", prev); ++bad; }
  const float zeros[2] = {0.0f, -0.0f};
  for (float z : zeros) {
    if (SelectBin(ScoreToKey(z)) != kZeroBin || SelectBinLowKey(kZeroBin) != SelectBinHighKey(kZeroBin)) ++bad;
  }
  if (SelectBin(ScoreToKey(1e-30f)) == kZeroBin || SelectBin(ScoreToKey(-1e-30f)) == kZeroBin) ++bad;
  std::printf("bad %ld\n", bad);
  return bad != 0;
}
"""


def test_every_key_lands_in_a_contiguous_bin_with_exact_bounds(tmp_path):
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler on PATH")
    source = tmp_path / "bins.cc"
    source.write_text(PROGRAM)
    binary = tmp_path / "bins"
    include = _build.native_dir() / "include"
    subprocess.run([compiler, "-O2", "-std=c++17", f"-I{include}", str(source), "-o", str(binary)], check=True)
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout
    assert run.stdout.strip() == "bad 0"
