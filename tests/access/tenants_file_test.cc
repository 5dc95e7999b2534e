// --tenants_file: the file's rules (Tenants::Parse, Authenticate), kvarenad refusing to
// start on a bad file or a bad combination, and tenants' tokens over TLS. (StatusIs here
// is rpc_test_util's, for grpc::Status: absl statuses are checked by code and message.)
#include "daemon/tenants.h"
#include "tests/access/tcp_fixture.h"
#include "tests/access/tenant_fixture.h"
#include "tests/daemon/rpc_test_util.h"

namespace kvarena {
namespace {

using Code = absl::StatusCode;
using ::testing::HasSubstr;

// Token files "named" by their contents: "short" is too short, "missing" unreadable.
absl::StatusOr<std::string> FakeToken(absl::string_view what, const std::string& path) {
  if (path == "missing") return absl::NotFoundError(absl::StrCat(what, "=missing: no such file"));
  if (path == "short")
    return absl::InvalidArgumentError(absl::StrCat(what, "=short: the token has 5 bytes"));
  return path + "-0123456789abcdef";
}

absl::StatusOr<Tenants> Parse(const std::string& text) {
  return Tenants::Parse("/etc/tenants", text, FakeToken);
}

TEST(TenantsFileTest, ParsesNamesTokensAndRoles) {
  absl::StatusOr<Tenants> t = Parse(
      "# comment\n\n  alice a max_sessions=3 max_caches=4 max_pages=50  # trailing\n"
      "ops\to role=operator\n"
      "bob b max_metadata_bytes=16Mi\ncarol c max_metadata_bytes=65536\n");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->all().size(), 4u);
  const Tenant& alice = t->all()[0];
  EXPECT_EQ(alice.name, "alice");
  EXPECT_EQ(alice.token, "a-0123456789abcdef");
  EXPECT_FALSE(alice.operator_role);
  EXPECT_EQ(alice.max_sessions, 3);
  EXPECT_EQ(alice.max_caches, 4);
  EXPECT_EQ(alice.max_pages, 50);
  EXPECT_EQ(t->all()[1].max_pages, 0);  // none given: no bound
  EXPECT_TRUE(t->all()[1].operator_role);
  EXPECT_EQ(alice.max_metadata_bytes, 0u);  // none given: an equal share (core)
  EXPECT_EQ(t->all()[2].max_metadata_bytes, uint64_t{16} << 20);
  EXPECT_EQ(t->all()[3].max_metadata_bytes, 65536u);
}

TEST(TenantsFileTest, RefusesABadLineNamingIt) {
  const struct {
    const char* text;
    Code code;
    const char* message;
  } kCases[] = {
      {"alice\n", Code::kInvalidArgument, "line 1: expected 'NAME TOKEN_FILE"},
      {"ok a\nal/ice b\n", Code::kInvalidArgument, "line 2: tenant name 'al/ice'"},
      {"alice a max_pages=0\n", Code::kInvalidArgument, "line 1: unknown option 'max_pages=0'"},
      {"alice a max_caches=-1\n", Code::kInvalidArgument, "unknown option 'max_caches=-1'"},
      {"alice a max_caches=9999999999999999999\n", Code::kInvalidArgument,
       "unknown option 'max_caches=9999"},
      {"alice a max_pages=10x\n", Code::kInvalidArgument, "unknown option 'max_pages=10x'"},
      {"alice a max_sessions=0\n", Code::kInvalidArgument, "unknown option 'max_sessions=0'"},
      {"alice a max_sessions=x\n", Code::kInvalidArgument, "unknown option 'max_sessions=x'"},
      {"alice a max_metadata_bytes=0\n", Code::kInvalidArgument,
       "unknown option 'max_metadata_bytes=0'"},
      {"alice a max_metadata_bytes=-1\n", Code::kInvalidArgument,
       "unknown option 'max_metadata_bytes=-1'"},
      {"alice a max_metadata_bytes=1Zi\n", Code::kInvalidArgument,
       "unknown option 'max_metadata_bytes=1Zi'"},
      {"alice a max_metadata_bytes=99999999999999999999\n", Code::kInvalidArgument,
       "unknown option 'max_metadata_bytes=9999"},
      {"alice a role=admin\n", Code::kInvalidArgument, "unknown option 'role=admin'"},
      {"alice a\nalice b\n", Code::kInvalidArgument, "line 2: tenant 'alice' is listed twice"},
      {"alice a\nbob a\n", Code::kInvalidArgument,
       "line 2: tenant 'bob' has the token of an earlier line"},
      {"\n\nalice short\n", Code::kInvalidArgument, "line 3: token file=short"},
      {"alice missing\n", Code::kNotFound, "line 1: token file=missing"},
      {"# nobody\n", Code::kInvalidArgument, "lists no tenant"},
  };
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.text);
    const absl::Status s = Parse(c.text).status();
    EXPECT_EQ(s.code(), c.code);
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message));
  }
}

