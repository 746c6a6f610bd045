// Exact top-K of one row on the CPU in O(n): nth_element on unique (key, position) words finds
// the K-th best; one ordered scan then emits the winners by ascending position.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "ffi_dsa/rank_key.h"

namespace ffi_dsa::cpu {

// keys[t] for t < n (kNotCandidate = excluded). Writes `topk` slots of out_positions; the
// valid prefix holds positions t, the rest -1. Returns the number of valid entries.
inline int64_t SelectTopK(const uint32_t* keys, int64_t n, int64_t topk, bool sorted_by_score,
                          std::vector<uint64_t>* scratch, int64_t* out_positions) {
  std::vector<uint64_t>& words = *scratch;
  words.clear();
  for (int64_t t = 0; t < n; ++t) {
    if (keys[t] != kNotCandidate) words.push_back(RankWord(keys[t], static_cast<uint32_t>(t)));
  }
  const int64_t count = std::min<int64_t>(topk, static_cast<int64_t>(words.size()));
  int64_t written = 0;
  if (count > 0) {
    uint64_t cut = 0;  // every candidate wins when there are no more than K of them
    if (static_cast<int64_t>(words.size()) > count) {
      std::nth_element(words.begin(), words.begin() + (count - 1), words.end(), std::greater<uint64_t>());
      cut = words[count - 1];  // the K-th best word: the winners are the words >= it
    }
    if (sorted_by_score) {
      std::sort(words.begin(), words.begin() + count, std::greater<uint64_t>());
      for (int64_t i = 0; i < count; ++i) out_positions[written++] = RankWordPosition(words[i]);
    } else {
      for (int64_t t = 0; t < n && written < count; ++t) {
        if (keys[t] != kNotCandidate && RankWord(keys[t], static_cast<uint32_t>(t)) >= cut) {
          out_positions[written++] = t;
        }
      }
    }
  }
  for (int64_t i = written; i < topk; ++i) out_positions[i] = -1;
  return written;
}

}  // namespace ffi_dsa::cpu
