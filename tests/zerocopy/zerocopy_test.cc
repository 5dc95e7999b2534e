// The zero-copy data plane through a real kvarenad: Attach names the fd socket and the
// session's regions (and announces new pools), Append / Attend take SharedSlice payloads
// in the caller's scratch region with bit-identical results and tiny requests, and one
// session can reach neither another's scratch fds nor its bytes.
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "arena/fd_passing.h"
#include "client/region_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvarena/client.h"
#include "kvarena/v1/kvarena.grpc.pb.h"
#include "tests/daemon/daemon_process.h"

namespace kvarena {
namespace {

using grpc::StatusCode;

constexpr int kKvHeads = 8, kQHeads = 32, kHeadDim = 128;

// [1, heads, tokens, kHeadDim] float16 with random finite values (raw bits).
v1::Tensor HalfTensor(int heads, int tokens, std::mt19937* rng) {
  std::uniform_int_distribution<int> mantissa(0, 1023), exponent(10, 16), sign(0, 1);
  std::string bytes(size_t(heads) * tokens * kHeadDim * 2, '\0');
  for (size_t i = 0; i < bytes.size(); i += 2) {
    const uint16_t h = uint16_t(sign(*rng) << 15 | exponent(*rng) << 10 | mantissa(*rng));
    std::memcpy(&bytes[i], &h, 2);
  }
  v1::Tensor t;
  for (int64_t d : {1, heads, tokens, kHeadDim}) t.add_shape(d);
  t.set_dtype(v1::FLOAT16);
  t.set_data(std::move(bytes));
  return t;
}

// The client library's view of a wire tensor's bytes.
TensorArg Arg(const v1::Tensor& t) {
  return TensorArg{
      DType::kFloat16, {t.shape().begin(), t.shape().end()}, t.data().data(), t.data().size()};
}

struct Attached {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::KvCacheService::Stub> stub;
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientReader<v1::AttachEvent>> reader;
  v1::AttachEvent first;
  const std::string& session() const { return first.session_id(); }
  uint64_t scratch_id() const {
    for (const v1::RegionDescriptor& r : first.regions()) {
      if (r.scratch()) return r.region_id();
    }
    return 0;
  }
};

class ZeroCopyTest : public ::testing::Test {
 protected:
  void SetUp() override { Start({"--arena_bytes=64Mi", "--num_threads=1"}); }
  void TearDown() override {
    for (auto& a : attached_) a->context->TryCancel();
    attached_.clear();
    daemon_.reset();
  }
  void Start(std::vector<std::string> flags) {
    attached_.clear();
    daemon_ = std::make_unique<DaemonProcess>(std::move(flags));
    ASSERT_TRUE(daemon_->WaitServing()) << daemon_->Log();
    stub_ = v1::KvCacheService::NewStub(daemon_->NewChannel());
  }
  // Opens an Attach stream (its own channel) and reads the first event.
  Attached& Attach(const std::string& name) {
    auto a = std::make_unique<Attached>();
    a->channel = daemon_->NewChannel();
    a->stub = v1::KvCacheService::NewStub(a->channel);
    a->context = std::make_unique<grpc::ClientContext>();
    a->context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    v1::AttachRequest req;
    req.set_client_name(name);
    a->reader = a->stub->Attach(a->context.get(), req);
    EXPECT_TRUE(a->reader->Read(&a->first));
    attached_.push_back(std::move(a));
    return *attached_.back();
  }
  static std::unique_ptr<grpc::ClientContext> Ctx(const std::string& session) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (!session.empty()) ctx->AddMetadata("kvarena-session", session);
    return ctx;
  }
  std::string Allocate(const std::string& session, int head_dim = kHeadDim) {
    v1::AllocateRequest req;
    req.mutable_spec()->set_num_layers(1);
    req.mutable_spec()->set_num_kv_heads(kKvHeads);
    req.mutable_spec()->set_head_dim(head_dim);
    req.mutable_spec()->set_dtype(v1::FLOAT16);
    req.mutable_spec()->set_page_size(16);
    v1::AllocateResponse resp;
    EXPECT_TRUE(stub_->Allocate(Ctx(session).get(), req, &resp).ok());
    return resp.cache().cache_id();
  }
  // Copies t's bytes into scratch at `offset` and makes it a shared tensor.
  static v1::Tensor Shared(const v1::Tensor& t, const RegionClient::Scratch& scratch,
                           uint64_t offset) {
    std::memcpy(scratch.base + offset, t.data().data(), t.data().size());
    v1::Tensor s = t;
    s.mutable_shared()->set_region_id(scratch.region_id);
    s.mutable_shared()->set_offset(offset);
    s.mutable_shared()->set_length(t.data().size());
    return s;
  }