TEST(TenantsFileTest, AuthenticateFindsTheTenantOfTheBearerToken) {
  absl::StatusOr<Tenants> t = Parse("alice a\nbob b\n");
  ASSERT_TRUE(t.ok());
  absl::StatusOr<const Tenant*> bob = t->Authenticate("Bearer b-0123456789abcdef");
  ASSERT_TRUE(bob.ok());
  EXPECT_EQ((*bob)->name, "bob");
  EXPECT_EQ(t->Authenticate(std::nullopt).status().code(), Code::kUnauthenticated);
  for (const char* wrong : {"b-0123456789abcdef", "Bearer b-0123456789abcde", "Bearer ", ""}) {
    SCOPED_TRACE(wrong);
    EXPECT_EQ(t->Authenticate(wrong).status().code(), Code::kUnauthenticated);
  }
}

// kvarenad exits at start, and its log says why.
void ExpectRefusedAtStart(std::vector<std::string> flags, const std::string& message) {
  DaemonProcess d(std::move(flags));
  ASSERT_TRUE(d.WaitExit(absl::Seconds(10)).has_value()) << d.Log();
  EXPECT_THAT(d.Log(), HasSubstr(message));
}

TEST(TenantsStartTest, ABadFileOrCombinationStopsKvarenad) {
  TempDir dir;
  WriteTestFile(dir, "good.token", std::string(kAliceToken) + "\n");
  WriteTestFile(dir, "short.token", "tooshort\n");
  const std::string bad = WriteTestFile(dir, "bad", "alice good.token\nbob short.token\n");
  ExpectRefusedAtStart({"--tenants_file=" + bad},
                       "line 2: token file=" + dir.path() + "/short.token");
  const std::string twice = WriteTestFile(dir, "twice", "alice good.token\nbob good.token\n");
  ExpectRefusedAtStart({"--tenants_file=" + twice},
                       "line 2: tenant 'bob' has the token of an earlier line");
  ExpectRefusedAtStart({"--tenants_file=" + dir.path() + "/absent"}, "--tenants_file=");
  const std::string good = WriteTestFile(dir, "good", "alice good.token\n");
  ExpectRefusedAtStart({"--tenants_file=" + good, "--listen=unix:" + dir.path() + "/s,127.0.0.1:0"},
                       "--tenants_file with a HOST:PORT listener needs --tls_cert");
}

class TenantsTcpTest : public TcpDaemonTest {};

TEST_F(TenantsTcpTest, TenantTokensGuardTheTlsListenerToo) {
  WriteTestFile(sockets_, "alice.token", std::string(kAliceToken) + "\n");
  const std::string tenants = WriteTestFile(sockets_, "tenants", "alice alice.token\n");
  ExpectRefusedAtStart({"--listen=unix:" + sockets_.path() + "/s,127.0.0.1:0",
                        "--tls_cert=" + pki().server_cert, "--tls_key=" + pki().server_key,
                        "--auth_token_file=" + pki().token_file, "--tenants_file=" + tenants},
                       "--tenants_file and --auth_token_file exclude each other");
  Start({"--tls_cert=" + pki().server_cert, "--tls_key=" + pki().server_key,
         "--tenants_file=" + tenants});
  const auto channel = TcpChannel(Tls(pki().ca));
  EXPECT_THAT(Ping(channel), StatusIs(grpc::StatusCode::UNAUTHENTICATED));
  EXPECT_TRUE(Ping(channel, std::string("Bearer ") + kAliceToken).ok());
}

}  // namespace
}  // namespace kvarena
