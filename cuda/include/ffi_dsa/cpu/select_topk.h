// Exact top-K of one row on the CPU in O(n): a histogram of the keys' top bits finds the bin
// holding the K-th best, nth_element on that bin's unique (key, position) words finds the K-th
// best word, and one ordered scan then emits the winners by ascending position.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "ffi_dsa/rank_key.h"

namespace ffi_dsa::cpu {

constexpr int kRadixBits = 11;  // 2048 bins of 4 bytes: the histogram stays in L1
constexpr int kRadixShift = 32 - kRadixBits;

struct SelectScratch {
  std::array<uint32_t, 1u << kRadixBits> histogram;
  std::vector<uint64_t> words;
};

// Histogram of the keys by top bits; returns the number of candidates. The excluded
// (kNotCandidate) are counted in bin 0 with kNaNKey, below every other key: no test in the loop.
// KthBestWord never needs bin 0's exact count (with more than K candidates its walk stops there
// at the latest) and skips kNotCandidate when it gathers a bin's words.
inline int64_t KeyHistogram(const uint32_t* keys, int64_t n, SelectScratch* s) {
  s->histogram.fill(0);
  int64_t excluded = 0;
  for (int64_t t = 0; t < n; ++t) {
    ++s->histogram[keys[t] >> kRadixShift];
    excluded += keys[t] == kNotCandidate;
  }
  return n - excluded;
}

// The K-th best RankWord among the candidates of keys[0, n), given more than `topk` of them and
// their histogram: words of higher bins beat every word of lower ones, so only the K-th's bin
// needs ordering.
inline uint64_t KthBestWord(const uint32_t* keys, int64_t n, int64_t topk, SelectScratch* s) {
  int64_t above = 0;  // candidates in bins above `bin`
  uint32_t bin = static_cast<uint32_t>(s->histogram.size()) - 1;
  while (above + s->histogram[bin] < topk) above += s->histogram[bin--];
  s->words.clear();
  for (int64_t t = 0; t < n; ++t) {
    if (keys[t] >> kRadixShift == bin && keys[t] != kNotCandidate) {
      s->words.push_back(RankWord(keys[t], static_cast<uint32_t>(t)));
    }
  }
  const int64_t rank_in_bin = topk - above - 1;
  std::nth_element(s->words.begin(), s->words.begin() + rank_in_bin, s->words.end(), std::greater<uint64_t>());
  return s->words[rank_in_bin];
}

// keys[t] for t < n (kNotCandidate = excluded). Writes `topk` slots of out_positions; the
// valid prefix holds positions t, the rest -1. Returns the number of valid entries.
inline int64_t SelectTopK(const uint32_t* keys, int64_t n, int64_t topk, bool sorted_by_score,
                          SelectScratch* scratch, int64_t* out_positions) {
  const int64_t candidates = KeyHistogram(keys, n, scratch);
  const int64_t count = std::min(topk, candidates);
  // Every candidate wins when there are no more than K of them: the cut is below every word.
  const uint64_t cut = candidates > topk ? KthBestWord(keys, n, topk, scratch) : 0;
  int64_t written = 0;
  if (sorted_by_score) {
    std::vector<uint64_t>& winners = scratch->words;
    winners.clear();
    for (int64_t t = 0; t < n && static_cast<int64_t>(winners.size()) < count; ++t) {
      const uint64_t word = RankWord(keys[t], static_cast<uint32_t>(t));
      if (keys[t] != kNotCandidate && word >= cut) winners.push_back(word);
    }
    std::sort(winners.begin(), winners.end(), std::greater<uint64_t>());
    for (const uint64_t word : winners) out_positions[written++] = RankWordPosition(word);
  } else {
    for (int64_t t = 0; t < n && written < count; ++t) {
      if (keys[t] != kNotCandidate && RankWord(keys[t], static_cast<uint32_t>(t)) >= cut) {
        out_positions[written++] = t;
      }
    }
  }
  for (int64_t i = written; i < topk; ++i) out_positions[i] = -1;
  return written;
}

}  // namespace ffi_dsa::cpu
