// The remote client against a real kvarenad with --max_message_bytes=1Mi: get_kv pages a
// layer of several MiB through GetKv ranges and returns it bit for bit, while one GetKv of
// the whole layer is refused; a client whose limit is above the daemon's is told how to
// page. Popn beyond seq_len comes back as a refusal, not an error.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvarena/client.h"
#include "kvarena/v1/kvarena.grpc.pb.h"
#include "tests/daemon/daemon_process.h"
#include "tests/support/kv_history.h"
#include "tests/support/status_matchers.h"

namespace kvarena {
namespace {

using ::testing::HasSubstr;
using testing::HostTensor;
using testing::IsOk;
using testing::KvHistory;
using testing::StatusIs;

constexpr int kKvHeads = 4, kHeadDim = 128;
constexpr size_t kDaemonLimit = size_t{1} << 20;

class RemoteClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<DaemonProcess>(
        std::vector<std::string>{"--arena_bytes=256Mi", "--max_message_bytes=1Mi"});
    ASSERT_TRUE(daemon_->WaitServing()) << daemon_->Log();
    client_ = Connect(kDaemonLimit);
    ASSERT_NE(client_, nullptr);
  }
  void TearDown() override {
    client_.reset();
    daemon_.reset();
  }
  std::shared_ptr<Client> Connect(size_t max_message_bytes) {
    ClientOptions options;
    options.attach = false;  // its caches belong to no session: the raw stub reads them too
    options.max_message_bytes = max_message_bytes;
    auto c = Client::Connect(daemon_->address(), options);
    EXPECT_THAT(c, IsOk());
    return c.ok() ? *c : nullptr;
  }
  // A cache whose layers each hold `tokens` random tokens (bfloat16, 2 KiB of K+V a token).
  std::shared_ptr<GenericKvCacheHandle> Fill(std::vector<int> windows, int64_t tokens) {
    CacheSpec spec{int(windows.size()), kKvHeads, kHeadDim, DType::kBFloat16, 16, windows, 0, ""};
    auto h = client_->Allocate(spec);
    EXPECT_THAT(h, IsOk());
    if (!h.ok()) return nullptr;
    history_.assign(windows.size(), KvHistory(kKvHeads, kHeadDim));
    // Appends of 200 tokens: 400 KiB, below the daemon's message limit.
    for (int64_t at = 0; at < tokens; at += 200) {
      for (int layer = 0; layer < spec.num_layers; ++layer) {
        const int64_t n = std::min<int64_t>(200, tokens - at);
        HostTensor k = testing::RandomTensor(rng_, spec.dtype, kKvHeads, n, kHeadDim);
        HostTensor v = testing::RandomTensor(rng_, spec.dtype, kKvHeads, n, kHeadDim);
        EXPECT_THAT((*h)->append(layer, k.arg(), v.arg()), IsOk());
        history_[layer].Append(k, v);
      }
    }
    return *h;
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::shared_ptr<Client> client_;
  std::vector<KvHistory> history_;
  std::mt19937_64 rng_{23};
};

TEST_F(RemoteClientTest, GetKvPagesALayerAboveTheMessageLimitBitForBit) {
  auto h = Fill({0, 1000}, 3000);  // 6 MiB of K+V on layer 0; layer 1 keeps its tail
  ASSERT_NE(h, nullptr);
  for (int layer = 0; layer < 2; ++layer) {
    SCOPED_TRACE(layer);
    auto kv = h->get_kv(layer);
    ASSERT_THAT(kv, IsOk());
    EXPECT_EQ(kv->layer_len, 3000);
    if (layer == 1) {
      EXPECT_GT(kv->first_pos, 0);  // the window evicted the first pages
    }
    EXPECT_EQ(kv->k.shape, (std::vector<int64_t>{1, kKvHeads, 3000 - kv->first_pos, kHeadDim}));
    EXPECT_EQ(kv->k.data,
              testing::EncodeValues(history_[layer].HeadMajor(0, kv->first_pos), DType::kBFloat16));
    EXPECT_EQ(kv->v.data,
              testing::EncodeValues(history_[layer].HeadMajor(1, kv->first_pos), DType::kBFloat16));
  }

  // One GetKv of the whole layer is above the limit; a range within it is served.
  auto stub = v1::KvCacheService::NewStub(daemon_->NewChannel());
  v1::GetKvRequest req;
  req.set_cache_id(h->cache_id());
  v1::GetKvResponse resp;
  {
    grpc::ClientContext ctx;
    const grpc::Status s = stub->GetKv(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("max_tokens"));
  }
  req.set_from_pos(1000);
  req.set_max_tokens(100);
  grpc::ClientContext ctx;
  const grpc::Status s = stub->GetKv(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.first_pos(), 1000u);
  EXPECT_EQ(resp.layer_len(), 3000u);
  EXPECT_THAT(resp.k().shape(), ::testing::ElementsAre(1, kKvHeads, 100, kHeadDim));
}

// A refusal's advice accounts for the reply's envelope: 2 KiB of K+V a token under a
// 1 MiB limit, so 512 tokens would be exactly the limit in K+V alone and fail on the
// wire; the advised max_tokens is served, one more is refused.
TEST_F(RemoteClientTest, GetKvsAdvisedPageSizeFitsTheWire) {
  auto h = Fill({0}, 1000);
  ASSERT_NE(h, nullptr);
  auto stub = v1::KvCacheService::NewStub(daemon_->NewChannel());
  auto get = [&](uint64_t max_tokens, v1::GetKvResponse* resp) {
    v1::GetKvRequest req;
    req.set_cache_id(h->cache_id());
    req.set_max_tokens(max_tokens);
    grpc::ClientContext ctx;
    return stub->GetKv(&ctx, req, resp);
  };
  v1::GetKvResponse resp;
  const grpc::Status whole = get(0, &resp);
  ASSERT_EQ(whole.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << whole.error_message();
  std::smatch m;
  const std::string message = whole.error_message();
  ASSERT_TRUE(std::regex_search(message, m, std::regex("ask for at most (\\d+) tokens")))
      << message;
  const uint64_t advised = std::stoull(m[1]);
  EXPECT_GT(advised, 500u);
  EXPECT_LT(advised, 512u);
  const grpc::Status fits = get(advised, &resp);
  ASSERT_TRUE(fits.ok()) << fits.error_message();
  EXPECT_EQ(resp.k().shape(2), int64_t(advised));
  EXPECT_LE(resp.ByteSizeLong(), kDaemonLimit);
  const grpc::Status over = get(advised + 1, &resp);
  EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << over.error_message();
  EXPECT_THAT(over.error_message(),
              HasSubstr("ask for at most"));  // core's refusal, not the wire's
}

TEST_F(RemoteClientTest, AClientLimitAboveTheDaemonsSaysWhichOptionToSet) {
  auto h = Fill({0}, 1000);
  ASSERT_NE(h, nullptr);
  auto big = Connect(size_t{64} << 20);  // pages in 4 MiB chunks: above the daemon's 1 MiB
  ASSERT_NE(big, nullptr);
  auto opened = big->OpenCache(h->cache_id());
  ASSERT_THAT(opened, IsOk());
  auto kv = (*opened)->get_kv(0);
  EXPECT_THAT(kv, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(kv.status().message()), HasSubstr("max_message_bytes"));
}

TEST_F(RemoteClientTest, PopnBeyondSeqLenIsARefusal) {
  auto h = Fill({0, 0}, 5);
  ASSERT_NE(h, nullptr);
  for (int64_t n : {int64_t{6}, int64_t{1} << 40, std::numeric_limits<int64_t>::max()}) {
    SCOPED_TRACE(n);
    auto r = h->popn(n);
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(r->popped, 0);
    EXPECT_EQ(r->seq_len, 5);
    EXPECT_THAT(r->refusal, HasSubstr("5"));
    EXPECT_EQ(h->num_tokens(), 5);
  }
  EXPECT_THAT(h->popn(-1), StatusIs(absl::StatusCode::kInvalidArgument));
  auto st = h->stats();
  ASSERT_THAT(st, IsOk());
  EXPECT_EQ(st->seq_len, 5);
  auto r = h->popn(5);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->popped, 5);
  EXPECT_EQ(h->num_tokens(), 0);
}

}  // namespace
}  // namespace kvarena
