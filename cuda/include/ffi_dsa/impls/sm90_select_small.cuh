// SelectSmallRow: the exact top-K of a row of at most kSmallRowKeys keys on one CTA, unsorted, with
// each thread's keys in registers from the load to the emit. The same select as SelectRow
// (sm90_bin_select.cuh: the histogram, the threshold bin, the member pass, the cut, the ordered
// emit, the same bytes), written for the one shape where every thread holds the same few quads
// (tile u's quad at u * kTileKeys + 4 * tid): no tile loops, no chunks, no keys staged in shared
// memory, and a winning member marked by a bit (win_bits) instead of over its key.
//
// Why a path of its own: on one CTA the select is issue-bound on its 32 warps, so every instruction
// a warp runs costs ~8 issue cycles of its scheduler, and the general passes' per-warp bookkeeping
// (tile loops, staged or L2 keys, chunks, clusters) was most of a row's instructions at 8 keys a
// thread. Rows whose threshold bin holds more members than one barrier's all-pairs rank takes
// (keys bunched inside a bin) go on to SelectRow with the same histogram, their keys read from L2.
#pragma once
#include <climits>
#include <cstdint>

#include "ffi_dsa/impls/sm90_bin_select.cuh"

namespace ffi_dsa::sm90::topk {

constexpr uint32_t kSmallRowKeys = 8192;

template <int kThreads>
struct SmallShape {
  static constexpr uint32_t kTileKeys = Shape<kThreads>::kTileKeys;
  static constexpr int kQuads = kSmallRowKeys / kTileKeys;  // a thread's quads
  static constexpr uint32_t kBitWords = kSmallRowKeys / 32;  // win_bits
  static_assert(kSmallRowKeys % kTileKeys == 0 && kQuads * Shape<kThreads>::kWarps <= kThreads,
                "the (tile, warp) table");
};

// How the emit decides: keys above `above` win, and with kMarks the members whose bit is set; with
// kTies the first `ties` keys equal to `above` + 1 by position win too.
enum class SmallCut { kMarks, kAbove, kTies };

// Counts a quad into the histogram without a branch a key: a non-candidate lands in kNoneBin
// (SelectBin maps it to bin 0, so or-ing kNoneBin in is enough; a select between the two
// compiles to a branch around SelectBin).
static_assert(kNaNBin == 0 && (kNoneBin & (kSelectBins - 1)) == 0, "kNoneBin | SelectBin(kNotCandidate)");
template <int kThreads>
__device__ __forceinline__ void CountQuadAll(Storage<kThreads>& s, const uint4& q) {
  const uint32_t quad[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) atomicAdd(&s.hist[SelectBin(quad[i]) | (quad[i] == kNotCandidate ? kNoneBin : 0u)], 1u);
}

// The row's keys in the threshold bin, from the member pass's (tile, warp) table (each entry's low
// half; a sum of at most kSmallRowKeys stays in 16 bits).
template <int kThreads>
__device__ __forceinline__ uint32_t SmallRowEqual(const Storage<kThreads>& s, uint32_t m, int tid) {
  using Small = SmallShape<kThreads>;
  constexpr int kWarps = Shape<kThreads>::kWarps;
  const int lane = tid % 32;
  uint32_t sum = 0;
#pragma unroll
  for (int u = 0; u < Small::kQuads; ++u) {
    if (u * Small::kTileKeys < m && lane < kWarps) sum += s.table[u * kWarps + lane];
  }
  return WarpSum(sum) & 0xFFFFu;
}

// A warp's members of one tile (`count` of them, `mine` this lane's) appended to the list in lane
// order, with one atomic a warp for their slots and one each for the bin's observed range; called
// by the warps that hold any (most hold none, so the member pass itself has no per-key branch).
template <int kThreads>
__device__ __forceinline__ void ListMembers(Storage<kThreads>& s, const uint32_t (&quad)[4], uint32_t pos,
                                            uint32_t lo, uint32_t hi, uint32_t mine, uint32_t count) {
  const int lane = threadIdx.x % 32;
  uint32_t first = 0;
  if (lane == 0) first = atomicAdd(&s.totals.listed, count);
  uint32_t j = __shfl_sync(0xFFFFFFFFu, first, 0) + WarpInclusiveSum(mine) - mine;
  uint32_t low = UINT_MAX, high = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (quad[i] >= lo && quad[i] <= hi) {
      if (j < kMemberCapacity) s.members[j] = make_uint2(quad[i], pos + i);
      ++j;
      low = min(low, quad[i]), high = max(high, quad[i]);
    }
  }
  low = __reduce_min_sync(0xFFFFFFFFu, low);
  high = __reduce_max_sync(0xFFFFFFFFu, high);
  if (lane == 0) atomicMin(&s.totals.lo, low), atomicMax(&s.totals.hi, high);
}

