#include "kernels/cpu/thread_pool.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvarena {
namespace {

class ThreadPoolTest : public ::testing::Test {
 protected:
  // Runs ParallelFor(n) on pool and returns how many times each index ran.
  static std::vector<int> RunCounts(ThreadPool& pool, int64_t n) {
    std::unique_ptr<std::atomic<int>[]> counts(new std::atomic<int>[size_t(n)]);
    for (int64_t i = 0; i < n; ++i) counts[i] = 0;
    pool.ParallelFor(n, [&](int64_t i) { counts[i].fetch_add(1); });
    std::vector<int> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out[i] = counts[i].load();
    return out;
  }
  static bool AllOnce(const std::vector<int>& counts) {
    for (int c : counts) {
      if (c != 1) return false;
    }
    return true;
  }
};

TEST_F(ThreadPoolTest, CountsCallerAsAThread) {
  EXPECT_EQ(ThreadPool(0).num_threads(), 1);
  EXPECT_EQ(ThreadPool(3).num_threads(), 4);
  EXPECT_GE(ThreadPool(-1).num_threads(), 1);
}

TEST_F(ThreadPoolTest, RunsEveryIndexExactlyOnce) {
  for (int workers : {0, 1, 3}) {
    ThreadPool pool(workers);
    for (int64_t n : {0, 1, 2, 7, 1000}) {
      SCOPED_TRACE(::testing::Message() << "workers=" << workers << " n=" << n);
      EXPECT_TRUE(AllOnce(RunCounts(pool, n)));
    }
  }
}

TEST_F(ThreadPoolTest, SpreadsWorkOverWorkers) {
  ThreadPool pool(3);
  std::atomic<int> inside{0}, most{0};
  pool.ParallelFor(64, [&](int64_t) {
    const int now = inside.fetch_add(1) + 1;
    int seen = most.load();
    while (now > seen && !most.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    inside.fetch_sub(1);
  });
  EXPECT_GT(most.load(), 1);
}

TEST_F(ThreadPoolTest, ConcurrentCallersEachGetAllTheirIndices) {
  ThreadPool pool(2);
  constexpr int kCallers = 6;
  std::vector<int> failures(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int rep = 0; rep < 200; ++rep) {
        if (!AllOnce(RunCounts(pool, 1 + (rep * 7 + c) % 50))) ++failures[c];
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(failures[c], 0) << "caller " << c;
}

TEST_F(ThreadPoolTest, NestedParallelForCompletes) {
  ThreadPool pool(2);
  std::atomic<int> total{0};
  pool.ParallelFor(8, [&](int64_t) { pool.ParallelFor(8, [&](int64_t) { total.fetch_add(1); }); });
  EXPECT_EQ(total.load(), 64);
}

}  // namespace
}  // namespace kvarena
