// The kvarena CLI binary against a live kvarenad: stats (table and JSON), caches (every
// page of them, client-chosen ids escaped), health.
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "kvarena/v1/kvarena.pb.h"
#include "tests/mp/mp_fixture.h"
#include "tests/support/kv_history.h"
#include "tests/support/status_matchers.h"

namespace kvarena::testing {
namespace {

using ::testing::HasSubstr;

class CliTest : public MultiProcessTest {
 protected:
  void SetUp() override {
    MultiProcessTest::SetUp();
    StartDaemon();
  }
  CommandResult Cli(std::vector<std::string> args) {
    args.insert(args.begin(), {KVARENA_CLI_PATH, "--address=" + address()});
    auto r = RunCommand(args);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : CommandResult{};
  }
  // A cache with no session (it outlives this client), holding `tokens` tokens per layer.
  void AllocateCache(const std::string& id, int tokens) {
    CacheSpec spec;
    spec.num_layers = 3;
    spec.num_kv_heads = 2;
    spec.head_dim = 32;
    spec.dtype = DType::kFloat16;
    spec.layer_windows = {0, 8, 0};
    auto cache = Observer()->Allocate(spec, id);
    ASSERT_THAT(cache, IsOk());
    std::mt19937_64 rng(1);
    for (int layer = 0; layer < 3; ++layer) {
      HostTensor k = RandomTensor(rng, DType::kFloat16, 2, tokens, 32);
      HostTensor v = RandomTensor(rng, DType::kFloat16, 2, tokens, 32);
      ASSERT_THAT((*cache)->append(layer, k.arg(), v.arg()), IsOk());
    }
  }
};

TEST_F(CliTest, StatsJsonMatchesTheArena) {
  AllocateCache("cli-a", 40);
  CommandResult r = Cli({"stats", "--json"});
  ASSERT_TRUE(r.exited_ok()) << r.output;
  v1::StatsResponse m;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.output, &m).ok()) << r.output;
  auto st = Observer()->Stats();
  ASSERT_THAT(st, IsOk());
  EXPECT_EQ(int64_t(m.pages().pages_used()), st->pages.pages_used);
  EXPECT_GT(m.pages().pages_used(), 0u);
  EXPECT_EQ(m.num_caches(), 1u);
  EXPECT_EQ(m.backend(), "host");
  ASSERT_EQ(m.pools_size(), 1);
  EXPECT_EQ(m.pools(0).head_dim(), 32u);
  EXPECT_THAT(r.output, HasSubstr("\"pages_used\""));  // proto field names
}

TEST_F(CliTest, StatsOfOneCache) {
  AllocateCache("cli-b", 20);
  CommandResult r = Cli({"stats", "--cache=cli-b", "--json"});
  ASSERT_TRUE(r.exited_ok()) << r.output;
  v1::PageStats m;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.output, &m).ok()) << r.output;
  EXPECT_EQ(m.seq_len(), 20u);
  EXPECT_EQ(m.layers_total(), 3u);
  EXPECT_EQ(m.layers_sliding(), 1u);
  EXPECT_GT(m.pages_used(), 0u);

  CommandResult table = Cli({"stats", "--cache=cli-b"});
  ASSERT_TRUE(table.exited_ok()) << table.output;
  EXPECT_THAT(table.output, HasSubstr("cache cli-b"));

  CommandResult missing = Cli({"stats", "--cache=no-such-cache"});
  EXPECT_FALSE(missing.exited_ok());
  EXPECT_THAT(missing.output, HasSubstr("NOT_FOUND"));
}

TEST_F(CliTest, StatsTableShowsPagesAndPools) {
  AllocateCache("cli-c", 17);
  CommandResult r = Cli({"stats"});
  ASSERT_TRUE(r.exited_ok()) << r.output;
  EXPECT_THAT(r.output, HasSubstr("pages"));
  EXPECT_THAT(r.output, HasSubstr("used "));
  EXPECT_THAT(r.output, HasSubstr("POOL"));
  EXPECT_THAT(r.output, HasSubstr("float16"));
}