// The short list ranked (ShortListWinner), each winner's bit set and its (tile, warp) entry's high
// half counted up. Ends with a barrier.
template <int kThreads>
__device__ void RankAndMarkBits(Storage<kThreads>& s, uint32_t* win_bits, uint32_t count, uint32_t need, int tid) {
  uint2 me;
  if (ShortListWinner<kThreads>(s.members, count, need, me, tid)) {
    constexpr uint32_t kTileKeys = SmallShape<kThreads>::kTileKeys;
    const uint32_t p = me.y;
    atomicOr(&win_bits[p / 32], 1u << (p % 32));
    atomicAdd(&s.table[(p / kTileKeys) * Shape<kThreads>::kWarps + (p % kTileKeys) / 128], 1u << 16);
  }
  __syncthreads();
}

// The emit of one tile: this thread's quad at `pos`; `counted` the warp's lane-indexed (tile,
// warp) entries; `carry` the winners (and, with kTies, `carry_e` the ties) of the earlier tiles.
template <int kThreads, SmallCut kCut>
__device__ __forceinline__ void EmitSmallQuad(const uint4& q, uint32_t pos, uint32_t counted, uint32_t above,
                                              uint32_t ties, uint32_t bits, uint32_t& carry, uint32_t& carry_e,
                                              uint32_t topk, const RowOutput& o, int32_t* out, int tid) {
  const int warp = tid / 32, lane = tid % 32;
  const uint32_t quad[4] = {q.x, q.y, q.z, q.w};
  if constexpr (kCut != SmallCut::kTies) {
    const uint32_t entry = carry + WarpSum(lane < warp ? counted : 0u);
    carry += WarpSum(counted);
    bool wins[4];
    uint32_t slot = entry;
    const uint32_t below = LaneMaskLt();
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      wins[i] = quad[i] > above || (kCut == SmallCut::kMarks && (bits & (1u << i)) != 0);
      slot += __popc(__ballot_sync(0xFFFFFFFFu, wins[i]) & below);
    }
    if (wins[0] || wins[1] || wins[2] || wins[3]) {
      const int32_t id = o.QuadId(pos);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (wins[i] && slot < topk) StoreOutput(out + slot, id + i);
        slot += wins[i];
      }
    }
  } else {
    const uint32_t tie = above + 1u;
    auto one = [&](uint32_t key) { return (uint32_t(key > tie) << 16) + uint32_t(key == tie); };
    const uint32_t x = one(quad[0]) + one(quad[1]) + one(quad[2]) + one(quad[3]);
    const uint32_t entry = WarpSum(lane < warp ? counted : 0u);
    const uint32_t before = entry + WarpInclusiveSum(x) - x;
    const uint32_t tile_total = WarpSum(counted);
    uint32_t greater = carry + (before >> 16), equal = carry_e + (before & 0xFFFFu);
    carry += tile_total >> 16, carry_e += tile_total & 0xFFFFu;
    const int32_t id = x != 0 ? o.QuadId(pos) : 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool wins = quad[i] > tie, tied = quad[i] == tie;
      const uint32_t slot = wins ? greater + min(equal, ties) : greater + equal;
      if ((wins || (tied && equal < ties)) && slot < topk) StoreOutput(out + slot, id + i);
      greater += wins;
      equal += tied;
    }
  }
}

template <int kThreads, SmallCut kCut>
__device__ __forceinline__ void EmitSmallRow(Storage<kThreads>& s, const uint32_t* win_bits,
                                             const uint4 (&q)[SmallShape<kThreads>::kQuads], uint32_t m,
                                             uint32_t above, uint32_t ties, uint32_t topk, const RowOutput& o,
                                             int tid) {
  using Small = SmallShape<kThreads>;
  constexpr int kWarps = Shape<kThreads>::kWarps;
  const int lane = tid % 32;
  // The output row's pointer as one value: each id's address is then one add (SelectRow's Emit).
  int32_t* out = OpaquePointer(o.out);
  uint32_t carry = 0, carry_e = 0;
#pragma unroll
  for (int u = 0; u < Small::kQuads; ++u) {
    if (u * Small::kTileKeys >= m) break;  // uniform
    const uint32_t pos = u * Small::kTileKeys + 4 * tid;
    const uint32_t entry = lane < kWarps ? s.table[u * kWarps + lane] : 0u;
    uint32_t counted = entry;
    if constexpr (kCut == SmallCut::kMarks) counted = entry >> 16;
    if constexpr (kCut == SmallCut::kAbove) counted = (entry >> 16) + (entry & 0xFFFFu);
    const uint32_t bits = kCut == SmallCut::kMarks ? win_bits[pos / 32] >> (pos % 32) : 0u;
    EmitSmallQuad<kThreads, kCut>(q[u], pos, counted, above, ties, bits, carry, carry_e, topk, o, out, tid);
  }
}

