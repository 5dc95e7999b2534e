// ThreadPool: workers take loops from a shared queue; every loop hands out indices from
// an atomic counter, so the caller and any number of workers can share one loop and any
// number of callers can have loops queued at once.
//
// Decode runs one short loop per layer back to back, so an idle worker stays awake for a
// moment (the pool's `awake`) before it sleeps, and so does a caller waiting for the
// workers still inside its loop: a condition-variable wake-up costs tens of microseconds,
// comparable to a whole loop.
#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace kvarena {

namespace {

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Waits until done() or `awake` has passed, spinning for the first ThreadPool::kPauseSpin
// of it and yielding the core after; returns done().
template <class Done>
bool StayAwakeUntil(Done&& done, std::chrono::microseconds awake) {
  using Clock = std::chrono::steady_clock;
  if (awake <= std::chrono::microseconds(0)) return done();
  const auto start = Clock::now();
  const auto spin = std::min(awake, ThreadPool::kPauseSpin);
  for (int i = 0;; ++i) {
    if (done()) return true;
    CpuRelax();
    if (i % 64 == 63 && Clock::now() - start > spin) break;
  }
  while (Clock::now() - start < awake) {
    if (done()) return true;
    std::this_thread::yield();
  }
  return done();
}

// One ParallelFor call. Lives on the caller's stack until no worker holds it.
struct Loop {
  const std::function<void(int64_t)>* fn = nullptr;
  int64_t n = 0;
  std::atomic<int64_t> next{0};
  // Workers inside RunIndices. Incremented under Impl::mu (so that a loop the caller
  // has unqueued gains none), decremented without it.
  std::atomic<int> holders{0};
};

void RunIndices(Loop& loop) {
  for (int64_t i = loop.next.fetch_add(1, std::memory_order_relaxed); i < loop.n;
       i = loop.next.fetch_add(1, std::memory_order_relaxed)) {
    (*loop.fn)(i);
  }
}

}  // namespace

struct ThreadPool::Impl {
  std::mutex mu;
  std::condition_variable work_cv;  // a loop was queued, or stopping
  std::condition_variable done_cv;  // a worker left a loop
  std::deque<Loop*> loops;          // loops that may still have unclaimed indices
  std::atomic<int> queued{0};       // loops.size(), for spinning without mu
  bool stopping = false;
  std::atomic<bool> stopping_flag{false};
  std::vector<std::thread> workers;
  std::chrono::microseconds awake{0};

  // REQUIRES: mu held.
  void Unqueue(Loop* loop) {
    auto it = std::find(loops.begin(), loops.end(), loop);
    if (it != loops.end()) {
      loops.erase(it);
      queued.store(int(loops.size()), std::memory_order_relaxed);
    }
  }

  void WorkerMain() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      if (loops.empty() && !stopping) {
        lock.unlock();
        StayAwakeUntil(
            [&] {
              return queued.load(std::memory_order_relaxed) > 0 ||
                     stopping_flag.load(std::memory_order_relaxed);
            },
            awake);
        lock.lock();
      }
      work_cv.wait(lock, [&] { return stopping || !loops.empty(); });
      if (stopping) return;
      Loop* loop = loops.front();
      loop->holders.fetch_add(1, std::memory_order_relaxed);
      lock.unlock();
      RunIndices(*loop);
      lock.lock();
      Unqueue(loop);  // every index is claimed now
      // After this the caller may return and destroy *loop; it is not touched again.
      if (loop->holders.fetch_sub(1, std::memory_order_acq_rel) == 1) done_cv.notify_all();
    }
  }
};

ThreadPool::ThreadPool(int num_threads, std::chrono::microseconds awake) : impl_(new Impl) {
  impl_->awake = std::max(awake, std::chrono::microseconds(0));
  if (num_threads < 0) {
    num_threads = std::max(1, int(std::thread::hardware_concurrency())) - 1;
  }
  impl_->workers.reserve(num_threads);
  for (int i = 0; i < num_threads; ++i) {
    impl_->workers.emplace_back([impl = impl_] { impl->WorkerMain(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
    impl_->stopping_flag = true;
  }
  impl_->work_cv.notify_all();
  for (std::thread& t : impl_->workers) t.join();
  delete impl_;
}

int ThreadPool::num_threads() const { return int(impl_->workers.size()) + 1; }

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (n == 1 || impl_->workers.empty()) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  Loop loop;
  loop.fn = &fn;
  loop.n = n;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->loops.push_back(&loop);
    impl_->queued.store(int(impl_->loops.size()), std::memory_order_relaxed);
  }
  if (n - 1 >= int64_t(impl_->workers.size())) {
    impl_->work_cv.notify_all();
  } else {
    for (int64_t i = 0; i < n - 1; ++i) impl_->work_cv.notify_one();
  }
  RunIndices(loop);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->Unqueue(&loop);  // no worker can join the loop from here on
  }
  auto idle = [&] { return loop.holders.load(std::memory_order_acquire) == 0; };
  if (StayAwakeUntil(idle, impl_->awake)) return;
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->done_cv.wait(lock, idle);
}

}  // namespace kvarena
