// The CPU module: each op's export checks the arguments once (validate/) and runs the op's CPU path
// (cpu/); its _check_shapes twin runs the same checks on shapes and dtypes alone. Every export
// carries its type schema (tvm-ffi's function metadata): ffi_dsa/_native.py's typed stubs are
// checked against it by tests/test_native_stubs.py, so the two cannot drift apart.
#define TVM_FFI_DLL_EXPORT_INCLUDE_METADATA 1
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <string>

#include "ffi_dsa/cpu/decode_cpu.h"
#include "ffi_dsa/cpu/mxfp4_cpu.h"
#include "ffi_dsa/cpu/prefill_cpu.h"
#include "ffi_dsa/cuda_archs.h"
#include "ffi_dsa/mxfp4_e2m1.h"
#include "ffi_dsa/validate/common.h"
#include "ffi_dsa/validate/decode.h"
#include "ffi_dsa/validate/mxfp4.h"
#include "ffi_dsa/validate/prefill.h"

namespace {

using tvm::ffi::Array;
using tvm::ffi::String;
using tvm::ffi::TensorView;
namespace cpu = ffi_dsa::cpu;

// max_seq_len (the caller's bound on the longest row) only plans CUDA work: the CPU path has none to plan.
void TopkIndexerCpu(TensorView q, TensorView k_cache, TensorView weights, TensorView seq_lens,
                    TensorView block_table, TensorView topk_indices, bool sorted_by_score, bool positions,
                    int64_t /*max_seq_len*/) {
  const ffi_dsa::IndexerArgs args =
      ffi_dsa::CheckIndexerArgs(q, k_cache, weights, seq_lens, block_table, topk_indices, kDLCPU);
  cpu::RunIndexerCpu(args, sorted_by_score, positions);
}

// Decode's checks on shapes and dtypes alone, for callers that validate before any buffer exists
// (JAX under jit turns C++ errors into opaque runtime errors, so it asks first).
void TopkIndexerCheckShapes(Array<Array<int64_t>> shapes, Array<DLDataType> dtypes) {
  const auto m = ffi_dsa::ShapeArgMetas(ffi_dsa::kArgNames, shapes, dtypes);
  ffi_dsa::CheckIndexerMeta(m[0], m[1], m[2], m[3], m[4], m[5]);
}

// Decode over MXFP4 pages (docs/contract.md §9): decode's attributes, q's scales after q.
void Mxfp4TopkIndexerCpu(TensorView q, TensorView q_scale, TensorView k_cache, TensorView weights,
                         TensorView seq_lens, TensorView block_table, TensorView topk_indices, bool sorted_by_score,
                         bool positions, int64_t /*max_seq_len*/) {
  const ffi_dsa::Mxfp4Args args =
      ffi_dsa::CheckMxfp4Args(q, q_scale, k_cache, weights, seq_lens, block_table, topk_indices, kDLCPU);
  cpu::RunMxfp4Cpu(args, sorted_by_score, positions);
}

void Mxfp4TopkIndexerCheckShapes(Array<Array<int64_t>> shapes, Array<DLDataType> dtypes) {
  const auto m = ffi_dsa::ShapeArgMetas(ffi_dsa::kMxfp4ArgNames, shapes, dtypes);
  ffi_dsa::CheckMxfp4Meta(m[0], m[1], m[2], m[3], m[4], m[5], m[6]);
}

// Prefill (docs/contract.md §8): a chunk of query rows over a contiguous key buffer.
void PrefillTopkIndexerCpu(TensorView q, TensorView k, TensorView k_scale, TensorView weights, TensorView ks,
                           TensorView ke, TensorView topk_indices, bool sorted_by_score, bool absolute_ids) {
  const ffi_dsa::PrefillArgs args =
      ffi_dsa::CheckPrefillArgs(q, k, k_scale, weights, ks, ke, topk_indices, kDLCPU);
  cpu::RunPrefillCpu(args, sorted_by_score, absolute_ids);
}

void PrefillTopkIndexerCheckShapes(Array<Array<int64_t>> shapes, Array<DLDataType> dtypes) {
  const auto m = ffi_dsa::ShapeArgMetas(ffi_dsa::kPrefillArgNames, shapes, dtypes);
  ffi_dsa::CheckPrefillMeta(m[0], m[1], m[2], m[3], m[4], m[5], m[6]);
}

// contract.h's layout constants as the compiled module holds them. ffi_dsa/contract.py reads the
// header as text (importing it loads nothing native); tests/test_package.py checks that it reads
// what the compiler did.
tvm::ffi::Map<tvm::ffi::String, int64_t> ContractConstants() {
  return {{"num_heads", ffi_dsa::kNumHeads},      {"num_heads_narrow", ffi_dsa::kNumHeadsNarrow},
          {"max_queries", ffi_dsa::kMaxQueries},  {"head_dim", ffi_dsa::kHeadDim},
          {"page_tokens", ffi_dsa::kPageTokens},  {"token_bytes", ffi_dsa::kTokenBytes},
          {"page_fp8_bytes", ffi_dsa::kPageFp8Bytes}, {"page_bytes", ffi_dsa::kPageBytes},
          {"max_topk", ffi_dsa::kMaxTopK},
          {"mxfp4_block", ffi_dsa::kMxfp4Block},  {"mxfp4_blocks", ffi_dsa::kMxfp4Blocks},
          {"mxfp4_head_bytes", ffi_dsa::kMxfp4HeadBytes},
          {"mxfp4_token_bytes", ffi_dsa::kMxfp4TokenBytes},
          {"mxfp4_page_value_bytes", ffi_dsa::kMxfp4PageValueBytes},
          {"mxfp4_page_bytes", ffi_dsa::kMxfp4PageBytes},
          {"ue8m0_bias", ffi_dsa::kUe8m0Bias},    {"ue8m0_nan", ffi_dsa::kUe8m0NaN}};
}

// mxfp4_e2m1.h's E2M1 magnitudes by code (0, 0.5, ..., 6), for the same check.
Array<double> ContractE2M1Magnitudes() {
  Array<double> values;
  for (const float v : ffi_dsa::kE2M1Magnitudes) values.push_back(v);
  return values;
}

// contract.h's names of each op's `ids` values (default first), for the same check.
tvm::ffi::Map<String, Array<String>> ContractIds() {
  auto names = [](const char* const (&ids)[2]) { return Array<String>{String(ids[0]), String(ids[1])}; };
  return {{"topk_indexer", names(ffi_dsa::kDecodeIds)},
          {"mxfp4_topk_indexer", names(ffi_dsa::kDecodeIds)},  // decode's selection, so decode's ids
          {"prefill_topk_indexer", names(ffi_dsa::kPrefillIds)}};
}

// The scoring variant of later calls: "auto" (the best this CPU supports) or one of
// cpu_kernels(). Returns the previous setting ("auto" or a name), so a caller can restore it;
// an unknown or unsupported name raises and changes nothing.
String SetCpuKernel(String name) {
  const std::string requested(name);
  int setting = cpu::kAutoKernel;
  if (requested != "auto") {
    const auto kernel = cpu::ParseCpuKernel(requested);
    if (!kernel) {
      std::string expected = "auto";
      for (const char* known : cpu::kCpuKernelNames) expected += std::string(", ") + known;
      TVM_FFI_THROW(ValueError) << "unknown CPU kernel '" << requested << "': expected one of " << expected;
    }
    if (!cpu::CpuKernelSupported(*kernel)) {
      TVM_FFI_THROW(ValueError) << "CPU kernel '" << requested << "' needs instructions this CPU lacks";
    }
    setting = static_cast<int>(*kernel);
  }
  const int previous = cpu::ForcedCpuKernel().exchange(setting);
  return String(previous == cpu::kAutoKernel ? "auto" : cpu::CpuKernelName(static_cast<cpu::CpuKernel>(previous)));
}

String CpuKernelInEffect() { return String(cpu::CpuKernelName(cpu::ActiveCpuKernel())); }

Array<String> CpuKernels() {
  Array<String> names;
  for (const cpu::CpuKernel k : cpu::SupportedCpuKernels()) names.push_back(String(cpu::CpuKernelName(k)));
  return names;
}

// Threads of later calls; 0 returns to FFI_DSA_NUM_THREADS or every core.
void SetCpuThreads(int64_t threads) {
  if (threads < 0) TVM_FFI_THROW(ValueError) << "threads must be >= 0, got " << threads;
  // (capped by ThreadCount, with FFI_DSA_NUM_THREADS; the int conversion must not wrap first)
  cpu::RequestedCpuThreads().store(static_cast<int>(std::min<int64_t>(threads, INT32_MAX)));
}

// The CUDA archs the sources hold kernels for (cuda_archs.h), by nvcc's names.
Array<String> CudaArchs() {
  Array<String> names;
  for (const ffi_dsa::CudaArch& arch : ffi_dsa::kCudaArchs) names.push_back(String(arch.name));
  return names;
}

// The scratch a CUDA decode call of these shapes takes on `arch`'s kernels, for JAX's trace time.
int64_t WorkspaceBytes(String arch, int64_t query_rows, int64_t max_pages) {
  for (const ffi_dsa::CudaArch& known : ffi_dsa::kCudaArchs) {
    if (std::string(arch) == known.name) return known.decode_workspace_bytes(query_rows, max_pages);
  }
  TVM_FFI_THROW(ValueError) << "no ffi_dsa kernels for the CUDA arch '" << std::string(arch) << "'";
}

}  // namespace

