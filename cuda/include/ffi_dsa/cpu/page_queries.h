// The query rows that score one page together (docs/contract.md §7): the N queries of a row share
// its pages, so each variant decodes a page once and scores it for every query row that sees it.
#pragma once
#include <cstdint>

#include "ffi_dsa/contract.h"

namespace ffi_dsa::cpu {

// Query i sees the page's first count[i] tokens (1..64) and writes their rank keys to keys[i].
// Only query rows that see at least one token of the page are listed.
template <typename Query>
struct PageQueries {
  const Query* query[kMaxQueries];
  int count[kMaxQueries];
  uint32_t* keys[kMaxQueries];
  int size = 0;

  // Tokens of the page some query sees: the ones a variant must decode.
  int MaxCount() const {
    int most = 0;
    for (int i = 0; i < size; ++i) most = count[i] > most ? count[i] : most;
    return most;
  }
};

}  // namespace ffi_dsa::cpu
