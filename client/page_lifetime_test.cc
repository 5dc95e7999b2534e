// "Page lifetime" (kvarena/kv_cache_handle.h): every call that may free pages waits for
// the client's local kernels before its RPC, and a failed wait sends nothing. A probe
// wraps the real kernels (ClientTestPeer::WrapLocalKernels, client/client_test_peer.h);
// its Synchronize records what the arena holds at that moment, which shows the wait came
// first.
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "client/client_test_peer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/kv_kernels.h"
#include "kvarena/client.h"
#include "tests/support/forwarding_kernels.h"
#include "tests/support/inproc_fixture.h"
#include "tests/support/kv_history.h"
#include "tests/support/status_matchers.h"

namespace kvarena {
namespace {

using ::testing::HasSubstr;
using testing::HostTensor;
using testing::IsOk;
using testing::StatusIs;

constexpr int kKvHeads = 2, kQHeads = 4, kHeadDim = 16, kPageSize = 4;

// The real kernels, with a hook run at each Synchronize before the real one.
class ProbeKernels final : public testing::ForwardingKvKernels {
 public:
  ProbeKernels(std::unique_ptr<KvKernels> inner, std::function<absl::Status()> on_sync)
      : ForwardingKvKernels(std::move(inner)), on_sync_(std::move(on_sync)) {}
  absl::Status Synchronize() override {
    KVARENA_RETURN_IF_ERROR(on_sync_());
    return ForwardingKvKernels::Synchronize();
  }

 private:
  std::function<absl::Status()> on_sync_;
};

class PageLifetimeTest : public testing::InprocClientFixture<> {
 protected:
  void SetUp() override {
    InprocClientFixture::SetUp();
    client_internal::ClientTestPeer(*client_).WrapLocalKernels(
        [this](std::unique_ptr<KvKernels> real) {
          return std::make_unique<ProbeKernels>(std::move(real), [this] { return OnSync(); });
        });
  }

  // What the arena holds of the watched cache: its seq_len, or -1 once it is gone.
  int64_t ArenaSeqLen(const std::string& id) {
    auto st = client_->CacheStats(id);
    return st.ok() ? st->seq_len : -1;
  }
  absl::Status OnSync() {
    seen_.push_back(ArenaSeqLen(watched_));
    return std::exchange(fail_next_, absl::OkStatus());
  }

  std::shared_ptr<GenericKvCacheHandle> Allocate(std::vector<int> windows) {
    CacheSpec spec =
        testing::MakeSpec(int(windows.size()), kKvHeads, kHeadDim, DType::kFloat16, kPageSize);
    spec.layer_windows = std::move(windows);
    auto h = NewCache(spec);
    if (h != nullptr) watched_ = h->cache_id();
    return h;
  }
  HostTensor Random(int heads, int64_t n) {
    return testing::RandomTensor(rng_, DType::kFloat16, heads, n, kHeadDim);
  }
  // Reserves and writes n tokens on every layer through the local path (no commit).
  void WriteLocal(GenericKvCacheHandle& h, int64_t n) {
    ASSERT_THAT(h.reserve(n), IsOk());
    for (int layer = 0; layer < h.num_layers(); ++layer) {
      HostTensor k = Random(kKvHeads, n), v = Random(kKvHeads, n);
      ASSERT_THAT(h.append_local(layer, k.arg(), v.arg()), IsOk());
    }
  }
  // Runs op and expects exactly one Synchronize during it, which saw the arena still at
  // `before` (the freeing RPC had not been sent yet).
  void ExpectWaitsFirst(const char* what, int64_t before, const std::function<void()>& op) {
    SCOPED_TRACE(what);
    const size_t n = seen_.size();
    op();
    ASSERT_EQ(seen_.size(), n + 1);
    EXPECT_EQ(seen_.back(), before);
  }

