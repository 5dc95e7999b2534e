// --auth_token_file: every call on a TCP listener (KvCacheService, health, reflection)
// needs `authorization: Bearer <token>`; Unix-socket calls need none. Through the real
// daemon, the client library and the kvarena CLI; and the client's option checks.
#include <grpcpp/generic/generic_stub.h>
#include <sys/wait.h>

#include "grpc/health/v1/health.grpc.pb.h"
#include "kvarena/client.h"
#include "tests/access/tcp_fixture.h"
#include "tests/daemon/rpc_test_util.h"
#include "tests/support/status_matchers.h"

namespace kvarena {
namespace {

using grpc::StatusCode;
using ::testing::HasSubstr;

const std::string kBearer = std::string("Bearer ") + kToken;

grpc::Status Health(const std::shared_ptr<grpc::Channel>& channel,
                    const std::string& authorization) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
  grpc::health::v1::HealthCheckResponse resp;
  return grpc::health::v1::Health::NewStub(channel)->Check(
      &ctx, grpc::health::v1::HealthCheckRequest(), &resp);
}

// A server-reflection stream that sends no request and half-closes: OK once admitted.
grpc::Status Reflection(const std::shared_ptr<grpc::Channel>& channel,
                        const std::string& authorization) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
  grpc::CompletionQueue cq;
  auto call =
      stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag = nullptr;
  bool ok = false;
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  call->WritesDone(reinterpret_cast<void*>(2));
  cq.Next(&tag, &ok);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(3));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

class TokenTest : public TcpDaemonTest {
 protected:
  void SetUp() override {
    TcpDaemonTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    Start({"--tls_cert=" + pki().server_cert, "--tls_key=" + pki().server_key,
           "--auth_token_file=" + pki().token_file});
  }
  std::shared_ptr<grpc::Channel> Tcp() const { return TcpChannel(Tls(pki().ca)); }
  ClientOptions TokenOptions() const {
    ClientOptions o;
    o.tls_ca_file = pki().ca;
    o.auth_token_file = pki().token_file;
    o.connect_timeout = absl::Seconds(10);
    return o;
  }
  int Cli(std::vector<std::string> args, std::string* out) const {
    args.insert(args.begin(),
                {KVARENA_CLI_PATH, "--address=" + tcp_address(), "--tls_ca_file=" + pki().ca});
    const int status = RunCommand(args, out);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
};

TEST_F(TokenTest, EveryServiceRefusesACallWithoutTheToken) {
  EXPECT_THAT(daemon_->Log(), HasSubstr(" tcp=tls+token "));
  EXPECT_THAT(Ping(Tcp()), StatusIs(StatusCode::UNAUTHENTICATED, "authorization: Bearer"));
  EXPECT_THAT(Health(Tcp(), ""), StatusIs(StatusCode::UNAUTHENTICATED));
  EXPECT_THAT(Reflection(Tcp(), ""), StatusIs(StatusCode::UNAUTHENTICATED));
}

TEST_F(TokenTest, AWrongTokenIsUnauthenticated) {
  std::string same_length = kBearer;
  same_length.back() ^= 1;
  for (const std::string& wrong : {same_length, kBearer + "0", kBearer.substr(0, 10),
                                   std::string(kToken), std::string("Basic ") + kToken}) {
    SCOPED_TRACE(wrong);
    EXPECT_THAT(Ping(Tcp(), wrong), StatusIs(StatusCode::UNAUTHENTICATED, "does not match"));
  }
}

TEST_F(TokenTest, TheTokenAdmitsEveryService) {
  EXPECT_TRUE(Ping(Tcp(), kBearer).ok());
  EXPECT_TRUE(Health(Tcp(), kBearer).ok());
  EXPECT_TRUE(Reflection(Tcp(), kBearer).ok());
}

TEST_F(TokenTest, UnixSocketCallsNeedNoToken) {
  EXPECT_TRUE(Ping(daemon_->NewChannel()).ok());
  EXPECT_TRUE(Health(daemon_->NewChannel(), "").ok());
}

TEST_F(TokenTest, ClientLibraryAttachesWithTheToken) {
  absl::StatusOr<std::shared_ptr<Client>> client = Client::Connect(tcp_address(), TokenOptions());
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_FALSE((*client)->session_id().empty());
  EXPECT_TRUE((*client)->Ping().ok());
  EXPECT_TRUE((*client)->Stats().ok());

  ClientOptions inline_token = TokenOptions();
  inline_token.auth_token_file.clear();
  inline_token.auth_token = kToken;
  EXPECT_TRUE(Client::Connect(tcp_address(), inline_token).ok());
}

TEST_F(TokenTest, ClientLibraryWithoutTheRightTokenIsUnauthenticated) {
  ClientOptions none = TokenOptions();
  none.auth_token_file.clear();
  EXPECT_THAT(Client::Connect(tcp_address(), none),
              testing::StatusIs(absl::StatusCode::kUnauthenticated));
  ClientOptions wrong = none;
  wrong.auth_token = std::string(kToken) + "x";
  EXPECT_THAT(Client::Connect(tcp_address(), wrong),
              testing::StatusIs(absl::StatusCode::kUnauthenticated));
}

TEST_F(TokenTest, CliSendsTheTokenFromItsFile) {
  std::string out;
  EXPECT_EQ(Cli({"--auth_token_file=" + pki().token_file, "health"}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("SERVING"));
  EXPECT_EQ(Cli({"--auth_token_file=" + pki().token_file, "stats"}, &out), 0) << out;
  EXPECT_EQ(Cli({"health"}, &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("UNAUTHENTICATED"));
}

TEST(ClientOptionsTest, TlsAndTokenOptionsMustFitTogetherAndTheAddress) {
  struct Case {
    std::string address;
    ClientOptions options;
    absl::StatusCode code;
    std::string says;
  };
  ClientOptions tls;
  tls.tls_ca_file = "/nonexistent/ca.pem";
  ClientOptions token;
  token.auth_token = kToken;
  ClientOptions cert_only = tls;
  cert_only.tls_cert_file = "/nonexistent/c.pem";
  ClientOptions both_tokens = tls;
  both_tokens.auth_token = kToken;
  both_tokens.auth_token_file = "/nonexistent/token";
  ClientOptions name_only;
  name_only.tls_target_name = "localhost";
  const Case cases[] = {
      {"unix:/tmp/k.sock", tls, absl::StatusCode::kInvalidArgument, "apply to HOST:PORT"},
      {"inproc:", token, absl::StatusCode::kInvalidArgument, "not inproc:"},
      {"127.0.0.1:1", token, absl::StatusCode::kInvalidArgument, "auth_token needs tls_ca_file"},
      {"127.0.0.1:1", name_only, absl::StatusCode::kInvalidArgument, "need tls_ca_file"},
      {"127.0.0.1:1", cert_only, absl::StatusCode::kInvalidArgument,
       "tls_cert_file needs tls_key_file"},
      {"127.0.0.1:1", both_tokens, absl::StatusCode::kInvalidArgument, "not both"},
      {"127.0.0.1:1", tls, absl::StatusCode::kNotFound,
       "tls_ca_file=/nonexistent/ca.pem: cannot read"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.says);
    absl::StatusOr<std::shared_ptr<Client>> client = Client::Connect(c.address, c.options);
    EXPECT_THAT(client, testing::StatusIs(c.code));
    EXPECT_THAT(std::string(client.status().message()), HasSubstr(c.says));
  }
}

}  // namespace
}  // namespace kvarena
