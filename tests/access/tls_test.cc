// TLS and mutual TLS on kvarenad's TCP listeners, through the real daemon, the client
// library and the kvarena CLI, with certificates made by openssl at test time; and the
// flag combinations that stop the daemon at start.
#include <sys/wait.h>

#include "absl/strings/str_join.h"
#include "kvarena/client.h"
#include "tests/access/tcp_fixture.h"
#include "tests/daemon/rpc_test_util.h"
#include "tests/support/status_matchers.h"

namespace kvarena {
namespace {

using grpc::StatusCode;
using ::testing::HasSubstr;

class TlsTest : public TcpDaemonTest {
 protected:
  void StartTls() { Start({"--tls_cert=" + pki().server_cert, "--tls_key=" + pki().server_key}); }
  void StartMutualTls() {
    Start({"--tls_cert=" + pki().server_cert, "--tls_key=" + pki().server_key,
           "--tls_client_ca=" + pki().ca});
  }
  ClientOptions TlsOptions() const {
    ClientOptions o;
    o.tls_ca_file = pki().ca;
    o.connect_timeout = absl::Seconds(10);
    return o;
  }
};

TEST_F(TlsTest, ServesTlsAndRefusesPlaintext) {
  StartTls();
  EXPECT_THAT(daemon_->Log(), HasSubstr(" tcp=tls "));
  EXPECT_TRUE(Ping(TcpChannel(Tls(pki().ca))).ok());
  EXPECT_THAT(Ping(TcpChannel(grpc::InsecureChannelCredentials())),
              StatusIs(StatusCode::UNAVAILABLE));
  // The Unix socket stays plaintext.
  EXPECT_TRUE(Ping(daemon_->NewChannel()).ok());
}

TEST_F(TlsTest, RefusesAClientThatTrustsAnotherCa) {
  StartTls();
  EXPECT_THAT(Ping(TcpChannel(Tls(pki().other_ca))), StatusIs(StatusCode::UNAVAILABLE));
}

TEST_F(TlsTest, MutualTlsRefusesClientsWithoutACertificateOrWithAForeignOne) {
  StartMutualTls();
  EXPECT_THAT(daemon_->Log(), HasSubstr(" tcp=mtls "));
  EXPECT_THAT(Ping(TcpChannel(Tls(pki().ca))), StatusIs(StatusCode::UNAVAILABLE));
  EXPECT_THAT(Ping(TcpChannel(Tls(pki().ca, pki().other_client_cert, pki().other_client_key))),
              StatusIs(StatusCode::UNAVAILABLE));
  EXPECT_TRUE(Ping(TcpChannel(Tls(pki().ca, pki().client_cert, pki().client_key))).ok());
}

TEST_F(TlsTest, ClientLibraryConnectsWithMutualTlsAndAttaches) {
  StartMutualTls();
  ClientOptions o = TlsOptions();
  EXPECT_THAT(Client::Connect(tcp_address(), o), testing::StatusIs(absl::StatusCode::kUnavailable));
  o.tls_cert_file = pki().client_cert;
  o.tls_key_file = pki().client_key;
  absl::StatusOr<std::shared_ptr<Client>> client = Client::Connect(tcp_address(), o);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_FALSE((*client)->session_id().empty());
  EXPECT_TRUE((*client)->Ping().ok());
  auto cache = (*client)->Allocate(CacheSpec{1, 1, 4, DType::kFloat32, 4, {}, 0, ""});
  EXPECT_TRUE(cache.ok()) << cache.status();
}

TEST_F(TlsTest, TargetNameOverrideChoosesTheNameTheCertificateMustCarry) {
  StartTls();
  ClientOptions o = TlsOptions();
  o.attach = false;
  o.tls_target_name = "localhost";  // the DNS name, reached at 127.0.0.1
  absl::StatusOr<std::shared_ptr<Client>> client = Client::Connect(tcp_address(), o);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->Ping().ok());
  o.tls_target_name = "kvarena.example";  // a name the certificate does not carry
  client = Client::Connect(tcp_address(), o);
  ASSERT_TRUE(client.ok()) << client.status();  // no session: nothing is called yet
  EXPECT_THAT((*client)->Ping(), testing::StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(TlsTest, CliConnectsWithTheTlsFlags) {
  StartMutualTls();
  const std::vector<std::string> base = {KVARENA_CLI_PATH, "--address=" + tcp_address(),
                                         "--tls_ca_file=" + pki().ca};
  std::vector<std::string> with_cert = base;
  with_cert.insert(with_cert.end(), {"--tls_cert_file=" + pki().client_cert,
                                     "--tls_key_file=" + pki().client_key, "health"});
  std::string out;
  int status = RunCommand(with_cert, &out);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_THAT(out, HasSubstr("SERVING"));

  std::vector<std::string> without_cert = base;
  without_cert.push_back("health");
  status = RunCommand(without_cert, &out);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << out;
  EXPECT_THAT(out, HasSubstr("UNAVAILABLE"));
}

TEST_F(TlsTest, BadFlagCombinationsStopTheDaemonNamingTheFlag) {
  const std::string cert = "--tls_cert=" + pki().server_cert;
  const std::string key = "--tls_key=" + pki().server_key;
  const std::string tcp = "--listen=unix:" + sockets_.path() + "/k.sock,127.0.0.1:0";
  const std::string unix_only = "--listen=unix:" + sockets_.path() + "/k.sock";
  struct Case {
    std::vector<std::string> flags;
    std::string says;
  };
  const Case cases[] = {
      {{tcp, key}, "--tls_key needs --tls_cert"},
      {{tcp, cert}, "--tls_cert needs --tls_key"},
      {{tcp, "--tls_client_ca=" + pki().ca}, "--tls_client_ca needs --tls_cert"},
      {{tcp, "--auth_token_file=" + pki().token_file}, "--auth_token_file needs --tls_cert"},
      {{unix_only, cert, key}, "--tls_cert is set but --listen has no HOST:PORT address"},
      {{tcp, "--tls_cert=" + sockets_.path() + "/missing.pem", key},
       "--tls_cert=" + sockets_.path() + "/missing.pem: cannot read"},
      {{tcp, "--tls_cert=" + pki().server_key, key}, "holds no PEM CERTIFICATE block"},
      {{tcp, cert, "--tls_key=" + pki().server_cert}, "holds no PEM PRIVATE KEY block"},
      {{tcp, cert, key, "--auth_token_file=" + pki().ca}, "--auth_token_file="},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrJoin(c.flags, " "));
    std::vector<std::string> argv = {KVARENAD_PATH, "--backend=host"};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    std::string out;
    const int status = RunCommand(argv, &out);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
    EXPECT_THAT(out, HasSubstr(c.says));
  }
}

}  // namespace
}  // namespace kvarena
