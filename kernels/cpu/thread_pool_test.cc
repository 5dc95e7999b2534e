#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
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

// The first index to run holds its thread until another index runs elsewhere: a pool
// that spread nothing would leave it waiting (the 60 s bound only keeps such a failure
// from hanging the test; a pool that spreads lets it go at once).
TEST_F(ThreadPoolTest, SpreadsWorkOverWorkers) {
  ThreadPool pool(3);
  std::mutex mu;
  std::condition_variable cv;
  int inside = 0, most = 0;
  bool first_taken = false;
  pool.ParallelFor(64, [&](int64_t) {
    std::unique_lock<std::mutex> lock(mu);
    most = std::max(most, ++inside);
    cv.notify_all();
    if (!first_taken) {
      first_taken = true;
      cv.wait_for(lock, std::chrono::seconds(60), [&] { return most > 1; });
    }
    --inside;
  });
  EXPECT_GT(most, 1);
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

// However long idle workers stay awake (none, the default spin, spinning then yielding),
// loops run every index once: back to back, after a gap longer than a short awake time
// (workers asleep) or within a long one (workers yielding), from several callers; and the
// pool goes down at once while its workers are awake (a hang would be a timeout).
TEST_F(ThreadPoolTest, EveryAwakeTimeRunsEveryIndexAndStops) {
  using std::chrono::microseconds;
  for (microseconds awake : {microseconds(0), ThreadPool::kDefaultAwake, microseconds(20000)}) {
    SCOPED_TRACE(::testing::Message() << "awake=" << awake.count() << "us");
    {
      ThreadPool pool(2, awake);
      for (int rep = 0; rep < 20; ++rep) {
        EXPECT_TRUE(AllOnce(RunCounts(pool, 1 + rep % 9)));
        if (rep % 4 == 3) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      std::vector<std::thread> callers;
      std::atomic<int> failures{0};
      for (int c = 0; c < 3; ++c) {
        callers.emplace_back([&] {
          for (int rep = 0; rep < 50; ++rep) {
            if (!AllOnce(RunCounts(pool, 1 + rep % 13))) failures.fetch_add(1);
          }
        });
      }
      for (std::thread& t : callers) t.join();
      EXPECT_EQ(failures.load(), 0);
    }
    ThreadPool fresh(2, awake);
    EXPECT_TRUE(AllOnce(RunCounts(fresh, 5)));  // then destroyed with its workers awake
  }
}

TEST_F(ThreadPoolTest, NestedParallelForCompletes) {
  ThreadPool pool(2);
  std::atomic<int> total{0};
  pool.ParallelFor(8, [&](int64_t) { pool.ParallelFor(8, [&](int64_t) { total.fetch_add(1); }); });
  EXPECT_EQ(total.load(), 64);
}

}  // namespace
}  // namespace kvarena