TEST_F(CliTest, CachesListsEachCache) {
  AllocateCache("cli-d", 33);
  CommandResult r = Cli({"caches"});
  ASSERT_TRUE(r.exited_ok()) << r.output;
  EXPECT_THAT(r.output, HasSubstr("CACHE_ID"));
  EXPECT_THAT(r.output, HasSubstr("cli-d"));
  EXPECT_THAT(r.output, HasSubstr("float16"));
  EXPECT_THAT(r.output, HasSubstr("33"));

  CommandResult j = Cli({"caches", "--json"});
  ASSERT_TRUE(j.exited_ok()) << j.output;
  v1::ListCachesResponse m;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(j.output, &m).ok()) << j.output;
  ASSERT_EQ(m.caches_size(), 1);
  EXPECT_EQ(m.caches(0).cache_id(), "cli-d");
  EXPECT_EQ(m.caches(0).seq_len(), 33u);
}

// Cache ids are the client's choice: the table shows control characters as \xNN (no
// escape sequence reaches the operator's terminal), and --json escapes them as JSON does.
TEST_F(CliTest, CachesEscapesControlCharactersInIds) {
  const std::string id = "red\x1b[31m\nline";
  AllocateCache(id, 5);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"caches"}, std::vector<std::string>{"stats", "--cache=" + id}}) {
    CommandResult r = Cli(args);
    ASSERT_TRUE(r.exited_ok()) << r.output;
    EXPECT_THAT(r.output, HasSubstr("red\\x1b[31m\\x0aline"));
    EXPECT_EQ(r.output.find('\x1b'), std::string::npos) << r.output;
  }
  CommandResult j = Cli({"caches", "--json"});
  ASSERT_TRUE(j.exited_ok()) << j.output;
  EXPECT_EQ(j.output.find('\x1b'), std::string::npos) << j.output;
  v1::ListCachesResponse m;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(j.output, &m).ok()) << j.output;
  ASSERT_EQ(m.caches_size(), 1);
  EXPECT_EQ(m.caches(0).cache_id(), id);
}

// More caches than the daemon's default ListCaches page (1000): the CLI follows the pages.
TEST_F(CliTest, CachesListsEveryPage) {
  CacheSpec spec;
  spec.num_layers = 1;
  spec.num_kv_heads = 1;
  spec.head_dim = 8;
  spec.dtype = DType::kFloat32;
  for (int i = 0; i < 1005; ++i)
    ASSERT_THAT(Observer()->Allocate(spec, absl::StrCat("p", i)), IsOk());
  CommandResult j = Cli({"caches", "--json"});
  ASSERT_TRUE(j.exited_ok()) << j.output.substr(0, 1000);
  v1::ListCachesResponse m;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(j.output, &m).ok());
  std::set<std::string> ids;
  for (const v1::CacheInfo& c : m.caches()) ids.insert(c.cache_id());
  EXPECT_EQ(m.caches_size(), 1005);
  EXPECT_EQ(ids.size(), 1005u);
}

TEST_F(CliTest, HealthServingExitsZero) {
  CommandResult r = Cli({"health"});
  EXPECT_TRUE(r.exited_ok()) << r.output;
  EXPECT_THAT(r.output, HasSubstr("SERVING"));
}

TEST_F(CliTest, HealthWithoutDaemonExitsNonZero) {
  auto r = RunCommand({KVARENA_CLI_PATH, "--address=unix:" + dir() + "/nobody.sock", "health"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->exited_ok()) << r->output;
  EXPECT_THAT(r->output, HasSubstr("kvarena daemon unavailable"));
}

TEST_F(CliTest, UnknownCommandIsUsageError) {
  CommandResult r = Cli({"frobnicate"});
  EXPECT_FALSE(r.exited_ok());
  EXPECT_THAT(r.output, HasSubstr("Usage"));
}

}  // namespace
}  // namespace kvarena::testing