  std::string watched_;
  std::vector<int64_t> seen_;
  absl::Status fail_next_;
  std::mt19937_64 rng_{5};
};

TEST_F(PageLifetimeTest, EveryFreeingCallWaitsForLocalKernelsBeforeItsRpc) {
  auto h = Allocate({0, 8});
  WriteLocal(*h, 6);  // creates the local kernels
  ASSERT_TRUE(seen_.empty());
  ExpectWaitsFirst("commit", 0, [&] { ASSERT_THAT(h->commit(6), IsOk()); });
  EXPECT_EQ(ArenaSeqLen(watched_), 6);
  ExpectWaitsFirst("popn", 6, [&] { ASSERT_THAT(h->popn(2), IsOk()); });
  EXPECT_EQ(ArenaSeqLen(watched_), 4);
  ExpectWaitsFirst("served append", 4, [&] {
    HostTensor k = Random(kKvHeads, 1);
    ASSERT_THAT(h->append(0, k.arg(), k.arg()), IsOk());
  });
  ExpectWaitsFirst("served attention", 5, [&] {
    HostTensor q = Random(kQHeads, 1), k = Random(kKvHeads, 1);
    ASSERT_THAT(h->attention(1, q.arg(), k.arg(), k.arg()), IsOk());
  });
  ExpectWaitsFirst("reset", 5, [&] { ASSERT_THAT(h->reset(), IsOk()); });
  EXPECT_EQ(ArenaSeqLen(watched_), 0);
  WriteLocal(*h, 3);
  ExpectWaitsFirst("Client::Commit", 0, [&] { ASSERT_THAT(client_->Commit({{h, 3}}), IsOk()); });
  ExpectWaitsFirst("release", 3, [&] { ASSERT_THAT(h->release(), IsOk()); });
  EXPECT_EQ(ArenaSeqLen(watched_), -1);

  auto other = Allocate({0, 0});
  WriteLocal(*other, 2);
  ASSERT_THAT(other->commit(2), IsOk());
  ExpectWaitsFirst("Client::Release", 2,
                   [&] { ASSERT_THAT(client_->Release(other->cache_id()), IsOk()); });
  EXPECT_EQ(ArenaSeqLen(watched_), -1);
}

// Without a window nothing is evicted: commits and served writes free no page, so the
// decode loop's Commit does not wait for the kernels.
TEST_F(PageLifetimeTest, WritesToAGlobalCacheDoNotWait) {
  auto h = Allocate({0, 0});
  WriteLocal(*h, 5);
  ASSERT_THAT(h->commit(5), IsOk());
  HostTensor k = Random(kKvHeads, 1), q = Random(kQHeads, 1);
  ASSERT_THAT(h->append(0, k.arg(), k.arg()), IsOk());
  ASSERT_THAT(h->attention(1, q.arg(), k.arg(), k.arg()), IsOk());
  EXPECT_TRUE(seen_.empty());
  ExpectWaitsFirst("popn", 6, [&] { ASSERT_THAT(h->popn(1), IsOk()); });
}

TEST_F(PageLifetimeTest, AFailedWaitSendsNothing) {
  auto h = Allocate({0, 8});
  WriteLocal(*h, 4);
  auto fail = [&](const std::string& op, const absl::Status& s) {
    SCOPED_TRACE(op);
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInternal));
    EXPECT_THAT(std::string(s.message()), HasSubstr(op));
    EXPECT_THAT(std::string(s.message()), HasSubstr("device lost"));
  };
  fail_next_ = absl::InternalError("device lost");
  fail("commit", h->commit(4));
  EXPECT_EQ(ArenaSeqLen(watched_), 0);
  ASSERT_THAT(h->commit(4), IsOk());  // the writes are still pending: commit again works

  fail_next_ = absl::InternalError("device lost");
  fail("popn", h->popn(1).status());
  fail_next_ = absl::InternalError("device lost");
  fail("reset", h->reset());
  fail_next_ = absl::InternalError("device lost");
  fail("release", h->release());
  fail_next_ = absl::InternalError("device lost");
  fail("release", client_->Release(h->cache_id()));
  EXPECT_EQ(ArenaSeqLen(watched_), 4);
  EXPECT_TRUE(h->is_valid());
  EXPECT_EQ(h->num_tokens(), 4);
}

}  // namespace
}  // namespace kvarena
