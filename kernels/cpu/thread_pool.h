// A fixed set of worker threads that run ParallelFor loops for the CPU kernels.
//
// Thread-safe: several threads may call ParallelFor at once; their loops share the
// workers. ParallelFor returns when every index has run. The calling thread works too,
// so a pool of 0 threads runs everything inline.
#ifndef KVARENA_KERNELS_CPU_THREAD_POOL_H_
#define KVARENA_KERNELS_CPU_THREAD_POOL_H_

#include <cstdint>
#include <functional>

namespace kvarena {

class ThreadPool {
 public:
  // num_threads workers besides the caller; <0 means hardware_concurrency()-1.
  explicit ThreadPool(int num_threads = -1);
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
