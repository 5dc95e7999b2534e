#include "tests/stress/stress_fixture.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kvarena::testing {

int64_t EnvCount(const char* name, int64_t fallback) {
  const char* env = std::getenv(name);
  int64_t n = 0;
  if (env != nullptr && absl::SimpleAtoi(env, &n) && n > 0) return n;
  return fallback;
}

Report ParseReports(const std::string& output, const std::string& tag) {
  Report sum;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (!absl::ConsumePrefix(&line, tag + " ")) continue;
    for (absl::string_view field : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      const std::pair<std::string, std::string> kv = absl::StrSplit(field, absl::MaxSplits('=', 1));
      int64_t n = 0;
      if (absl::SimpleAtoi(kv.second, &n)) sum[kv.first] += n;
    }
  }
  return sum;
}

void AddReport(const Report& from, Report* to) {
  for (const auto& [k, n] : from) (*to)[k] += n;
}

std::string FormatReport(const Report& r) {
  std::string out;
  for (const auto& [k, n] : r) absl::StrAppend(&out, out.empty() ? "" : " ", k, "=", n);
  return out;
}

std::vector<HeldCache> ParseHeldCaches(const std::string& output) {
  std::vector<HeldCache> held;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (!absl::ConsumePrefix(&line, "cache ")) continue;
    const std::vector<std::string> f = absl::StrSplit(line, ' ');
    HeldCache c;
    if (f.size() != 5 || f[1] != "pool" || f[3] != "pages" || !absl::SimpleAtoi(f[2], &c.pool_id)) {
      ADD_FAILURE() << "bad cache line: " << line;
      continue;
    }
    c.cache_id = f[0];
    if (f[4] != "-") {
      for (absl::string_view p : absl::StrSplit(f[4], ',')) {
        int32_t id = 0;
        EXPECT_TRUE(absl::SimpleAtoi(p, &id)) << line;
        c.pages.push_back(id);
      }
    }
    held.push_back(std::move(c));
  }
  return held;
}

std::unique_ptr<Subprocess> StressTest::StartStressWorker(uint64_t index,
                                                          const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {KVARENA_STRESS_WORKER_PATH, "--address=" + address(),
                                   absl::StrCat("--seed=", uint64_t{seed_} + index)};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto p = std::make_unique<Subprocess>();
  EXPECT_TRUE(p->Start(argv).ok());
  return p;
}

void StressTest::ExpectLine(Subprocess& worker, const std::string& line, const std::string& name) {
  ASSERT_TRUE(worker.WaitForOutput(line, StressBound()))
      << name << " never printed \"" << line << "\"; output:\n"
      << worker.output();
}

int StressTest::DaemonFds() {
  int n = 0;
  DIR* dir = opendir(absl::StrCat("/proc/", daemon().pid(), "/fd").c_str());
  if (dir == nullptr) return -1;
  while (dirent* e = readdir(dir)) n += e->d_name[0] != '.';
  closedir(dir);
  return n;
}

int64_t StressTest::DaemonRssKiB() {
  std::ifstream statm(absl::StrCat("/proc/", daemon().pid(), "/statm"));
  int64_t size = 0, resident = -1;
  statm >> size >> resident;
  return resident < 0 ? -1 : resident * (sysconf(_SC_PAGESIZE) / 1024);
}

void StressTest::ExpectArenaEmpty(const std::string& when) {
  const bool empty = WaitForArena(
      [](const ArenaStats& st) {
        return st.pages.pages_used == 0 && st.num_caches == 0 && st.num_sessions == 0 &&
               st.scratch_regions == 0;
      },
      StressBound());
  auto st = Observer()->Stats();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_TRUE(empty) << when << ": pages_used " << st->pages.pages_used << ", caches "
                     << st->num_caches << ", sessions " << st->num_sessions << ", scratch regions "
                     << st->scratch_regions;
}

}  // namespace kvarena::testing
