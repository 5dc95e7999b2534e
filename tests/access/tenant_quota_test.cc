// Per-tenant quotas (max_caches=N, max_pages=N on a --tenants_file line) through the real
// kvarenad: carol (max_caches=3 max_pages=4) is refused RESOURCE_EXHAUSTED naming her,
// the bound and her numbers once she would pass one — her sessions' and sessionless caches
// counted together — nothing of hers changes, and alice is served meanwhile.
#include <string>

#include "tests/access/tenant_fixture.h"
#include "tests/daemon/rpc_test_util.h"

namespace kvarena {
namespace {

using grpc::StatusCode;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class TenantQuotaTest : public TenantsTest {
 protected:
  // The pages and tokens a cache of carol's holds (Stats with its id).
  v1::PageStats CacheStats(const std::string& id) {
    v1::StatsRequest req;
    req.set_cache_id(id);
    v1::StatsResponse resp;
    EXPECT_TRUE(stub_->Stats(Ctx(kCarolToken).get(), req, &resp).ok()) << id;
    return resp.pages();
  }
  // Alice allocates and fills a cache: she is served whatever carol holds.
  void ExpectAliceServed(const std::string& id) {
    EXPECT_TRUE(Allocate(kAliceToken, id).ok()) << id;
    EXPECT_TRUE(Fill(kAliceToken, id, 0, 12, 5.0f).ok()) << id;  // 6 pages, past carol's 4
  }
};

TEST_F(TenantQuotaTest, MaxCachesCountsTheTenantsSessionAndSessionlessCaches) {
  v1::AttachEvent session;
  ASSERT_TRUE(Attach(kCarolToken, &session).ok());
  ASSERT_TRUE(Allocate(kCarolToken, "s1", "", {}, nullptr, session.session_id()).ok());
  ASSERT_TRUE(Allocate(kCarolToken, "s2", "", {}, nullptr, session.session_id()).ok());
  ASSERT_TRUE(Allocate(kCarolToken, "n1").ok());
  for (const std::string& in_session : {session.session_id(), std::string()}) {
    EXPECT_THAT(Allocate(kCarolToken, "x", "", {}, nullptr, in_session),
                StatusIs(StatusCode::RESOURCE_EXHAUSTED,
                         "allocate: tenant 'carol' holds 3 caches; its max_caches=3"));
  }
  v1::ForkRequest fork;
  fork.set_cache_id("n1");
  v1::ForkResponse fork_resp;
  EXPECT_THAT(stub_->Fork(Ctx(kCarolToken).get(), fork, &fork_resp),
              StatusIs(StatusCode::RESOURCE_EXHAUSTED,
                       "fork: tenant 'carol' holds 3 caches; its max_caches=3"));
  EXPECT_THAT(List(kCarolToken), ElementsAre("n1", "s1", "s2"));
  ExpectAliceServed("a1");
  ExpectAliceServed("a2");
  ExpectAliceServed("a3");
  ExpectAliceServed("a4");  // past carol's bound: hers only
  // A release gives the count back.
  v1::ReleaseRequest release;
  release.set_cache_id("n1");
  v1::ReleaseResponse release_resp;
  ASSERT_TRUE(stub_->Release(Ctx(kCarolToken).get(), release, &release_resp).ok());
  EXPECT_TRUE(Allocate(kCarolToken, "x").ok());
}

TEST_F(TenantQuotaTest, MaxPagesRefusesAppendReserveAndForkChangingNothing) {
  ASSERT_TRUE(Allocate(kCarolToken, "c").ok());
  ASSERT_TRUE(Fill(kCarolToken, "c", 0, 8, 1.0f).ok());  // 2 layers x 2 pages of 4: her 4
  ASSERT_TRUE(Allocate(kCarolToken, "d").ok());

  EXPECT_THAT(
      Fill(kCarolToken, "d", 0, 4, 2.0f),
      StatusIs(
          StatusCode::RESOURCE_EXHAUSTED,
          "append: layer 0 needs 1 page(s) but tenant 'carol' holds 4 pages; its max_pages=4"));
  v1::ReserveRequest reserve;
  v1::CacheTokens* item = reserve.add_items();
  item->set_cache_id("d");
  item->set_tokens(4);
  v1::ReserveResponse reserve_resp;
  EXPECT_THAT(
      stub_->Reserve(Ctx(kCarolToken).get(), reserve, &reserve_resp),
      StatusIs(StatusCode::RESOURCE_EXHAUSTED,
               "reserve: needs 2 page(s) but tenant 'carol' holds 4 pages; its max_pages=4"));
  v1::ForkRequest fork;
  fork.set_cache_id("c");
  fork.set_new_cache_id("f");
  v1::ForkResponse fork_resp;
  const grpc::Status forked = stub_->Fork(Ctx(kCarolToken).get(), fork, &fork_resp);
  EXPECT_THAT(forked, StatusIs(StatusCode::RESOURCE_EXHAUSTED));
  EXPECT_THAT(
      forked.error_message(),
      HasSubstr(
          "fork: cache 'c' holds 4 page(s) to share or copy but tenant 'carol' holds 4 pages; "
          "its max_pages=4"));

  // Nothing of carol's changed: d holds nothing, c its 8 tokens, no fork.
  EXPECT_EQ(CacheStats("d").pages_used(), 0u);
  EXPECT_EQ(CacheStats("d").seq_len(), 0u);
  EXPECT_EQ(CacheStats("c").pages_used(), 4u);
  EXPECT_EQ(CacheStats("c").seq_len(), 8u);
  EXPECT_THAT(List(kCarolToken), ElementsAre("c", "d"));
  ExpectAliceServed("a");

  // Popping c's last page on each layer makes room for what was refused.
  v1::PopnRequest popn;
  popn.set_cache_id("c");
  popn.set_n(4);
  v1::PopnResponse popn_resp;
  ASSERT_TRUE(stub_->Popn(Ctx(kCarolToken).get(), popn, &popn_resp).ok());
  ASSERT_EQ(popn_resp.popped(), 4u);
  EXPECT_TRUE(Fill(kCarolToken, "d", 0, 4, 2.0f).ok());
  EXPECT_EQ(CacheStats("d").pages_used(), 2u);
}

}  // namespace
}  // namespace kvarena
