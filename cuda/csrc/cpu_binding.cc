// CPU module: checks the arguments once (validate.h) and forwards to the CPU path.
// Every export carries its type schema (tvm-ffi's function metadata): ffi_dsa/_native.py's typed
// stubs are checked against it by tests/test_native_stubs.py, so the two cannot drift apart.
#define TVM_FFI_DLL_EXPORT_INCLUDE_METADATA 1
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <string>

#include "ffi_dsa/cpu/indexer_cpu.h"
#include "ffi_dsa/cpu/prefill_cpu.h"
#include "ffi_dsa/validate.h"
#include "ffi_dsa/validate_prefill.h"
#include "ffi_dsa/workspace_bytes.h"

namespace {

using tvm::ffi::Array;
using tvm::ffi::String;
using tvm::ffi::TensorView;
namespace cpu = ffi_dsa::cpu;

void TopkIndexerCpu(TensorView q, TensorView k_cache, TensorView weights, TensorView seq_lens,
                    TensorView block_table, TensorView topk_indices, bool sorted_by_score) {
  const ffi_dsa::IndexerArgs args =
      ffi_dsa::CheckIndexerArgs(q, k_cache, weights, seq_lens, block_table, topk_indices, kDLCPU);
  ffi_dsa::cpu::RunIndexerCpu(args, sorted_by_score);
}

ffi_dsa::ArgMeta Meta(const char* name, const Array<int64_t>& shape, DLDataType dtype) {
  ffi_dsa::ArgMeta m;
  m.name = name;
  m.shape.assign(shape.begin(), shape.end());
  m.dtype = dtype;
  return m;
}

// The same checks on shapes and dtypes alone, for callers that validate before any buffer exists
// (JAX under jit turns C++ errors into opaque runtime errors, so it asks first).
void CheckShapes(Array<int64_t> q, DLDataType q_dtype, Array<int64_t> k_cache, DLDataType k_dtype,
                 Array<int64_t> weights, DLDataType w_dtype, Array<int64_t> seq_lens, DLDataType s_dtype,
                 Array<int64_t> block_table, DLDataType bt_dtype, Array<int64_t> topk_indices,
                 DLDataType out_dtype) {
  const auto& names = ffi_dsa::kArgNames;
  ffi_dsa::CheckIndexerMeta(Meta(names[0], q, q_dtype), Meta(names[1], k_cache, k_dtype),
                            Meta(names[2], weights, w_dtype), Meta(names[3], seq_lens, s_dtype),
                            Meta(names[4], block_table, bt_dtype), Meta(names[5], topk_indices, out_dtype));
}

// contract.h's layout constants, so that Python (ffi_dsa/contract.py) reads them instead of
// writing them down a second time.
tvm::ffi::Map<tvm::ffi::String, int64_t> ContractConstants() {
  return {{"num_heads", ffi_dsa::kNumHeads},      {"num_heads_narrow", ffi_dsa::kNumHeadsNarrow},
          {"max_queries", ffi_dsa::kMaxQueries},  {"head_dim", ffi_dsa::kHeadDim},
          {"page_tokens", ffi_dsa::kPageTokens},  {"token_bytes", ffi_dsa::kTokenBytes},
          {"page_fp8_bytes", ffi_dsa::kPageFp8Bytes}, {"page_bytes", ffi_dsa::kPageBytes},
          {"max_topk", ffi_dsa::kMaxTopK}};
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

// Prefill (docs/contract.md §8): a chunk of query rows over a contiguous key buffer.
void PrefillTopkIndexerCpu(TensorView q, TensorView k, TensorView k_scale, TensorView weights, TensorView ks,
                           TensorView ke, TensorView topk_indices, bool sorted_by_score, bool absolute_ids) {
  const ffi_dsa::PrefillArgs args =
      ffi_dsa::CheckPrefillArgs(q, k, k_scale, weights, ks, ke, topk_indices, kDLCPU);
  cpu::RunPrefillCpu(args, sorted_by_score, absolute_ids);
}

// CheckShapes for prefill: the kernel's checks on shapes and dtypes alone, for JAX's trace time.
void CheckPrefillShapes(Array<int64_t> q, DLDataType q_dtype, Array<int64_t> k, DLDataType k_dtype,
                        Array<int64_t> k_scale, DLDataType scale_dtype, Array<int64_t> weights, DLDataType w_dtype,
                        Array<int64_t> ks, DLDataType ks_dtype, Array<int64_t> ke, DLDataType ke_dtype,
                        Array<int64_t> topk_indices, DLDataType out_dtype) {
  const auto& names = ffi_dsa::kPrefillArgNames;
  ffi_dsa::CheckPrefillMeta(Meta(names[0], q, q_dtype), Meta(names[1], k, k_dtype),
                            Meta(names[2], k_scale, scale_dtype), Meta(names[3], weights, w_dtype),
                            Meta(names[4], ks, ks_dtype), Meta(names[5], ke, ke_dtype),
                            Meta(names[6], topk_indices, out_dtype));
}

}  // namespace

// DPS: (inputs..., output, scalar attrs) with no Optional arguments, the shape JAX's FFI needs.
TVM_FFI_DLL_EXPORT_TYPED_FUNC(topk_indexer, TopkIndexerCpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(check_shapes, CheckShapes);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(contract_constants, ContractConstants);
// The scratch bytes a CUDA call of these shapes may take (workspace_bytes.h), for JAX's trace time.
TVM_FFI_DLL_EXPORT_TYPED_FUNC(workspace_bytes, ffi_dsa::WorkspaceBytes);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(set_cpu_kernel, SetCpuKernel);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(cpu_kernel, CpuKernelInEffect);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(cpu_kernels, CpuKernels);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(set_cpu_threads, SetCpuThreads);

// DPS like topk_indexer: (inputs..., output, scalar attrs); absolute_ids is ids="absolute".
TVM_FFI_DLL_EXPORT_TYPED_FUNC(prefill_topk_indexer, PrefillTopkIndexerCpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(prefill_check_shapes, CheckPrefillShapes);
