#include "tests/access/tcp_fixture.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kvarena/v1/kvarena.grpc.pb.h"

namespace kvarena {
namespace {

// Runs openssl with args; its output on failure.
absl::Status Openssl(std::vector<std::string> args) {
  args.insert(args.begin(), KVARENA_OPENSSL);
  std::string out;
  const int status = RunCommand(args, &out);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(absl::StrJoin(args, " "), " failed:\n", out));
}

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A P-256 key and a certificate request for `subject`, in dir/name.key and dir/name.csr.
absl::Status KeyAndRequest(const std::string& dir, const std::string& name,
                           const std::string& subject) {
  return Openssl({"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                  "-keyout", dir + "/" + name + ".key", "-out", dir + "/" + name + ".csr", "-subj",
                  subject});
}

// A self-signed CA in dir/name.pem and dir/name.key.
absl::Status MakeCa(const std::string& dir, const std::string& name) {
  return Openssl({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                  "-nodes", "-days", "2", "-keyout", dir + "/" + name + ".key", "-out",
                  dir + "/" + name + ".pem", "-subj", "/CN=kvarena test " + name, "-addext",
                  "basicConstraints=critical,CA:TRUE", "-addext",
                  "keyUsage=critical,keyCertSign,cRLSign"});
}

// dir/name.pem: dir/name.csr signed by CA `ca` with the extensions in `ext`.
absl::Status Sign(const std::string& dir, const std::string& name, const std::string& ca,
                  const std::string& ext, int serial) {
  const std::string ext_file = dir + "/" + name + ".ext";
  WriteFile(ext_file, ext);
  return Openssl({"x509", "-req", "-in", dir + "/" + name + ".csr", "-CA", dir + "/" + ca + ".pem",
                  "-CAkey", dir + "/" + ca + ".key", "-set_serial", absl::StrCat(serial), "-days",
                  "2", "-extfile", ext_file, "-out", dir + "/" + name + ".pem"});
}

absl::StatusOr<TestPki> MakePki(const std::string& dir) {
  constexpr char kServerExt[] =
      "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
      "basicConstraints=CA:FALSE\n";
  constexpr char kClientExt[] = "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n";
  for (absl::Status s :
       {MakeCa(dir, "ca"), MakeCa(dir, "other_ca"), KeyAndRequest(dir, "server", "/CN=localhost"),
        KeyAndRequest(dir, "client", "/CN=kvarena test client"),
        KeyAndRequest(dir, "other_client", "/CN=kvarena foreign client"),
        Sign(dir, "server", "ca", kServerExt, 2), Sign(dir, "client", "ca", kClientExt, 3),
        Sign(dir, "other_client", "other_ca", kClientExt, 4)}) {
    if (!s.ok()) return s;
  }
  TestPki pki;
  pki.ca = dir + "/ca.pem";
  pki.server_cert = dir + "/server.pem";
  pki.server_key = dir + "/server.key";
  pki.client_cert = dir + "/client.pem";
  pki.client_key = dir + "/client.key";
  pki.other_ca = dir + "/other_ca.pem";
  pki.other_client_cert = dir + "/other_client.pem";
  pki.other_client_key = dir + "/other_client.key";
  pki.token_file = dir + "/token";
  WriteFile(pki.token_file, absl::StrCat(kToken, "\n"));
  return pki;
}

}  // namespace

const absl::StatusOr<TestPki>& SharedPki() {
  static TempDir* const dir = new TempDir;  // lives until the process exits
  static const auto* const pki = new absl::StatusOr<TestPki>(MakePki(dir->path()));
  return *pki;
}

void TcpDaemonTest::SetUp() {
  if (access(KVARENA_OPENSSL, X_OK) != 0) {
    GTEST_SKIP() << "no openssl command at " << KVARENA_OPENSSL
                 << " (scripts/setup-deps installs it)";
  }
  ASSERT_TRUE(SharedPki().ok()) << SharedPki().status();
}

void TcpDaemonTest::Start(std::vector<std::string> flags) {
  daemon_.reset();
  flags.insert(flags.begin(), "--listen=unix:" + sockets_.path() + "/kvarena.sock,127.0.0.1:0");
  daemon_ = std::make_unique<DaemonProcess>(std::move(flags));
  ASSERT_TRUE(daemon_->WaitServing()) << daemon_->Log();
  const std::string log = daemon_->Log();
  const size_t on = log.find(" on unix:");
  const size_t at = on == std::string::npos ? on : log.find(",127.0.0.1:", on);
  ASSERT_NE(at, std::string::npos) << log;
  port_ = std::atoi(log.c_str() + at + std::strlen(",127.0.0.1:"));
  ASSERT_GT(port_, 0) << log;
}

std::string TcpDaemonTest::tcp_address() const { return absl::StrCat("127.0.0.1:", port_); }

std::shared_ptr<grpc::Channel> TcpDaemonTest::TcpChannel(
    const std::shared_ptr<grpc::ChannelCredentials>& credentials) const {
  grpc::ChannelArguments args;
  static std::atomic<int> next{0};
  args.SetInt("kvarena.test.channel", next++);  // a connection of its own
  return grpc::CreateCustomChannel(tcp_address(), credentials, args);
}

std::shared_ptr<grpc::ChannelCredentials> TcpDaemonTest::Tls(const std::string& ca,
                                                             const std::string& cert,
                                                             const std::string& key) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = ReadFile(ca);
  if (!cert.empty()) {
    o.pem_cert_chain = ReadFile(cert);
    o.pem_private_key = ReadFile(key);
  }
  return grpc::SslCredentials(o);
}

grpc::Status TcpDaemonTest::Ping(const std::shared_ptr<grpc::Channel>& channel,
                                 const std::string& authorization) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
  v1::PingResponse resp;
  return v1::KvCacheService::NewStub(channel)->Ping(&ctx, v1::PingRequest(), &resp);
}

}  // namespace kvarena
