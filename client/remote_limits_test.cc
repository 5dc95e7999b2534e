// A remote client's own refusals, against FakeKvService (a gRPC server in this process
// that counts what reaches it): a request past ClientOptions::max_message_bytes is refused
// before it is serialized and never arrives; a fork() child's inherited client refuses
// every call and leaves the parent's connection alone, and a child may not connect anew
// (gRPC's runtime is the parent's).
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvarena/client.h"
#include "kvarena/v1/kvarena.grpc.pb.h"
#include "tests/support/status_matchers.h"
#include "tests/support/temp_dir.h"

namespace kvarena {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::IsOk;
using testing::StatusIs;

constexpr size_t kLimit = size_t{64} << 10;  // the smallest max_message_bytes Connect takes
constexpr int kHeads = 2;
constexpr int kHeadDim = 16;

// A one-layer float32 cache of kHeads x kHeadDim, field by field (a partial braced
// initializer draws GCC's -Wmissing-field-initializers).
CacheSpec OneLayerSpec() {
  CacheSpec spec;
  spec.num_layers = 1;
  spec.num_kv_heads = kHeads;
  spec.head_dim = kHeadDim;
  spec.dtype = DType::kFloat32;
  return spec;
}

// Answers Allocate, Append, Attend, SetTokens and Ping as a daemon would for a float32
// cache of kHeads x kHeadDim, and counts the calls that reached it.
class FakeKvService final : public v1::KvCacheService::Service {
 public:
  std::atomic<int> allocates{0}, appends{0}, attends{0}, set_tokens{0}, pings{0};

  grpc::Status Allocate(grpc::ServerContext*, const v1::AllocateRequest* req,
                        v1::AllocateResponse* resp) override {
    ++allocates;
    v1::CacheInfo* c = resp->mutable_cache();
    c->set_cache_id("fake");
    *c->mutable_spec() = req->spec();
    c->mutable_spec()->set_page_size(4);
    for (uint32_t l = 0; l < req->spec().num_layers(); ++l) c->add_layer_lens(0);
    return grpc::Status::OK;
  }
  grpc::Status Append(grpc::ServerContext*, const v1::AppendRequest* req,
                      v1::AppendResponse* resp) override {
    ++appends;
    resp->set_layer_len(req->pos() + uint64_t(req->k().shape(2)));
    resp->set_seq_len(resp->layer_len());
    return grpc::Status::OK;
  }
  grpc::Status Attend(grpc::ServerContext*, const v1::AttendRequest* req,
                      v1::AttendResponse* resp) override {
    ++attends;
    *resp->mutable_out() = req->q();
    return grpc::Status::OK;
  }
  grpc::Status SetTokens(grpc::ServerContext*, const v1::SetTokensRequest*,
                         v1::SetTokensResponse* resp) override {
    ++set_tokens;
    resp->mutable_cache()->set_cache_id("fake");
    return grpc::Status::OK;
  }
  grpc::Status Ping(grpc::ServerContext*, const v1::PingRequest*, v1::PingResponse*) override {
    ++pings;
    return grpc::Status::OK;
  }
};

// float32 [1, heads, tokens, kHeadDim], all ones.
struct Floats {
  Floats(int heads, int64_t tokens)
      : values(size_t(heads * tokens * kHeadDim), 1.0f), shape{1, heads, tokens, kHeadDim} {}
  TensorArg arg() const {
    return TensorArg{DType::kFloat32, shape, values.data(), values.size() * sizeof(float)};
  }
  std::vector<float> values;
  std::vector<int64_t> shape;
};

// Runs `child` in a fork() child of this process and returns its exit code: 0 when it
// returned true, 1 when false, -1 when it did not exit (killed: the alarm after 30 s
// rather than a hung test).
int RunInChild(const std::function<bool()>& child) {
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(30);
    _exit(child() ? 0 : 1);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// In a child: whether s has `code` and a message containing `text`; says why not on stderr.
bool ChildExpects(const absl::Status& s, absl::StatusCode code, const std::string& text) {
  if (s.code() == code && absl::StrContains(s.message(), text)) return true;
  std::fprintf(stderr, "child: want %s with \"%s\", got %s\n",
               absl::StatusCodeToString(code).c_str(), text.c_str(), s.ToString().c_str());
  return false;
}

class RemoteLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    address_ = absl::StrCat("unix:", dir_.path(), "/fake.sock");
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address_, grpc::InsecureServerCredentials());
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    client_ = Connect();
    ASSERT_NE(client_, nullptr);
    auto h = client_->Allocate(OneLayerSpec());
    ASSERT_THAT(h, IsOk());
    cache_ = *h;
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  // A client of the fake daemon: no session (the fake has no Attach), so every tensor
  // travels inline, under kLimit.
  std::shared_ptr<Client> Connect() {
    ClientOptions options;
    options.attach = false;
    options.max_message_bytes = kLimit;
    auto c = Client::Connect(address_, options);
    return c.ok() ? *c : nullptr;
  }

