// Helpers for tests that talk to a real kvarenad: a StatusIs matcher for grpc::Status,
// tensor builders, a float64 attention reference, and KvarenadTest, a fixture that starts
// the daemon and offers the few calls test bodies repeat.
#ifndef KVARENA_TESTS_DAEMON_RPC_TEST_UTIL_H_
#define KVARENA_TESTS_DAEMON_RPC_TEST_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvarena/v1/kvarena.grpc.pb.h"
#include "tests/daemon/daemon_process.h"

namespace grpc {
// So gtest prints "NOT_FOUND: cache 'x' not found" instead of the object's bytes.
void PrintTo(const Status& status, std::ostream* os);
}  // namespace grpc

namespace kvarena {

const char* GrpcCodeName(grpc::StatusCode code);

// GET http://127.0.0.1:port/metrics with a bare socket: the whole response, head and body
// ("" on failure). Each send and receive gives up after timeout_s seconds (0: never).
std::string GetMetrics(int port, int timeout_s = 0);

MATCHER_P(StatusIs, code, absl::StrCat(negation ? "isn't " : "is ", GrpcCodeName(code))) {
  return arg.error_code() == code;
}
MATCHER_P2(StatusIs, code, substring,
           absl::StrCat(negation ? "isn't " : "is ", GrpcCodeName(code),
                        " with a message "
                        "containing \"",
                        std::string(substring), "\"")) {
  return arg.error_code() == code &&
         arg.error_message().find(std::string(substring)) != std::string::npos;
}

v1::CacheSpec Spec(int num_layers, int num_kv_heads, int head_dim, v1::DType dtype = v1::FLOAT32,
                   int page_size = 4);

// A [1, heads, tokens, head_dim] float32 tensor with values derived from `seed`.
v1::Tensor F32Tensor(int heads, int tokens, int head_dim, float seed);
// The same shape in any dtype, random finite values as raw bits (for bit-exact checks).
v1::Tensor RandomTensor(v1::DType dtype, int heads, int tokens, int head_dim, uint32_t seed);
std::vector<float> FloatsOf(const v1::Tensor& t);
// Tokens [from, from + n) of a [1, heads, tokens, head_dim] tensor, any dtype.
v1::Tensor SliceTokens(const v1::Tensor& t, int64_t from, int64_t n);

// Causal attention in float64: queries at positions pos.. over keys/values holding
// positions 0.. ([kv_heads, tokens, head_dim] each); q is [q_heads, n, head_dim].
std::vector<float> ReferenceAttention(const std::vector<float>& q, int q_heads, int n,
                                      const std::vector<float>& k, const std::vector<float>& v,
                                      int kv_heads, int tokens, int head_dim, int64_t pos,
                                      double scale);

// The first batch a WatchEvents stream from seq 0 sends on ctx (what the log replays);
// the stream is cancelled after it.
v1::WatchEventsResponse FirstEventsBatch(v1::KvCacheService::Stub* stub, grpc::ClientContext* ctx);

class KvarenadTest : public ::testing::Test {
 protected:
  void SetUp() override { StartDaemon({"--arena_bytes=64Mi"}); }
  // (Re)starts the daemon with these flags and waits until it is SERVING.
  void StartDaemon(std::vector<std::string> flags);

  // A context carrying `session` as kvarena-session metadata ("" = none).
  static std::unique_ptr<grpc::ClientContext> Ctx(const std::string& session = "");

  // Allocates and asserts success; returns the cache id.
  std::string Allocate(const v1::CacheSpec& spec, const std::string& session = "");
  grpc::Status Append(const std::string& id, uint32_t layer, uint64_t pos, const v1::Tensor& k,
                      const v1::Tensor& v, const std::string& session = "",
                      v1::AppendResponse* resp = nullptr);
  // Appends n float32 tokens of `seed` to one layer of a [heads, head_dim] cache.
  grpc::Status AppendF32(const std::string& id, uint32_t layer, uint64_t pos, int n, int heads,
                         int head_dim, float seed, const std::string& session = "");
  v1::StatsResponse Stats(const std::string& cache_id = "");
  v1::DescribeResponse Describe(const std::string& id, const std::string& session = "");
  v1::GetKvResponse GetKv(const std::string& id, uint32_t layer, const std::string& session = "");
  // Opens an Attach stream on its own channel and returns the session id; the stream
  // stays open until the test ends or *context (owned by the fixture) is cancelled.
  std::string Attach(const std::string& client_name, grpc::ClientContext** context = nullptr);

  // What a rejected call must leave unchanged: arena and cache stats, the description and
  // every layer's K/V. Refusal counters are left out: rejections count there by design.
  std::string Snapshot(const std::string& id, const std::string& session = "");

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<v1::KvCacheService::Stub> stub_;

 private:
  struct AttachStream {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::ClientReader<v1::AttachEvent>> reader;
  };
  std::vector<AttachStream> attached_;

 protected:
  void TearDown() override;
};

}  // namespace kvarena

#endif  // KVARENA_TESTS_DAEMON_RPC_TEST_UTIL_H_