  // Allocates a cache through the client library and attends once (2 tokens, passed as
  // the library passes them); *h receives the cache.
  void AllocateAndAttend(Client& client, std::shared_ptr<GenericKvCacheHandle>* h) {
    CacheSpec spec{1, kKvHeads, kHeadDim, DType::kFloat16, 16, {}, 0, ""};
    auto allocated = client.Allocate(spec);
    ASSERT_TRUE(allocated.ok()) << allocated.status();
    *h = *std::move(allocated);
    v1::Tensor q = HalfTensor(kQHeads, 2, &rng_), k = HalfTensor(kKvHeads, 2, &rng_);
    auto out = (*h)->attention(0, Arg(q), Arg(k), Arg(k));
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->data.size(), q.data().size());
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<v1::KvCacheService::Stub> stub_;
  std::vector<std::unique_ptr<Attached>> attached_;
  std::mt19937 rng_{11};
};

TEST_F(ZeroCopyTest, AttachNamesTheFdSocketAndAnnouncesNewPools) {
  Attached& a = Attach("w");
  EXPECT_EQ(a.first.fd_socket(), daemon_->socket_path() + ".fds");
  struct stat st;
  ASSERT_EQ(stat(a.first.fd_socket().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  ASSERT_EQ(a.first.regions_size(), 1);  // no pool yet: the scratch region only
  EXPECT_TRUE(a.first.regions(0).scratch());
  EXPECT_EQ(a.first.regions(0).kind(), "host_memfd");
  EXPECT_EQ(a.first.regions(0).size(), uint64_t{16} << 20);  // --scratch_bytes

  Allocate(a.session());  // a new geometry: a new pool
  v1::AttachEvent next;
  ASSERT_TRUE(a.reader->Read(&next));
  EXPECT_EQ(next.session_id(), a.session());
  EXPECT_EQ(next.fd_socket(), a.first.fd_socket());
  ASSERT_EQ(next.regions_size(), 2);
  EXPECT_FALSE(next.regions(1).scratch());
  EXPECT_EQ(next.regions(1).pool_id(), 0u);
  EXPECT_EQ(next.regions(1).region_id(), 1u);
}

TEST_F(ZeroCopyTest, SharedAttendIsBitIdenticalToInlineAndFitsInOneKiB) {
  Attached& a = Attach("w");
  auto regions = RegionClient::Connect(a.first.fd_socket(), a.session());
  ASSERT_TRUE(regions.ok()) << regions.status();
  auto scratch = (*regions)->GetScratch();
  ASSERT_TRUE(scratch.ok()) << scratch.status();
  const std::string inline_id = Allocate(a.session()), shared_id = Allocate(a.session());

  // Prefill both: inline for one, shared slices for the other.
  v1::AppendRequest prefill;
  prefill.set_pos(0);
  *prefill.mutable_k() = HalfTensor(kKvHeads, 40, &rng_);
  *prefill.mutable_v() = HalfTensor(kKvHeads, 40, &rng_);
  v1::AppendResponse appended;
  prefill.set_cache_id(inline_id);
  ASSERT_TRUE(stub_->Append(Ctx(a.session()).get(), prefill, &appended).ok());
  v1::AppendRequest shared_prefill = prefill;
  shared_prefill.set_cache_id(shared_id);
  *shared_prefill.mutable_k() = Shared(prefill.k(), *scratch, 0);
  *shared_prefill.mutable_v() = Shared(prefill.v(), *scratch, 1 << 20);
  ASSERT_TRUE(stub_->Append(Ctx(a.session()).get(), shared_prefill, &appended).ok());
  EXPECT_EQ(appended.seq_len(), 40u);

  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE(step);
    v1::AttendRequest inline_req;
    inline_req.set_cache_id(inline_id);
    inline_req.set_pos(40 + step);
    *inline_req.mutable_q() = HalfTensor(kQHeads, 1, &rng_);
    *inline_req.mutable_k() = HalfTensor(kKvHeads, 1, &rng_);
    *inline_req.mutable_v() = HalfTensor(kKvHeads, 1, &rng_);
    v1::AttendRequest shared_req = inline_req;
    shared_req.set_cache_id(shared_id);
    *shared_req.mutable_q() = Shared(inline_req.q(), *scratch, 0);
    *shared_req.mutable_k() = Shared(inline_req.k(), *scratch, 65536);
    *shared_req.mutable_v() = Shared(inline_req.v(), *scratch, 2 * 65536);
    shared_req.mutable_out()->set_region_id(scratch->region_id);
    shared_req.mutable_out()->set_offset(3 * 65536);
    shared_req.mutable_out()->set_length(inline_req.q().data().size());
    std::memset(scratch->base + 3 * 65536, 0xff, inline_req.q().data().size());  // poison
    EXPECT_LT(shared_req.ByteSizeLong(), 1024u);
    EXPECT_GT(inline_req.ByteSizeLong(), 8192u);

    v1::AttendResponse inline_resp, shared_resp;
    ASSERT_TRUE(stub_->Attend(Ctx(a.session()).get(), inline_req, &inline_resp).ok());
    grpc::Status s = stub_->Attend(Ctx(a.session()).get(), shared_req, &shared_resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(shared_resp.out().payload_case(), v1::Tensor::kShared);
    EXPECT_EQ(shared_resp.out().shared().offset(), 3u * 65536);
    EXPECT_THAT(shared_resp.out().shape(), ::testing::ElementsAre(1, kQHeads, 1, kHeadDim));
    EXPECT_EQ(shared_resp.out().dtype(), v1::FLOAT16);
    EXPECT_EQ(shared_resp.seq_len(), inline_resp.seq_len());
    const std::string& want = inline_resp.out().data();
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(scratch->base) + 3 * 65536, want.size()),
              want);
  }
}

TEST_F(ZeroCopyTest, AnotherSessionGetsNeitherTheScratchFdsNorItsBytes) {
  Attached& a = Attach("owner");
  Attached& b = Attach("intruder");
  ASSERT_NE(a.scratch_id(), 0u);
  ASSERT_NE(a.scratch_id(), b.scratch_id());

  // The fd socket refuses b a's scratch region.
  v1::FdRequest req;
  req.set_session_id(b.session());
  req.mutable_export_region()->set_region_id(a.scratch_id());
  auto sock = ConnectUnix(b.first.fd_socket());
  ASSERT_TRUE(sock.ok()) << sock.status();
  ASSERT_TRUE(SendMessage(*sock, req.SerializeAsString()).ok());
  auto reply = RecvMessage(*sock);
  close(*sock);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->fds.empty());
  v1::FdReply r;
  ASSERT_TRUE(r.ParseFromString(reply->bytes));
  EXPECT_EQ(r.code(), int(absl::StatusCode::kPermissionDenied)) << r.message();