  TempDir dir_;
  std::string address_;
  FakeKvService service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<Client> client_;
  std::shared_ptr<GenericKvCacheHandle> cache_;
};

TEST_F(RemoteLimitsTest, CallsWithinTheLimitAreSent) {
  const Floats q(kHeads, 4), kv(kHeads, 4);  // 512 bytes each
  EXPECT_THAT(cache_->append(0, kv.arg(), kv.arg()), IsOk());
  EXPECT_THAT(cache_->attention(0, q.arg(), kv.arg(), kv.arg()), IsOk());
  EXPECT_THAT(cache_->set_tokens(0, std::vector<int32_t>(1000, 7)), IsOk());
  EXPECT_EQ(service_.appends.load(), 1);
  EXPECT_EQ(service_.attends.load(), 1);
  EXPECT_EQ(service_.set_tokens.load(), 1);
}

TEST_F(RemoteLimitsTest, AppendOverTheLimitIsRefusedUnsent) {
  const Floats kv(kHeads, 1024);  // 128 KiB each: k and v alone are 4x the limit
  EXPECT_THAT(cache_->append(0, kv.arg(), kv.arg()),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("AppendRequest"), HasSubstr("262144 bytes"),
                             HasSubstr("max_message_bytes=65536"))));
  EXPECT_EQ(service_.appends.load(), 0);
  EXPECT_EQ(cache_->num_tokens(), 0);
}

TEST_F(RemoteLimitsTest, AttendOverTheLimitIsRefusedUnsent) {
  const Floats q(kHeads, 256), kv(kHeads, 256);  // 32 KiB each, 96 KiB together
  EXPECT_THAT(cache_->attention(0, q.arg(), kv.arg(), kv.arg()),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("AttendRequest"), HasSubstr("98304 bytes"),
                             HasSubstr("max_message_bytes=65536"))));
  EXPECT_EQ(service_.attends.load(), 0);
  EXPECT_EQ(cache_->num_tokens(), 0);
}

// k and v fill the limit exactly (2 x 32 KiB); with the request's own fields they pass
// it: the channel's check of the whole request refuses it.
TEST_F(RemoteLimitsTest, RequestEnvelopeOverTheLimitIsRefusedUnsent) {
  const Floats kv(kHeads, 256);
  ASSERT_EQ(2 * kv.arg().bytes, kLimit);
  EXPECT_THAT(cache_->append(0, kv.arg(), kv.arg()),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("AppendRequest: "), HasSubstr("max_message_bytes=65536"))));
  EXPECT_EQ(service_.appends.load(), 0);
}

