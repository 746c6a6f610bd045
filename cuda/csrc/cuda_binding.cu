// CUDA module (Hopper, sm_90a): checks the arguments once (validate.h), picks the schedule from
// shapes (sm90_schedule.h), and launches the kernels of impls/ on the caller's stream.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ffi_dsa/impls/sm90_fused_rows.cuh"
#include "ffi_dsa/impls/sm90_score_pages.cuh"
#include "ffi_dsa/impls/sm90_select_rows.cuh"
#include "ffi_dsa/sm90_schedule.h"
#include "ffi_dsa/validate.h"

namespace {

using tvm::ffi::TensorView;
namespace sm90 = ffi_dsa::sm90;

struct DeviceInfo {
  int sm_count = 0, major = 0, minor = 0;
  size_t max_smem_optin = 0;
  // Select clusters of c CTAs the device holds at once, for c = 1..kMaxSelectCluster (0: none fits,
  // or c is above FFI_DSA_MAX_SELECT_CLUSTER).
  sm90::ClusterOccupancy select_clusters{};
  bool fused = true;      // the one-kernel path may be chosen (FFI_DSA_FUSED)
  bool entry_pdl = true;  // the call's first kernel overlaps the stream's previous one (FFI_DSA_PDL)
};

// How many select clusters of each size up to kMaxSelectCluster, at the select kernel's largest
// shared memory, can be resident at once. A cluster's CTAs share one GPC, so this is not SMs / size:
// a 16-CTA cluster needs 16 free SMs in one GPC, which a part with fewer SMs per GPC lacks (its
// launch would fail), and a GPC of fewer than 16 free SMs holds one 8-CTA cluster, not two.
// FFI_DSA_MAX_SELECT_CLUSTER (1, 2, 4, 8 or 16) caps the sizes, so the smaller clusters such a part
// gets can be tested on any Hopper GPU.
sm90::ClusterOccupancy SelectClusterOccupancy() {
  int largest = sm90::kMaxSelectCluster;
  if (const char* env = std::getenv("FFI_DSA_MAX_SELECT_CLUSTER"); env != nullptr && *env != '\0') {
    const std::string value(env);
    if (value != "1" && value != "2" && value != "4" && value != "8" && value != "16") {
      TVM_FFI_THROW(ValueError) << "FFI_DSA_MAX_SELECT_CLUSTER must be 1, 2, 4, 8 or 16, got '" << value << "'";
    }
    largest = std::min(largest, std::stoi(value));
  }
  sm90::ClusterOccupancy occupancy{};
  for (int size = 1; size <= largest; ++size) {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(size));
    config.blockDim = dim3(sm90::kSelectThreads);
    config.dynamicSmemBytes = sm90::SelectSmemBytes(sm90::kMaxStagedKeys);
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = static_cast<unsigned>(size);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, sm90::SelectRowsKernel, &config) != cudaSuccess) {
      (void)cudaGetLastError();  // a refused size is an answer, not a sticky error
      clusters = 0;
    }
    occupancy.active[size] = clusters;
  }
  occupancy.active[1] = std::max(occupancy.active[1], 1);  // one CTA per row always launches
  return occupancy;
}

// A 0/1 switch from the environment, on (1) when unset.
bool EnvSwitch(const char* name) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return true;
  const std::string value(env);
  if (value != "0" && value != "1") TVM_FFI_THROW(ValueError) << name << " must be 0 or 1, got '" << value << "'";
  return value == "1";
}

// Calls f(heads, queries) for every (H, N) the kernels are compiled for, each as a constexpr
// functor (heads() is usable as a template argument).
template <typename F>
void ForEachQueryShape(F&& f) {
  auto for_queries = [&](auto heads) {
    f(heads, std::integral_constant<int, 1>{});
    f(heads, std::integral_constant<int, 2>{});
    f(heads, std::integral_constant<int, 3>{});
    f(heads, std::integral_constant<int, 4>{});
  };
  static_assert(ffi_dsa::kMaxQueries == 4, "one instantiation per N");
  for_queries(std::integral_constant<int, ffi_dsa::kNumHeads>{});
  for_queries(std::integral_constant<int, ffi_dsa::kNumHeadsNarrow>{});
}

