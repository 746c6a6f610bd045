// What the selects take (SelectRowsKernel's parameters; FusedRowsKernel passes its own copy).
#pragma once
#include <cstdint>

#include "ffi_dsa/impls/sm90_rows.cuh"

namespace ffi_dsa::sm90 {

struct SelectParams {
  uint32_t* keys;  // [B * N, row_stride], written by ScorePagesKernel for t < the query's length (winners marked in place when not staged)
  const int32_t* seq_lens;
  const int32_t* block_table;
  int32_t* topk_indices;
  int64_t row_stride;
  int64_t num_pages;  // page ids outside [0, num_pages) are invalid
  int32_t max_pages;
  int32_t topk;
  QueryShape qs;
  uint32_t staged_capacity;  // keys of shared memory behind SelectRowsSmem (whole tiles: StagedCapacity)
  bool sorted;
  // ids="positions": a token's position in its row instead of its global slot (page * 64 + slot).
  bool positions;
  // No ScorePagesKernel in front and launched with programmatic stream serialization: the stream's
  // previous kernel may still be writing seq_lens and the block table, so wait before any read.
  bool wait_before_inputs;
  // The stream's next kernel, if launched with programmatic stream serialization, may be placed
  // before this grid completes (launch/tuning.h: programmatic_launch; false: it starts only after
  // our completion). Never while a CTA still reads the workspace: once the call returns, that memory
  // is the allocator's.
  bool let_next_in;
  // launch/tuning.h: select_floor (a benchmark's instrument: SelectRowsKernel stops after staging
  // and writes nothing).
  bool stop_after_staging;
  // launch/tuning.h: stamp_select (a benchmark's instrument: each select stamps its phases into this
  // buffer, impls/sm90_select_stamps.cuh), or null.
  unsigned long long* stamps;
};

}  // namespace ffi_dsa::sm90