TEST_F(RemoteLimitsTest, TokenIdsOverTheLimitAreRefusedUnsent) {
  // 20000 ids of 5 varint bytes each: about 100 KB.
  const std::vector<int32_t> ids(20000, int32_t{1} << 30);
  EXPECT_THAT(cache_->set_tokens(0, ids), StatusIs(absl::StatusCode::kResourceExhausted,
                                                   AllOf(HasSubstr("SetTokensRequest: "),
                                                         HasSubstr("max_message_bytes=65536"))));
  AllocateOptions with_prompt;
  with_prompt.prompt_tokens = ids;
  EXPECT_THAT(client_->Allocate(OneLayerSpec(), "", with_prompt),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("AllocateRequest: ")));
  EXPECT_EQ(service_.set_tokens.load(), 0);
  EXPECT_EQ(service_.allocates.load(), 1);  // SetUp's
}

TEST_F(RemoteLimitsTest, ForkedChildIsRefusedAndTheParentKeepsItsConnection) {
  const Floats kv(kHeads, 4);
  ASSERT_THAT(client_->Ping(), IsOk());
  const std::string parent = absl::StrCat("created in pid ", getpid());
  const int child = RunInChild([&] {
    const std::string used = absl::StrCat("used in pid ", getpid(), " after fork()");
    bool ok = ChildExpects(client_->Ping(), absl::StatusCode::kFailedPrecondition, parent) &&
              ChildExpects(cache_->append(0, kv.arg(), kv.arg()).status(),
                           absl::StatusCode::kFailedPrecondition, used) &&
              ChildExpects(client_->Stats().status(), absl::StatusCode::kFailedPrecondition,
                           "connect anew in the child");
    ok = ok && !client_->connected() && !cache_->is_valid();
    // Dropping them here leaks the transport: its channel is the parent's.
    cache_.reset();
    client_.reset();
    return ok;
  });
  EXPECT_EQ(child, 0);
  EXPECT_EQ(service_.pings.load(), 1);
  EXPECT_EQ(service_.appends.load(), 0);
  EXPECT_TRUE(client_->connected());
  EXPECT_THAT(client_->Ping(), IsOk());
  EXPECT_THAT(cache_->append(0, kv.arg(), kv.arg()), IsOk());
  EXPECT_EQ(service_.appends.load(), 1);
}

// gRPC's runtime cannot be used in a fork() child (remote_transport.cc): Connect says so at
// once, instead of hanging and taking the parent's replies.
TEST_F(RemoteLimitsTest, ForkedChildCannotConnectAndTheParentIsUnharmed) {
  ASSERT_THAT(client_->Ping(), IsOk());
  // The child only asks: a new inproc: store would start threads in a fork() child of a
  // threaded process, which hung under ASan once (its allocator's lock held at the fork).
  const int child = RunInChild([&] {
    ClientOptions options;
    options.attach = false;
    return ChildExpects(Client::Connect(address_, options).status(),
                        absl::StatusCode::kFailedPrecondition, "is a fork() child of pid");
  });
  EXPECT_EQ(child, 0);
  EXPECT_THAT(client_->Ping(), IsOk());
  EXPECT_EQ(service_.pings.load(), 2);
}

TEST(InprocForkTest, ForkedChildIsRefused) {
  auto client = Client::Connect("inproc:");
  ASSERT_THAT(client, IsOk());
  auto cache = (*client)->Allocate(OneLayerSpec());
  ASSERT_THAT(cache, IsOk());
  const Floats kv(kHeads, 4);
  const int child = RunInChild([&] {
    const bool ok =
        ChildExpects((*cache)->append(0, kv.arg(), kv.arg()).status(),
                     absl::StatusCode::kFailedPrecondition, "after fork()") &&
        ChildExpects((*cache)->reserve(1), absl::StatusCode::kFailedPrecondition, "after fork()");
    cache->reset();  // leaked: the store's threads are the parent's
    client->reset();
    return ok;
  });
  EXPECT_EQ(child, 0);
  EXPECT_THAT((*cache)->append(0, kv.arg(), kv.arg()), IsOk());
  EXPECT_EQ((*cache)->num_tokens(), 4);
}

}  // namespace
}  // namespace kvarena