// Device facts and kernel attributes, set once per device (not per call: keeps the launch path
// free of driver queries, and capture-safe).
const DeviceInfo& GetDeviceInfo(int device) {
  constexpr int kMaxDevices = 64;
  static std::array<DeviceInfo, kMaxDevices> infos;
  static std::array<std::once_flag, kMaxDevices> once;
  if (device < 0 || device >= kMaxDevices) TVM_FFI_THROW(ValueError) << "CUDA device id " << device << " out of range";
  std::call_once(once[device], [device] {
    DeviceInfo info;
    TVM_FFI_CHECK_CUDA_ERROR(cudaDeviceGetAttribute(&info.sm_count, cudaDevAttrMultiProcessorCount, device));
    TVM_FFI_CHECK_CUDA_ERROR(cudaDeviceGetAttribute(&info.major, cudaDevAttrComputeCapabilityMajor, device));
    TVM_FFI_CHECK_CUDA_ERROR(cudaDeviceGetAttribute(&info.minor, cudaDevAttrComputeCapabilityMinor, device));
    int optin = 0;
    TVM_FFI_CHECK_CUDA_ERROR(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    info.max_smem_optin = static_cast<size_t>(optin);
    if (info.major == 9 && info.minor == 0) {
      // The kernels have fixed shared-memory footprints: check them once per device, not per call.
      const size_t select_bytes = sm90::SelectSmemBytes(sm90::kMaxStagedKeys);
      const size_t score_bytes = sm90::ScoreSmemBytes<ffi_dsa::kNumHeads, ffi_dsa::kMaxQueries>();
      if (std::max(score_bytes, select_bytes) > info.max_smem_optin) {
        TVM_FFI_THROW(RuntimeError) << "internal: the kernels need " << score_bytes << " and " << select_bytes
                                    << " B of shared memory, device " << device << " allows " << info.max_smem_optin;
      }
      std::vector<const void*> kernels{reinterpret_cast<const void*>(sm90::SelectRowsKernel)};
      ForEachQueryShape([&kernels](auto heads, auto queries) {
        kernels.push_back(reinterpret_cast<const void*>(sm90::ScorePagesKernel<heads(), queries()>));
        kernels.push_back(reinterpret_cast<const void*>(sm90::FusedRowsKernel<heads(), queries()>));
      });
      for (const void* kernel : kernels) {
        TVM_FFI_CHECK_CUDA_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
      }
      TVM_FFI_CHECK_CUDA_ERROR(
          cudaFuncSetAttribute(sm90::SelectRowsKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
      info.select_clusters = SelectClusterOccupancy();
      // The one-kernel path is an optimization, taken when a row fits its CTA's shared memory
      // (FusedFits); otherwise the two-kernel path gives the same bytes.
      // FFI_DSA_FUSED=0 turns the one-kernel path off (every call then takes the two kernels), so
      // both paths can be tested and timed on the same shapes.
      info.fused = EnvSwitch("FFI_DSA_FUSED");
      // FFI_DSA_PDL=0 launches the call's first kernel in plain stream order, for A/B timing.
      info.entry_pdl = EnvSwitch("FFI_DSA_PDL");
    }
    infos[device] = info;
  });
  return infos[device];
}

PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  // Through the runtime's entry-point query: no link-time dependency on libcuda.
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status;
    TVM_FFI_CHECK_CUDA_ERROR(
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &status));
    if (status != cudaDriverEntryPointSuccess || ptr == nullptr) {
      TVM_FFI_THROW(RuntimeError) << "cuTensorMapEncodeTiled is not available from the CUDA driver";
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

CUtensorMap EncodeTiled(void* base, cuuint32_t rank, const cuuint64_t* dims, const cuuint64_t* strides,
                        const cuuint32_t* box) {
  CUtensorMap map{};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = TensorMapEncoder()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, rank, base, dims, strides, box,
                                        element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) TVM_FFI_THROW(RuntimeError) << "cuTensorMapEncodeTiled failed with CUresult " << r;
  return map;
}

// The FP8 rows of every page as a 3-D tensor [num_pages][64 tokens][128 bytes] with the page
// stride of 8448 bytes; one box is one page, swizzled 128B for wgmma.
CUtensorMap KCacheTensorMap(const uint8_t* k_cache, int64_t num_pages) {
  if (num_pages == 0) return CUtensorMap{};  // every page id is invalid: nothing is ever loaded
  const cuuint64_t dims[3] = {ffi_dsa::kHeadDim, ffi_dsa::kPageTokens, static_cast<cuuint64_t>(num_pages)};
  const cuuint64_t strides[2] = {ffi_dsa::kHeadDim, ffi_dsa::kPageBytes};
  const cuuint32_t box[3] = {ffi_dsa::kHeadDim, ffi_dsa::kPageTokens, 1};
  return EncodeTiled(const_cast<uint8_t*>(k_cache), 3, dims, strides, box);
}

// Q as [B * N * H heads][128 bytes]; one box is one row's N queries x H heads (at most 256
// rows, TMA's box limit), swizzled exactly like a K tile.
CUtensorMap QTensorMap(const ffi_dsa::IndexerArgs& a) {
  const cuuint64_t dims[2] = {ffi_dsa::kHeadDim, static_cast<cuuint64_t>(a.query_rows() * a.heads)};
  const cuuint64_t strides[1] = {ffi_dsa::kHeadDim};
  const cuuint32_t box[2] = {ffi_dsa::kHeadDim, static_cast<cuuint32_t>(a.queries * a.heads)};
  static_assert(ffi_dsa::kMaxQueries * ffi_dsa::kNumHeads <= 256, "one TMA box per row's queries");
  return EncodeTiled(const_cast<uint8_t*>(a.q), 2, dims, strides, box);
}

// Per-call scratch (kernel 1's rank keys, read back by kernel 2). From the caller's framework
// allocator when tvm-ffi provides one (torch's caching allocator: graph-capture safe, stream ordered); otherwise
// stream-ordered cudaMallocAsync/cudaFreeAsync, which CUDA graphs capture as memory nodes.
class Workspace {
 public:
  Workspace(size_t bytes, DLDevice device, cudaStream_t stream) : stream_(stream) {
    if (bytes == 0) return;
    if (TVMFFIEnvGetDLPackManagedTensorAllocator() != nullptr) {
      const int64_t shape[1] = {static_cast<int64_t>(bytes)};
      owner_ = tvm::ffi::Tensor::FromEnvAlloc(TVMFFIEnvTensorAlloc, tvm::ffi::ShapeView(shape, 1),
                                              DLDataType{kDLUInt, 8, 1}, device);
      ptr_ = owner_.data_ptr();
    } else {
      TVM_FFI_CHECK_CUDA_ERROR(cudaMallocAsync(&ptr_, bytes, stream_));
      async_ = true;
    }
  }
  ~Workspace() {
    if (async_) cudaFreeAsync(ptr_, stream_);
  }
  uint8_t* data() const { return static_cast<uint8_t*>(ptr_); }

 private:
  cudaStream_t stream_;
  void* ptr_ = nullptr;
  bool async_ = false;
  tvm::ffi::Tensor owner_;
};

size_t AlignUp(size_t x) { return (x + 255) / 256 * 256; }

// Launch settings with optional thread-block clusters (cluster > 0) and programmatic stream
// serialization. With the latter a kernel's CTAs may be placed once every CTA of the stream's
// previous kernel has run griddepcontrol.launch_dependents (or exited), and overlap its end: the
// launch latency and the kernel's prologue (barrier init, descriptor and L2 prefetches) hide
// behind it. Each kernel runs griddepcontrol.wait before it reads anything that kernel may have
// written. Measured on H100 (v13.7): -0.3 to -0.7 µs per call when 16 calls share a graph.
class Launch {
 public:
  Launch(unsigned grid, unsigned threads, size_t smem, cudaStream_t stream, int cluster, bool programmatic) {
    config_.gridDim = dim3(grid);
    config_.blockDim = dim3(threads);
    config_.dynamicSmemBytes = smem;
    config_.stream = stream;
    if (cluster > 0) {
      cudaLaunchAttribute& a = attrs_[config_.numAttrs++];
      a.id = cudaLaunchAttributeClusterDimension;
      a.val.clusterDim.x = static_cast<unsigned>(cluster);
      a.val.clusterDim.y = 1;
      a.val.clusterDim.z = 1;
    }
    if (programmatic) {
      cudaLaunchAttribute& a = attrs_[config_.numAttrs++];
      a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      a.val.programmaticStreamSerializationAllowed = 1;
    }
    config_.attrs = attrs_;
  }
  template <typename... Params, typename... Args>
  void Run(void (*kernel)(Params...), Args&&... args) {
    TVM_FFI_CHECK_CUDA_ERROR(cudaLaunchKernelEx(&config_, kernel, std::forward<Args>(args)...));
  }

 private:
  cudaLaunchConfig_t config_{};
  cudaLaunchAttribute attrs_[2];
};

// Whether the one-kernel path's CTA holds a row: its N queries' Q and N x the table's width of keys.
template <int kHeads, int kQueries>
bool FusedFits(const DeviceInfo& info, int64_t max_tokens) {
  return info.fused && kQueries * max_tokens <= sm90::kFusedMaxRowKeys &&
         sm90::FusedSmemBytes<kHeads, kQueries>(static_cast<uint32_t>(max_tokens)) <= info.max_smem_optin;
}

// Picks the schedule from shapes (sm90_schedule.h) and launches it on `stream`.
template <int kHeads, int kQueries>
void LaunchIndexer(const ffi_dsa::IndexerArgs& a, const DeviceInfo& info, cudaStream_t stream, bool sorted_by_score) {
  const int64_t row_stride = a.max_pages * ffi_dsa::kPageTokens;
  const int64_t max_tokens = std::max<int64_t>(1, a.max_pages) * ffi_dsa::kPageTokens;
  const sm90::Schedule plan = sm90::PlanSchedule(a.batch, a.queries, a.max_pages, info.sm_count, sm90::kSliceKeys,
                                                 info.select_clusters, FusedFits<kHeads, kQueries>(info, max_tokens));
  // Kernel 1 runs unless no row has a token, or no query can be longer than K with the output by
  // position, so that no query needs scores (sm90_rows.cuh: ScoresNeeded): then one launch, no
  // workspace.
  const bool score = a.max_pages > 0 && sm90::ScoresNeeded(row_stride, static_cast<int32_t>(a.topk), sorted_by_score);
  const sm90::QueryShape qs{a.queries, a.per_query_lens};

  sm90::SelectParams sel{};
  sel.seq_lens = a.seq_lens;
  sel.block_table = a.block_table;
  sel.topk_indices = a.topk_indices;
  sel.row_stride = row_stride;
  sel.num_pages = a.num_pages;
  sel.max_pages = static_cast<int32_t>(a.max_pages);
  sel.topk = static_cast<int32_t>(a.topk);
  sel.qs = qs;
  sel.sorted = sorted_by_score;
  sel.let_next_in = info.entry_pdl;  // FFI_DSA_PDL=0: no early start either way

  if (score && plan.fused) {  // one kernel: every row scored and selected by its own CTA
    sm90::FusedParams fp{};
    fp.k_cache = a.k_cache;
    fp.weights = a.weights;
    fp.key_stride = static_cast<uint32_t>(max_tokens);
    fp.select = sel;
    const CUtensorMap k_map = KCacheTensorMap(a.k_cache, a.num_pages);
    const CUtensorMap q_map = QTensorMap(a);
    Launch(static_cast<unsigned>(a.batch), sm90::kFusedThreads,
           sm90::FusedSmemBytes<kHeads, kQueries>(static_cast<uint32_t>(max_tokens)), stream, 0, info.entry_pdl)
        .Run(sm90::FusedRowsKernel<kHeads, kQueries>, k_map, q_map, fp);
    return;
  }

  // Two kernels: kernel 1 scores every page into a workspace of rank keys (a row per query),
  // balanced over all SMs; kernel 2 selects each query row from there.
  Workspace workspace(score ? AlignUp(a.query_rows() * row_stride * sizeof(uint32_t)) : 0, a.device, stream);
  uint32_t* keys = reinterpret_cast<uint32_t*>(workspace.data());
  if (score) {
    sm90::ScoreParams sp{};
    sp.k_cache = a.k_cache;
    sp.weights = a.weights;
    sp.seq_lens = a.seq_lens;
    sp.block_table = a.block_table;
    sp.keys = keys;
    sp.row_stride = row_stride;
    sp.num_pages = a.num_pages;
    sp.batch = static_cast<int32_t>(a.batch);
    sp.max_pages = static_cast<int32_t>(a.max_pages);
    sp.topk = static_cast<int32_t>(a.topk);
    sp.sorted = sorted_by_score;
    sp.qs = qs;
    const CUtensorMap k_map = KCacheTensorMap(a.k_cache, a.num_pages);
    const CUtensorMap q_map = QTensorMap(a);
    Launch(static_cast<unsigned>(plan.score_ctas), sm90::kScoreThreads, sm90::ScoreSmemBytes<kHeads, kQueries>(), stream,
           0, info.entry_pdl)
        .Run(sm90::ScorePagesKernel<kHeads, kQueries>, k_map, q_map, sp);
  }

  sel.keys = keys;
  // Shared memory for the longest slice the table allows (slices of longer rows read L2).
  sel.staged_capacity =
      static_cast<uint32_t>(std::min<int64_t>(sm90::kMaxStagedKeys, sm90::SliceLength(max_tokens, plan.cluster_size)));
  // One cluster per query row. Behind kernel 1 the select CTAs are placed while it still runs and
  // read seq_lens and the block table at once (kernel 1 lets them launch only after its own wait
  // for the stream's previous kernel), then wait for its keys. As the call's first kernel (rows
  // that need no scores) the select waits before reading anything.
  sel.wait_before_inputs = !score && info.entry_pdl;
  Launch(static_cast<unsigned>(a.query_rows() * plan.cluster_size), sm90::kSelectThreads,
         sm90::SelectSmemBytes(sel.staged_capacity), stream, plan.cluster_size, score || info.entry_pdl)
      .Run(sm90::SelectRowsKernel, sel);
}

void TopkIndexerCuda(TensorView q, TensorView k_cache, TensorView weights, TensorView seq_lens,
                     TensorView block_table, TensorView topk_indices, bool sorted_by_score) {
  const ffi_dsa::IndexerArgs a =
      ffi_dsa::CheckIndexerArgs(q, k_cache, weights, seq_lens, block_table, topk_indices, kDLCUDA);
  if (reinterpret_cast<uintptr_t>(a.k_cache) % 16 != 0 || reinterpret_cast<uintptr_t>(a.q) % 16 != 0) {
    TVM_FFI_THROW(ValueError) << "q_index_fp8 and k_index_cache_fp8 must start on a 16-byte boundary "
                              << "(TMA and vector loads); got a view at an odd offset";
  }
  if (a.batch == 0 || a.topk == 0) return;
  // TMA box coordinates are int32: query rows * H heads must fit (a batch this large would need
  // 274 GB of q).
  const int64_t max_query_rows = std::numeric_limits<int32_t>::max() / a.heads;
  if (a.query_rows() > max_query_rows) {
    TVM_FFI_THROW(ValueError) << "B * N = " << a.query_rows() << " query rows exceed the CUDA kernel's limit of "
                              << max_query_rows;
  }
  const int device = a.device.device_id;
  tvm::ffi::CUDADeviceGuard guard(device);
  const DeviceInfo& info = GetDeviceInfo(device);
  if (!(info.major == 9 && info.minor == 0)) {
    TVM_FFI_THROW(RuntimeError) << "the ffi_dsa CUDA kernel needs a Hopper GPU (sm_90a); device " << device
                                << " is sm_" << info.major << info.minor;
  }
  auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device));
  bool launched = false;
  ForEachQueryShape([&](auto heads, auto queries) {
    if (a.heads == heads() && a.queries == queries()) {
      LaunchIndexer<heads(), queries()>(a, info, stream, sorted_by_score);
      launched = true;
    }
  });
  if (!launched) TVM_FFI_THROW(RuntimeError) << "internal: no kernel for H=" << a.heads << ", N=" << a.queries;
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(topk_indexer, TopkIndexerCuda);