// Each op: DPS, (inputs..., output, scalar attrs) with no Optional arguments, the shape JAX's FFI
// needs; and its checks on shapes and dtypes alone.
// positions is ids="positions"; max_seq_len <= 0 is "unknown".
TVM_FFI_DLL_EXPORT_TYPED_FUNC(topk_indexer, TopkIndexerCpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(topk_indexer_check_shapes, TopkIndexerCheckShapes);
// MXFP4 pages: decode's attributes.
TVM_FFI_DLL_EXPORT_TYPED_FUNC(mxfp4_topk_indexer, Mxfp4TopkIndexerCpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(mxfp4_topk_indexer_check_shapes, Mxfp4TopkIndexerCheckShapes);
// absolute_ids is ids="absolute".
TVM_FFI_DLL_EXPORT_TYPED_FUNC(prefill_topk_indexer, PrefillTopkIndexerCpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(prefill_topk_indexer_check_shapes, PrefillTopkIndexerCheckShapes);

TVM_FFI_DLL_EXPORT_TYPED_FUNC(contract_constants, ContractConstants);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(contract_ids, ContractIds);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(contract_e2m1_magnitudes, ContractE2M1Magnitudes);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(cuda_archs, CudaArchs);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(workspace_bytes, WorkspaceBytes);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(set_cpu_kernel, SetCpuKernel);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(cpu_kernel, CpuKernelInEffect);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(cpu_kernels, CpuKernels);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(set_cpu_threads, SetCpuThreads);
