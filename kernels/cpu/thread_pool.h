// A fixed set of worker threads that run ParallelFor loops for the CPU kernels.
//
// Thread-safe: several threads may call ParallelFor at once; their loops share the
// workers. ParallelFor returns when every index has run. The calling thread works too,
// so a pool of 0 threads runs everything inline.
//
// A worker that runs out of loops, and a caller waiting for workers still inside its
// loop, stay awake for `awake` before they sleep on a condition variable (whose wake-up
// costs tens of microseconds, more on a VM whose idle vCPU the host must wake): they
// spin for the first kPauseSpin of it, then yield the core between checks.
#ifndef KVARENA_KERNELS_CPU_THREAD_POOL_H_
#define KVARENA_KERNELS_CPU_THREAD_POOL_H_

#include <chrono>
#include <cstdint>
#include <functional>

namespace kvarena {

class ThreadPool {
 public:
  static constexpr std::chrono::microseconds kPauseSpin{50};
  static constexpr std::chrono::microseconds kDefaultAwake = kPauseSpin;

  // num_threads workers besides the caller; <0 means hardware_concurrency()-1.
  // A negative awake counts as 0 (sleep at once).
  explicit ThreadPool(int num_threads = -1, std::chrono::microseconds awake = kDefaultAwake);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const;  // workers + the calling thread

  // Runs fn(i) for every i in [0, n), spread over the workers and the caller.
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace kvarena

#endif  // KVARENA_KERNELS_CPU_THREAD_POOL_H_