// The row [0, m) of `global` (m <= kSmallRowKeys) on the whole CTA, once Reset has zeroed the
// histogram, the totals and `win_bits` (kBitWords words) and a barrier has passed. `let_next_in`:
// trigger the next kernel's launch once the keys are read. Stamps as SelectRow's.
template <int kThreads>
__device__ void SelectSmallRow(Storage<kThreads>& s, uint32_t* win_bits, uint32_t* global, uint32_t m,
                               const RowOutput& o, uint32_t topk, bool let_next_in, bool stamped, int tid) {
  using Small = SmallShape<kThreads>;
  constexpr int kWarps = Shape<kThreads>::kWarps;
  const int warp = tid / 32, lane = tid % 32;
  uint4 q[Small::kQuads];
#pragma unroll
  for (int u = 0; u < Small::kQuads; ++u) {
    const uint32_t pos = u * Small::kTileKeys + 4 * tid;
    q[u] = LoadQuad(SliceKeys{nullptr, global, m}, pos);
  }
#pragma unroll
  for (int u = 0; u < Small::kQuads; ++u) {
    if (u * Small::kTileKeys + 4 * tid < m) CountQuadAll(s, q[u]);
  }
  __syncthreads();
  if (stamped && tid == 0) StampAt(s.stamps, kStampBinnedCycles);
  // The next kernel reads nothing before its own wait for this grid, so the rare fallback below
  // may still read the keys again.
  if (let_next_in) AllowDependentLaunch();

  const ThresholdBin th = ThresholdBinLocal<kThreads, 0>(s, topk, tid);
  if (stamped && tid == 0) StampAt(s.stamps, kStampThresholdCycles);
  const uint32_t need = th.need, selected = min(topk, th.above + need);
  const uint32_t lo = th.lo, hi = th.hi;
  const bool single = SingleValueBin(th.bin);

  // The member pass: (tile, warp) counts packed (above hi) << 16 | (in [lo, hi]), and the members.
  // Its row totals are the table's sums, taken where needed (no same-address atomics).
#pragma unroll
  for (int u = 0; u < Small::kQuads; ++u) {
    if (u * Small::kTileKeys >= m) break;  // uniform
    const uint32_t quad[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
    uint32_t packed = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool in = quad[i] - lo <= hi - lo;  // lo >= kNaNKey: never a non-candidate
      packed += (uint32_t(quad[i] > hi) << 16) + uint32_t(in);
    }
    const uint32_t mine = packed & 0xFFFFu;
    packed = WarpSum(packed);
    if (lane == 0) s.table[u * kWarps + warp] = packed;
    if (!single && (packed & 0xFFFFu) != 0) {  // uniform
      ListMembers(s, quad, u * Small::kTileKeys + 4 * tid, lo, hi, mine, packed & 0xFFFFu);
    }
  }
  __syncthreads();
  const PassTotals row = s.totals;  // listed, lo, hi (ListMembers')
  if (stamped) {
    const uint32_t equal = SmallRowEqual(s, m, tid);
    if (tid == 0) StampAt(s.stamps, kStampMembersCycles), StampCount(s.stamps, kStampBinKeys, equal);
  }

  if (single || row.lo == row.hi) {  // one value: its first `need` copies by position win
    const uint32_t value = single ? lo : row.lo;
    if (stamped && tid == 0) StampAt(s.stamps, kStampResolvedCycles);
    if (need == SmallRowEqual(s, m, tid)) {
      EmitSmallRow<kThreads, SmallCut::kAbove>(s, win_bits, q, m, value - 1u, 0u, topk, o, tid);
    } else {
      EmitSmallRow<kThreads, SmallCut::kTies>(s, win_bits, q, m, value - 1u, need, topk, o, tid);
    }
  } else if (row.listed <= kThreads / kShortListDivisor) {
    RankAndMarkBits<kThreads>(s, win_bits, row.listed, need, tid);
    if (stamped && tid == 0) StampAt(s.stamps, kStampResolvedCycles);
    EmitSmallRow<kThreads, SmallCut::kMarks>(s, win_bits, q, m, hi, 0u, topk, o, tid);
  } else {  // keys bunched inside the bin: the general select, from the same histogram
    __syncthreads();  // every thread has read the totals
    ResetAllButBins(s, tid);
    __syncthreads();
    const SliceKeys keys{nullptr, global, m};
    SelectRow<kThreads, 0>(s, nullptr, keys, o, topk, 1, 0, stamped, tid);  // unsorted
    return;
  }
#pragma unroll 1
  for (uint32_t i = selected + tid; i < topk; i += kThreads) o.out[i] = -1;
  if (stamped) {
    __syncthreads();  // every id is written
    if (tid == 0) StampDone(s.stamps);
  }
}

}  // namespace ffi_dsa::sm90::topk