  // And a call of b's naming a's scratch region is refused before anything is read.
  const std::string id = Allocate(b.session());
  v1::AppendRequest append;
  append.set_cache_id(id);
  *append.mutable_k() = HalfTensor(kKvHeads, 1, &rng_);
  *append.mutable_v() = HalfTensor(kKvHeads, 1, &rng_);
  v1::Tensor* k = append.mutable_k();
  const uint64_t bytes = k->data().size();
  k->mutable_shared()->set_region_id(a.scratch_id());
  k->mutable_shared()->set_length(bytes);
  v1::AppendResponse resp;
  grpc::Status s = stub_->Append(Ctx(b.session()).get(), append, &resp);
  EXPECT_EQ(s.error_code(), StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("append: k"));
  // Its own region, but past the end: INVALID_ARGUMENT; no session at all: FAILED_PRECONDITION.
  k->mutable_shared()->set_region_id(b.scratch_id());
  k->mutable_shared()->set_offset((uint64_t{64} << 20) - 8);
  EXPECT_EQ(stub_->Append(Ctx(b.session()).get(), append, &resp).error_code(),
            StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(stub_->Append(Ctx("").get(), append, &resp).error_code(),
            StatusCode::FAILED_PRECONDITION);
}

TEST_F(ZeroCopyTest, FdSocketFlagNamesOrDisablesTheSocket) {
  TempDir dir;
  const std::string custom = dir.path() + "/custom.fds";
  Start({"--fd_socket=" + custom});
  EXPECT_EQ(Attach("w").first.fd_socket(), custom);
  EXPECT_THAT(daemon_->Log(), ::testing::HasSubstr("fd_socket=" + custom));

  Start({"--fd_socket=none"});
  EXPECT_EQ(Attach("w").first.fd_socket(), "");
  EXPECT_FALSE(std::filesystem::exists(daemon_->socket_path() + ".fds"));
}

// The scratch region is created at its first export: an arena that cannot cover it refuses
// that export, and the worker maps its pools all the same and sends tensors inline.
TEST_F(ZeroCopyTest, AScratchTheArenaCannotCoverIsRefusedAndTheWorkerGoesInline) {
  Start({"--arena_bytes=4Mi", "--scratch_bytes=8Mi"});
  Attached& a = Attach("w");
  ASSERT_NE(a.scratch_id(), 0u);  // listed: it costs nothing until mapped
  auto regions = RegionClient::Connect(a.first.fd_socket(), a.session());
  ASSERT_TRUE(regions.ok()) << regions.status();
  auto scratch = (*regions)->GetScratch();
  EXPECT_EQ(scratch.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(scratch.status().message()),
              ::testing::HasSubstr("scratch_bytes=8388608"));
  EXPECT_THAT(std::string(scratch.status().message()), ::testing::HasSubstr("arena_bytes=4194304"));
  Allocate(a.session());
  EXPECT_TRUE((*regions)->GetPool(0).ok());

  auto client = Client::Connect(daemon_->address());
  ASSERT_TRUE(client.ok()) << client.status();
  std::shared_ptr<GenericKvCacheHandle> h;
  ASSERT_NO_FATAL_FAILURE(AllocateAndAttend(**client, &h));
  EXPECT_TRUE(h->key_cache(0).ok());  // its pool is mapped
}

// Over TCP the fd socket's path means nothing (the client may be on another host): the
// client sends tensors inline and maps no pool, and says so when asked for a view.
TEST_F(ZeroCopyTest, ClientOverTcpWorksInlineWithoutMappings) {
  TempDir dir;
  Start({"--listen=unix:" + dir.path() + "/k.sock,127.0.0.1:0"});
  const std::string log = daemon_->Log();
  const size_t at = log.find("127.0.0.1:");
  ASSERT_NE(at, std::string::npos) << log;
  auto client = Client::Connect("127.0.0.1:" + std::to_string(std::atoi(log.c_str() + at + 10)));
  ASSERT_TRUE(client.ok()) << client.status();
  std::shared_ptr<GenericKvCacheHandle> h;
  ASSERT_NO_FATAL_FAILURE(AllocateAndAttend(**client, &h));
  auto view = h->key_cache(0);
  EXPECT_EQ(view.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(view.status().message()), ::testing::HasSubstr("unix:"));
  EXPECT_EQ(h->reserve(1).code(), absl::StatusCode::kOk);  // Reserve is an RPC: it works
  const v1::Tensor k = HalfTensor(kKvHeads, 1, &rng_);
  EXPECT_EQ(h->append_local(0, Arg(k), Arg(k)).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvarena
