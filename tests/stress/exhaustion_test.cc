// Arena exhaustion under load: many worker processes append (served and local path) into
// one pool of a 4 MiB arena until each thread has been refused several times. Refusals are
// RESOURCE_EXHAUSTED and nothing else (a worker fails on any other code); nothing is
// corrupted (every worker's get_kv equals what it appended, bit for bit, before and after
// the others' refusals and releases); and service resumes as pages free.
//
// $KVARENA_STRESS_EXHAUSTIONS sets the refusals each thread waits for (default 3).
#include <signal.h>

#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/stress/stress_fixture.h"
#include "tests/support/kv_history.h"

namespace kvarena::testing {
namespace {

constexpr int kWorkers = 6, kThreads = 4;

class ExhaustionTest : public StressTest {
 protected:
  // The workers' geometry (tests/stress/actor.cc kFillGeometry): the same pool.
  static CacheSpec Spec() { return CacheSpec{1, 2, 32, DType::kFloat16, 16, {}, 0, ""}; }
  // Appends one page (16 tokens) to the observer's cache, keeping a copy on success.
  absl::Status AppendPage(GenericKvCacheHandle& cache, KvHistory& copy) {
    HostTensor k = RandomTensor(rng_, DType::kFloat16, 2, 16, 32);
    HostTensor v = RandomTensor(rng_, DType::kFloat16, 2, 16, 32);
    absl::Status s = cache.append(0, k.arg(), v.arg()).status();
    if (s.ok()) copy.Append(k, v);
    return s;
  }
  std::mt19937_64 rng_{seed_};
};

TEST_F(ExhaustionTest, RefusalsAreResourceExhaustedNothingIsCorruptedAndServiceResumes) {
  const int64_t exhaustions = EnvCount("KVARENA_STRESS_EXHAUSTIONS", 3);
  StartDaemonWith({"--arena_bytes=4Mi", "--scratch_bytes=0", "--session_grace=200ms"});
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int i = 0; i < kWorkers; ++i) {
    workers.push_back(StartStressWorker(
        uint64_t(i), {"--mode=fill", absl::StrCat("--threads=", kThreads),
                      absl::StrCat("--exhaustions=", exhaustions), "--ops=100000"}));
  }
  for (int i = 0; i < kWorkers; ++i) {
    ASSERT_NO_FATAL_FAILURE(ExpectLine(*workers[size_t(i)], "holding", absl::StrCat("worker ", i)));
  }

  // With every worker paused, the observer takes what is left page by page: the arena
  // ends full, refusing with RESOURCE_EXHAUSTED.
  auto cache = Observer()->Allocate(Spec());
  ASSERT_TRUE(cache.ok()) << cache.status();
  KvHistory copy(2, 32);
  absl::Status refused;
  for (int i = 0; i <= 1024 && refused.ok(); ++i) refused = AppendPage(**cache, copy);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  const int64_t left_over = copy.len() / 16;
  auto full = Observer()->Stats();
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_EQ(full->pools.size(), 1u);
  EXPECT_EQ(full->pools[0].pages_free, 0);

  // The worker holding the most pages releases everything and exits; nobody else is
  // appending, so the observer's next page fits.
  size_t richest = 0, most = 0;
  for (size_t i = 0; i < workers.size(); ++i) {
    size_t pages = 0;
    for (const HeldCache& c : ParseHeldCaches(workers[i]->output())) pages += c.pages.size();
    if (pages > most) most = pages, richest = i;
  }
  ASSERT_GT(most, 0u);
  workers[richest]->Signal(SIGUSR1);
  ExpectExitsOk(*workers[richest], absl::StrCat("worker ", richest), StressBound());
  EXPECT_TRUE(AppendPage(**cache, copy).ok());
  auto kv = (*cache)->get_kv(0);
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_EQ(kv->k.data, EncodeValues(copy.HeadMajor(0, 0), DType::kFloat16));
  EXPECT_EQ(kv->v.data, EncodeValues(copy.HeadMajor(1, 0), DType::kFloat16));

  Report total;
  for (size_t i = 0; i < workers.size(); ++i) {
    if (i != richest) {
      workers[i]->Signal(SIGUSR1);  // each checks its caches again, then releases them
      ExpectExitsOk(*workers[i], absl::StrCat("worker ", i), StressBound());
    }
    AddReport(ParseReports(workers[i]->output(), "report"), &total);
  }
  int64_t refusals = 0;
  for (const auto& [key, n] : total) {
    if (!absl::StrContains(key, ":")) continue;
    EXPECT_TRUE(absl::EndsWith(key, ":RESOURCE_EXHAUSTED")) << key << "=" << n;
    refusals += n;
  }
  EXPECT_GE(refusals, kWorkers * kThreads * exhaustions) << FormatReport(total);
  const std::string summary = absl::StrCat(
      kWorkers, " processes x ", kThreads, " threads into a 4 MiB arena (",
      full->pools[0].num_pages, " pages): ", FormatReport(total), "; the paused arena had ",
      left_over, " pages left for the observer, then 1 more once a worker released");
  std::cout << "exhaustion: " << summary << std::endl;
  RecordProperty("exhaustion", summary);

  ASSERT_TRUE((*cache)->release().ok());
  ExpectArenaEmpty("after every worker exited");
}

}  // namespace
}  // namespace kvarena::testing
