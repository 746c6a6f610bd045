// What every CPU op shares to spread a call over threads: how many (set_cpu_threads,
// FFI_DSA_NUM_THREADS, the cores), a parallel loop over work items, and the calling thread's buffer
// of rank keys, which the workers fill and the selects read.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

#include <tvm/ffi/error.h>

#include "ffi_dsa/contract.h"

namespace ffi_dsa::cpu {

constexpr int kMaxCpuThreads = 1024;  // more would only add start-up cost

// Threads the caller asked for with SetCpuThreads (ffi_dsa.set_cpu_threads); 0 = not set.
inline std::atomic<int>& RequestedCpuThreads() {
  static std::atomic<int> requested{0};
  return requested;
}

// FFI_DSA_NUM_THREADS as a count, 0 when unset or empty. Anything but a whole number >= 1 is refused:
// a typo must not silently become one thread (or every core).
inline int EnvThreads() {
  const char* env = std::getenv("FFI_DSA_NUM_THREADS");
  if (env == nullptr || *env == '\0') return 0;
  long value = 0;
  for (const char* c = env; *c != '\0'; ++c) {
    if (*c < '0' || *c > '9') {
      value = 0;
      break;
    }
    value = std::min<long>(value * 10 + (*c - '0'), kMaxCpuThreads);
  }
  if (value < 1) TVM_FFI_THROW(ValueError) << "FFI_DSA_NUM_THREADS must be a whole number >= 1, got '" << env << "'";
  return static_cast<int>(value);
}

// Threads: set_cpu_threads if set, else FFI_DSA_NUM_THREADS if set (read on every call), else every
// core, at most kMaxCpuThreads whichever it is; small calls stay on the caller's thread because
// starting a thread costs more than scoring a few pages.
inline int ThreadCount(int64_t total_pages) {
  constexpr int64_t kPagesPerThreadMin = 64;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  if (const int from_env = EnvThreads(); from_env > 0) threads = from_env;
  if (const int requested = RequestedCpuThreads().load(std::memory_order_relaxed); requested > 0) threads = requested;
  threads = std::clamp(threads, 1, kMaxCpuThreads);
  return static_cast<int>(std::min<int64_t>(threads, std::max<int64_t>(1, total_pages / kPagesPerThreadMin)));
}

template <typename Fn>
void ParallelFor(int threads, int64_t count, Fn&& fn) {
  if (threads <= 1 || count <= 1) {
    for (int64_t i = 0; i < count; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) fn(i);
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
}

// The calling thread's key buffer, kept between calls: a fresh one (4 bytes a token) would be
// page-faulted and zeroed by the kernel on every call. Every key is written before it is read.
inline std::vector<uint32_t>& CallerKeyBuffer() {
  thread_local std::vector<uint32_t> keys;
  return keys;
}

// Pages (work units of 64 keys) that `tokens` keys take.
inline int64_t PagesOf(int64_t tokens) { return (tokens + kPageTokens - 1) / kPageTokens; }

}  // namespace ffi_dsa::cpu
