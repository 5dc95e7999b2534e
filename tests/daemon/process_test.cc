// kvarenad as a process: flags, the Unix socket's care, start line, TCP, --backend (auto,
// cuda failing fast without a device, cuda serving where one is usable), and the drain on
// SIGTERM (health NOT_SERVING, Attach streams end, exit 0, then UNAVAILABLE).
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/daemon/rpc_test_util.h"
#if defined(KVARENAD_CUDA)
#include "arena/cuda/cuda_region.h"
#endif

namespace kvarena {
namespace {

using grpc::StatusCode;
using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

bool ExitedWith(int status, int code) { return WIFEXITED(status) && WEXITSTATUS(status) == code; }

// Whether kvarenad was built with the CUDA backend, and whether it can use a device here.
#if defined(KVARENAD_CUDA)
bool CudaBuilt() { return true; }
bool CudaUsable() { return CudaDevicePresent(); }
#else
bool CudaBuilt() { return false; }
bool CudaUsable() { return false; }
#endif

// Leaves a socket file at `path` that nothing listens on, as a crashed daemon would.
void MakeStaleSocket(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  path.copy(addr.sun_path, sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(fd);
}

HealthCheckResponse::ServingStatus CheckHealth(DaemonProcess& d, const std::string& service) {
  HealthCheckRequest req;
  req.set_service(service);
  HealthCheckResponse resp;
  grpc::ClientContext ctx;
  const grpc::Status s = Health::NewStub(d.NewChannel())->Check(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp.status();
}

class ProcessTest : public KvarenadTest {};

TEST_F(ProcessTest, HealthServesBothNames) {
  EXPECT_EQ(CheckHealth(*daemon_, ""), HealthCheckResponse::SERVING);
  EXPECT_EQ(CheckHealth(*daemon_, "kvarena.v1.KvCacheService"), HealthCheckResponse::SERVING);
}

TEST_F(ProcessTest, SocketIsGroupReadWriteOnly) {
  struct stat st;
  ASSERT_EQ(stat(daemon_->socket_path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);
}

TEST_F(ProcessTest, PrintsOneStartLine) {
  EXPECT_THAT(daemon_->Log(), HasSubstr("backend=host arena_bytes=67108864 (64Mi)"));
  EXPECT_THAT(daemon_->Log(), HasSubstr("on " + daemon_->address()));
}

TEST_F(ProcessTest, StaleSocketFileIsReplaced) {
  DaemonProcess d({}, MakeStaleSocket);
  EXPECT_TRUE(d.WaitServing()) << d.Log();
}

TEST_F(ProcessTest, MissingSocketDirectoryIsCreated) {
  TempDir dir;
  DaemonProcess d({"--listen=unix:" + dir.path() + "/run/kvarena/kvarena.sock"});
  EXPECT_TRUE(d.WaitServing()) << d.Log();
}

TEST_F(ProcessTest, SecondDaemonOnALiveSocketExitsWithAnError) {
  DaemonProcess second({"--listen=" + daemon_->address()});
  const std::optional<int> status = second.WaitExit(absl::Seconds(10));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(ExitedWith(*status, 1)) << *status;
  EXPECT_THAT(second.Log(), HasSubstr("is serving on " + daemon_->address()));
  EXPECT_EQ(CheckHealth(*daemon_, ""), HealthCheckResponse::SERVING);
}

TEST_F(ProcessTest, ServesTcpBesidesTheSocket) {
  TempDir dir;
  DaemonProcess d({"--listen=unix:" + dir.path() + "/k.sock,127.0.0.1:0"});
  ASSERT_TRUE(d.WaitServing()) << d.Log();
  const std::string log = d.Log();
  const size_t at = log.find("127.0.0.1:");
  ASSERT_NE(at, std::string::npos) << log;
  const int port = std::atoi(log.c_str() + at + 10);
  ASSERT_GT(port, 0) << log;
  auto stub = v1::KvCacheService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  v1::PingResponse resp;
  EXPECT_TRUE(stub->Ping(Ctx().get(), v1::PingRequest(), &resp).ok());
}

TEST_F(ProcessTest, HelpListsEveryFlagWithItsText) {
  std::string out;
  RunCommand({KVARENAD_PATH, "--help"}, &out);
  for (const char* flag :
       {"--listen", "--backend", "--arena_bytes", "--page_size", "--session_grace",
        "--metrics_port", "--metrics_address", "--num_threads", "--fd_socket", "--socket_mode",
        "--socket_group", "--allowed_uids", "--tls_cert", "--tls_key", "--tls_client_ca",
        "--auth_token_file", "--mutex_deadlock_detection", "--cpu_pool_awake"}) {
    EXPECT_THAT(out, HasSubstr(flag));
  }
  EXPECT_THAT(out, HasSubstr("Ki/Mi/Gi"));
  EXPECT_THAT(out, HasSubstr("default: 1Gi"));
}

// Off by default (its cost is per lock); on, abseil checks every lock's order and the
// daemon serves as before.
TEST_F(ProcessTest, ServesWithAbseilDeadlockDetectionOn) {
  StartDaemon({"--mutex_deadlock_detection", "--arena_bytes=64Mi"});
  v1::PingResponse pong;
  EXPECT_TRUE(stub_->Ping(Ctx().get(), v1::PingRequest(), &pong).ok());
  EXPECT_EQ(Stats().num_caches(), 0u);
}

TEST_F(ProcessTest, AutoPicksCudaOnlyWhereADeviceIsUsable) {
  StartDaemon({"--backend=auto", "--arena_bytes=64Mi"});
  const std::string want = CudaUsable() ? "cuda" : "host";
  EXPECT_THAT(daemon_->Log(), HasSubstr("serving backend=" + want + " "));
  EXPECT_EQ(Stats().backend(), want);
}

TEST_F(ProcessTest, CudaBackendFailsFastSayingWhy) {
  if (CudaUsable()) GTEST_SKIP() << "a CUDA device is usable here";
  TempDir dir;
  std::string out;
  const int status = RunCommand(
      {KVARENAD_PATH, "--backend=cuda", "--listen=unix:" + dir.path() + "/k.sock"}, &out);
  EXPECT_TRUE(ExitedWith(status, 1)) << status;
  EXPECT_THAT(out, HasSubstr("--backend=cuda: "));
  EXPECT_THAT(out, HasSubstr(CudaBuilt() ? "no usable CUDA device" : "built without CUDA"));
  EXPECT_THAT(out, HasSubstr("use --backend=host"));
}

// Served path on the device: pages in device memory, written and read by the CUDA kernels.
TEST_F(ProcessTest, CudaBackendServesFromDeviceMemory) {
  if (!CudaUsable()) GTEST_SKIP() << "no usable CUDA device";
  StartDaemon({"--backend=cuda", "--arena_bytes=64Mi"});
  EXPECT_THAT(daemon_->Log(), HasSubstr("serving backend=cuda "));
  const std::string id = Allocate(Spec(2, 2, 64, v1::FLOAT16, 16));
  const v1::Tensor k = RandomTensor(v1::FLOAT16, 2, 21, 64, 1);
  const v1::Tensor v = RandomTensor(v1::FLOAT16, 2, 21, 64, 2);
  ASSERT_TRUE(Append(id, 1, 0, k, v).ok());
  const v1::GetKvResponse got = GetKv(id, 1);
  EXPECT_EQ(got.k().data(), k.data());
  EXPECT_EQ(got.v().data(), v.data());
  const v1::StatsResponse st = Stats();
  EXPECT_EQ(st.backend(), "cuda");
  EXPECT_EQ(st.pages().pages_used(), 2u);
}

TEST_F(ProcessTest, BadByteSizeIsRejectedByName) {
  std::string out;
  const int status = RunCommand({KVARENAD_PATH, "--arena_bytes=12Q"}, &out);
  EXPECT_FALSE(ExitedWith(status, 0));
  EXPECT_THAT(out, HasSubstr("arena_bytes"));
}

// The pool's awake time is bounded; within the bounds the daemon serves as before.
TEST_F(ProcessTest, CpuPoolAwakeIsBoundedAndServes) {
  std::string out;
  EXPECT_FALSE(ExitedWith(RunCommand({KVARENAD_PATH, "--cpu_pool_awake=2s"}, &out), 0));
  EXPECT_THAT(out, HasSubstr("cpu_pool_awake=2s must be in [0, 1s]"));
  EXPECT_FALSE(ExitedWith(RunCommand({KVARENAD_PATH, "--cpu_pool_awake=-1us"}, &out), 0));
  EXPECT_THAT(out, HasSubstr("cpu_pool_awake=-1us must be in [0, 1s]"));
  TempDir dir;
  DaemonProcess d(
      {"--listen=unix:" + dir.path() + "/k.sock", "--cpu_pool_awake=5ms", "--num_threads=1"});
  ASSERT_TRUE(d.WaitServing()) << d.Log();
  EXPECT_EQ(CheckHealth(d, ""), HealthCheckResponse::SERVING);
}

TEST_F(ProcessTest, SigtermGoesNotServingEndsStreamsAndExitsZero) {
  auto health = Health::NewStub(daemon_->NewChannel());
  grpc::ClientContext watch_ctx;
  auto watch = health->Watch(&watch_ctx, HealthCheckRequest());
  HealthCheckResponse seen;
  ASSERT_TRUE(watch->Read(&seen));
  ASSERT_EQ(seen.status(), HealthCheckResponse::SERVING);
  auto attach_stub = v1::KvCacheService::NewStub(daemon_->NewChannel());
  grpc::ClientContext attach_ctx;
  auto attach = attach_stub->Attach(&attach_ctx, v1::AttachRequest());
  v1::AttachEvent event;
  ASSERT_TRUE(attach->Read(&event));

  daemon_->Signal(SIGTERM);
  ASSERT_TRUE(watch->Read(&seen));
  EXPECT_EQ(seen.status(), HealthCheckResponse::NOT_SERVING);
  // gRPC 1.51 keeps Watch streams open through a drain (until its deadline cancels them);
  // a prober that saw NOT_SERVING hangs up, as here.
  watch_ctx.TryCancel();
  watch->Finish();
  EXPECT_FALSE(attach->Read(&event));
  // Ended by the drain itself ("shutting down"), not cut off by its 5 s deadline.
  EXPECT_THAT(attach->Finish(), StatusIs(StatusCode::UNAVAILABLE, "shutting down"));

  const std::optional<int> status = daemon_->WaitExit(absl::Seconds(10));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(ExitedWith(*status, 0)) << *status;
  v1::StatsResponse resp;
  EXPECT_THAT(stub_->Stats(Ctx().get(), v1::StatsRequest(), &resp),
              StatusIs(StatusCode::UNAVAILABLE));
  EXPECT_FALSE(std::filesystem::exists(daemon_->socket_path()));
}

}  // namespace
}  // namespace kvarena
