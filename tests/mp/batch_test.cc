// The batched local path across processes: kvarena_batch_worker processes decode several
// caches each through one DecodeBatch over their mapping of a real kvarenad's pool,
// checking every output against the float64 reference; a worker SIGKILLed between a
// step's Plan and Commit leaks no page.
#include <regex>
#include <set>

#include "gtest/gtest.h"
#include "tests/mp/mp_fixture.h"

namespace kvarena::testing {
namespace {

class BatchWorkersTest : public MultiProcessTest {
 protected:
  std::unique_ptr<Subprocess> StartBatchWorker(uint64_t index,
                                               const std::vector<std::string>& flags) {
    std::vector<std::string> all = {absl::StrCat("--seed=", uint64_t{seed_} + index)};
    all.insert(all.end(), flags.begin(), flags.end());
    return StartProgram(KVARENA_BATCH_WORKER_PATH, all);
  }
  static std::vector<std::string> CacheIds(const std::string& out) {
    std::vector<std::string> ids;
    const std::regex re("allocated cache (\\S+)");
    for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
         ++it) {
      ids.push_back((*it)[1]);
    }
    return ids;
  }
};

// Two workers, four caches each, 40 steps: every output matches (the worker checks), the
// decode made one Commit per step and about one Reserve per page, and every page returns.
TEST_F(BatchWorkersTest, TwoWorkersDecodeTheirBatchesAndFreeEverything) {
  StartDaemon();
  const int64_t before = WaitForArenaPages([](int64_t) { return true; });
  auto a = StartBatchWorker(1, {"--batch=4", "--steps=40"});
  auto b = StartBatchWorker(2, {"--batch=4", "--steps=40"});
  ExpectExitsOk(*a, "batch worker 1");
  ExpectExitsOk(*b, "batch worker 2");
  for (Subprocess* w : {a.get(), b.get()}) {
    const std::string out = w->output();
    EXPECT_NE(out.find("batch worker ok"), std::string::npos) << out;
    std::smatch m;
    ASSERT_TRUE(
        std::regex_search(out, m, std::regex("reserve (\\d+) commit (\\d+) describe (\\d+)")))
        << out;
    // Prefill: one reserve and one commit per non-empty cache (3); decode: a commit per
    // step, and a reserve per 4-token page (the batch tops up caches out of phase).
    EXPECT_EQ(std::stoi(m[2]), 3 + 40) << out;
    EXPECT_LE(std::stoi(m[1]), 3 + 40 / 4 + 2) << out;
    EXPECT_EQ(std::stoi(m[3]), 0) << out;
  }
  EXPECT_EQ(WaitForArenaPages([&](int64_t p) { return p == before; }), before);
}

// Killed mid-decode — holding reserved pages, perhaps between a Plan and its Commit — the
// worker's caches and pages come back once --session_grace runs out.
TEST_F(BatchWorkersTest, KilledBatchWorkerLeaksNoPages) {
  StartDaemon("1s");
  const int64_t before = WaitForArenaPages([](int64_t) { return true; });
  auto victim = StartBatchWorker(3, {"--batch=6", "--steps=0", "--print_every=5"});
  ASSERT_TRUE(victim->WaitForOutput("decode step", kEventBound)) << victim->output();
  const std::vector<std::string> ids = CacheIds(victim->output());
  ASSERT_EQ(ids.size(), 6u) << victim->output();
  EXPECT_GT(WaitForArenaPages([](int64_t) { return true; }), before);
  victim->Signal(SIGKILL);
  ASSERT_TRUE(victim->Wait(kEventBound).ok());
  EXPECT_EQ(WaitForArenaPages([&](int64_t p) { return p == before; }), before);
  for (const std::string& id : ids) {
    EXPECT_EQ(Observer()->CacheStats(id).status().code(), absl::StatusCode::kNotFound) << id;
  }
}

}  // namespace
}  // namespace kvarena::testing
