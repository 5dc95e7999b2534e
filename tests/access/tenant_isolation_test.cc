// --tenants_file through the real kvarenad: calls without a tenant's token are refused
// (health stays open), a tenant sees and touches only its own caches and sessions
// (another's are NOT_FOUND / unknown), prefix pages are shared only within a tenant (the
// poisoning sequence of issue 18), and the views (ListCaches, WatchEvents) are filtered;
// the operator role reads everything and writes nothing.
#include "kvarena/client.h"
#include "tests/access/tenant_fixture.h"
#include "tests/daemon/rpc_test_util.h"

namespace kvarena {
namespace {

using grpc::StatusCode;
using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

TEST_F(TenantsTest, CallsWithoutATenantsTokenAreUnauthenticated) {
  v1::PingResponse pong;
  EXPECT_THAT(stub_->Ping(Ctx("").get(), v1::PingRequest(), &pong),
              StatusIs(StatusCode::UNAUTHENTICATED, "authorization"));
  const grpc::Status wrong =
      stub_->Ping(Ctx("alice-token-0123456789abcdeX").get(), v1::PingRequest(), &pong);
  EXPECT_THAT(wrong, StatusIs(StatusCode::UNAUTHENTICATED, "no tenant's"));
  EXPECT_EQ(wrong.error_message().find("alice-token"), std::string::npos);  // not echoed
  EXPECT_THAT(Allocate("", "c"), StatusIs(StatusCode::UNAUTHENTICATED));
  EXPECT_THAT(Allocate(std::string(kAliceToken) + " ", "c"), StatusIs(StatusCode::UNAUTHENTICATED));
  v1::AttachEvent event;
  EXPECT_THAT(Attach("", &event), StatusIs(StatusCode::UNAUTHENTICATED));
  auto ctx = Ctx("");
  auto watch = stub_->WatchEvents(ctx.get(), v1::WatchEventsRequest());
  v1::WatchEventsResponse batch;
  EXPECT_FALSE(watch->Read(&batch));
  EXPECT_THAT(watch->Finish(), StatusIs(StatusCode::UNAUTHENTICATED));
  for (const char* token : {kAliceToken, kBobToken, kOpsToken}) {
    EXPECT_TRUE(stub_->Ping(Ctx(token).get(), v1::PingRequest(), &pong).ok()) << token;
  }
  EXPECT_TRUE(List(kAliceToken).empty());  // the refused Allocates made nothing
}

TEST_F(TenantsTest, AnotherTenantsCacheIsNotFoundForEveryRpc) {
  ASSERT_TRUE(Allocate(kAliceToken, "c", "m", {1, 2, 3, 4, 5}).ok());
  ASSERT_TRUE(Fill(kAliceToken, "c", 0, 5, 1.0f).ok());
  const auto bob = [] { return Ctx(kBobToken); };
  const auto expect_not_found = [](const grpc::Status& s, const char* rpc) {
    EXPECT_THAT(s, StatusIs(StatusCode::NOT_FOUND, "cache 'c' not found")) << rpc;
    EXPECT_EQ(s.error_message().find("alice"), std::string::npos) << rpc;
  };
  v1::AppendRequest append;
  append.set_cache_id("c");
  append.set_pos(5);
  *append.mutable_k() = F32Tensor(2, 1, 8, 9.0f);
  *append.mutable_v() = F32Tensor(2, 1, 8, 9.0f);
  v1::AppendResponse append_resp;
  expect_not_found(stub_->Append(bob().get(), append, &append_resp), "append");
  v1::AttendRequest attend;
  attend.set_cache_id("c");
  attend.set_pos(0);
  *attend.mutable_q() = F32Tensor(2, 1, 8, 1.0f);
  v1::AttendResponse attend_resp;
  expect_not_found(stub_->Attend(bob().get(), attend, &attend_resp), "attend");
  v1::PopnRequest popn;
  popn.set_cache_id("c");
  popn.set_n(1);
  v1::PopnResponse popn_resp;
  expect_not_found(stub_->Popn(bob().get(), popn, &popn_resp), "popn");
  v1::ResetRequest reset;
  reset.set_cache_id("c");
  v1::ResetResponse reset_resp;
  expect_not_found(stub_->Reset(bob().get(), reset, &reset_resp), "reset");
  v1::ReserveRequest reserve;
  v1::CacheTokens* item = reserve.add_items();
  item->set_cache_id("c");
  item->set_tokens(1);
  v1::ReserveResponse reserve_resp;
  expect_not_found(stub_->Reserve(bob().get(), reserve, &reserve_resp), "reserve");
  v1::CommitRequest commit;
  *commit.add_items() = *item;
  v1::CommitResponse commit_resp;
  expect_not_found(stub_->Commit(bob().get(), commit, &commit_resp), "commit");
  v1::GetKvRequest get;
  get.set_cache_id("c");
  v1::GetKvResponse get_resp;
  expect_not_found(stub_->GetKv(bob().get(), get, &get_resp), "get_kv");
  v1::DescribeRequest describe;
  describe.set_cache_id("c");
  v1::DescribeResponse describe_resp;
  expect_not_found(stub_->Describe(bob().get(), describe, &describe_resp), "describe");
  v1::StatsRequest stats;
  stats.set_cache_id("c");
  v1::StatsResponse stats_resp;
  expect_not_found(stub_->Stats(bob().get(), stats, &stats_resp), "stats");
  v1::SetTokensRequest set;
  set.set_cache_id("c");
  set.set_first_pos(5);
  set.add_token_ids(6);
  v1::SetTokensResponse set_resp;
  expect_not_found(stub_->SetTokens(bob().get(), set, &set_resp), "set_tokens");
  v1::ForkRequest fork;
  fork.set_cache_id("c");
  fork.set_new_cache_id("mine");
  v1::ForkResponse fork_resp;
  expect_not_found(stub_->Fork(bob().get(), fork, &fork_resp), "fork");
  v1::ReleaseRequest release;
  release.set_cache_id("c");
  v1::ReleaseResponse release_resp;
  expect_not_found(stub_->Release(bob().get(), release, &release_resp), "release");

  // Bob has a namespace of ids of his own: his "c" is another cache.
  v1::CacheInfo bobs;
  ASSERT_TRUE(Allocate(kBobToken, "c", "", {}, &bobs).ok());
  EXPECT_EQ(bobs.cache_id(), "c");
  EXPECT_EQ(bobs.seq_len(), 0u);
  // Ids the daemon picks, and forks, stay in the tenant's scope.
  v1::CacheInfo picked;
  ASSERT_TRUE(Allocate(kBobToken, "", "", {}, &picked).ok());
  fork.set_new_cache_id("");
  ASSERT_TRUE(stub_->Fork(bob().get(), fork, &fork_resp).ok());
  EXPECT_THAT(List(kBobToken),
              UnorderedElementsAre("c", fork_resp.cache().cache_id(), picked.cache_id()));
  EXPECT_THAT(List(kAliceToken), ElementsAre("c"));
  // Alice's cache is as she left it.
  ASSERT_TRUE(stub_->Describe(Ctx(kAliceToken).get(), describe, &describe_resp).ok());
  EXPECT_EQ(describe_resp.cache().seq_len(), 5u);
  EXPECT_EQ(describe_resp.cache().spec().prefix_namespace(), "m");
}

TEST_F(TenantsTest, AnotherTenantsSessionIsUnknown) {
  v1::AttachEvent alice;
  ASSERT_TRUE(Attach(kAliceToken, &alice).ok());
  ASSERT_TRUE(Allocate(kAliceToken, "s", "", {}, nullptr, alice.session_id()).ok());
  // Bob presenting alice's session id: as if no such session existed.
  EXPECT_THAT(Allocate(kBobToken, "b", "", {}, nullptr, alice.session_id()),
              StatusIs(StatusCode::FAILED_PRECONDITION, "session is unknown"));
  EXPECT_THAT(Fill(kBobToken, "s", 0, 1, 1.0f, alice.session_id()),
              StatusIs(StatusCode::FAILED_PRECONDITION, "session is unknown"));
  // Nor may he take it over with its resume token.
  v1::AttachEvent taken;
  EXPECT_THAT(Attach(kBobToken, &taken, alice.resume_token()),
              StatusIs(StatusCode::NOT_FOUND, "no session holds this resume_token"));
  // Alice still holds it.
  const grpc::Status filled = Fill(kAliceToken, "s", 0, 1, 1.0f, alice.session_id());
  EXPECT_TRUE(filled.ok()) << filled.error_message();
  v1::AttachEvent again;
  ASSERT_TRUE(Attach(kAliceToken, &again, alice.resume_token()).ok());
  EXPECT_TRUE(again.resumed());
  EXPECT_EQ(again.session_id(), alice.session_id());
}

// Issue 18's poisoning: bob registers his own K/V under alice's namespace and prompt;
// alice's next request must adopt only what she wrote, and bob never adopts hers.
TEST_F(TenantsTest, ATenantAdoptsOnlyItsOwnPrefixPages) {
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 12, 13};
  v1::CacheInfo info;
  // Bob registers K/V of his own under alice's namespace and prompt first.
  ASSERT_TRUE(Allocate(kBobToken, "attacker", "model-x", prompt, &info).ok());
  ASSERT_TRUE(Fill(kBobToken, "attacker", 0, 9, 50.0f).ok());
  ASSERT_TRUE(Allocate(kAliceToken, "victim", "model-x", prompt, &info).ok());
  EXPECT_EQ(info.cached_tokens(), 0u);  // bob's pages are not alice's to adopt
  ASSERT_TRUE(Fill(kAliceToken, "victim", 0, 9, 1.0f).ok());
  v1::CacheInfo bob_again;
  ASSERT_TRUE(Allocate(kBobToken, "attacker-2", "model-x", prompt, &bob_again).ok());
  EXPECT_EQ(bob_again.cached_tokens(), 8u);  // his own

  // Alice releases her cache: her pages stay cached, and only hers are hers to adopt.
  v1::ReleaseRequest release;
  release.set_cache_id("victim");
  v1::ReleaseResponse released;
  ASSERT_TRUE(stub_->Release(Ctx(kAliceToken).get(), release, &released).ok());
  v1::CacheInfo next;
  ASSERT_TRUE(Allocate(kAliceToken, "next", "model-x", prompt, &next).ok());
  EXPECT_EQ(next.cached_tokens(), 8u);
  ASSERT_TRUE(Allocate(kAliceToken, "reference", "model-x", {}, &info).ok());
  ASSERT_TRUE(Fill(kAliceToken, "reference", 0, 9, 1.0f).ok());
  constexpr size_t kRow = 8 * 4;  // one token of one head, float32
  for (uint32_t layer = 0; layer < 2; ++layer) {
    SCOPED_TRACE(layer);
    v1::GetKvRequest get;
    get.set_layer(layer);
    v1::GetKvResponse adopted, written;
    get.set_cache_id("next");
    ASSERT_TRUE(stub_->GetKv(Ctx(kAliceToken).get(), get, &adopted).ok());
    get.set_cache_id("reference");
    ASSERT_TRUE(stub_->GetKv(Ctx(kAliceToken).get(), get, &written).ok());
    for (size_t h = 0; h < 2; ++h) {
      EXPECT_EQ(adopted.k().data().substr(h * 8 * kRow, 8 * kRow),
                written.k().data().substr(h * 9 * kRow, 8 * kRow));
      EXPECT_EQ(adopted.v().data().substr(h * 8 * kRow, 8 * kRow),
                written.v().data().substr(h * 9 * kRow, 8 * kRow));
    }
  }
}

TEST_F(TenantsTest, ListCachesAndWatchEventsShowOnlyTheTenantsOwn) {
  ASSERT_TRUE(Allocate(kAliceToken, "a1", "model-x", {1, 2, 3, 4, 5}).ok());
  ASSERT_TRUE(Fill(kAliceToken, "a1", 0, 5, 1.0f).ok());
  ASSERT_TRUE(Allocate(kBobToken, "b1", "model-x", {101, 102, 103, 104, 105}).ok());
  ASSERT_TRUE(Fill(kBobToken, "b1", 0, 5, 2.0f).ok());
  ASSERT_TRUE(Allocate(kBobToken, "b2", "").ok());
  EXPECT_THAT(List(kAliceToken), ElementsAre("a1"));
  EXPECT_THAT(List(kBobToken), ElementsAre("b1", "b2"));
  EXPECT_THAT(List(kOpsToken), ElementsAre("alice/a1", "bob/b1", "bob/b2"));

  // Each tenant's stream replays its own page (one full page per layer), its namespace as
  // it sent it; the operator's shows both.
  const auto replay = [this](const char* token) {
    const v1::WatchEventsResponse batch = FirstEventsBatch(stub_.get(), Ctx(token).get());
    std::vector<std::string> seen;
    for (const v1::KvEvent& e : batch.events()) {
      if (!e.has_stored()) continue;
      seen.push_back(absl::StrCat(e.stored().prefix_namespace(), ":", e.stored().token_ids(0)));
    }
    return seen;
  };
  EXPECT_THAT(replay(kAliceToken), ElementsAre("model-x:1", "model-x:1"));
  EXPECT_THAT(replay(kBobToken), ElementsAre("model-x:101", "model-x:101"));
  EXPECT_THAT(replay(kOpsToken), ElementsAre("alice/model-x:1", "alice/model-x:1",
                                             "bob/model-x:101", "bob/model-x:101"));
}

TEST_F(TenantsTest, TheOperatorReadsEverythingAndWritesNothing) {
  ASSERT_TRUE(Allocate(kAliceToken, "a1", "model-x").ok());
  ASSERT_TRUE(Fill(kAliceToken, "a1", 0, 3, 1.0f).ok());
  v1::DescribeRequest describe;
  describe.set_cache_id("alice/a1");
  v1::DescribeResponse described;
  ASSERT_TRUE(stub_->Describe(Ctx(kOpsToken).get(), describe, &described).ok());
  EXPECT_EQ(described.cache().cache_id(), "alice/a1");
  EXPECT_EQ(described.cache().spec().prefix_namespace(), "alice/model-x");
  EXPECT_EQ(described.cache().seq_len(), 3u);
  v1::StatsRequest stats;
  stats.set_cache_id("alice/a1");
  v1::StatsResponse stats_resp;
  EXPECT_TRUE(stub_->Stats(Ctx(kOpsToken).get(), stats, &stats_resp).ok());

  EXPECT_THAT(Allocate(kOpsToken, "o"), StatusIs(StatusCode::PERMISSION_DENIED, "role=operator"));
  EXPECT_THAT(Fill(kOpsToken, "alice/a1", 3, 1, 1.0f), StatusIs(StatusCode::PERMISSION_DENIED));
  v1::GetKvRequest get;
  get.set_cache_id("alice/a1");
  v1::GetKvResponse kv;
  EXPECT_THAT(stub_->GetKv(Ctx(kOpsToken).get(), get, &kv),
              StatusIs(StatusCode::PERMISSION_DENIED));
  v1::ReleaseRequest release;
  release.set_cache_id("alice/a1");
  v1::ReleaseResponse released;
  EXPECT_THAT(stub_->Release(Ctx(kOpsToken).get(), release, &released),
              StatusIs(StatusCode::PERMISSION_DENIED));
  v1::AttachEvent event;
  EXPECT_THAT(Attach(kOpsToken, &event), StatusIs(StatusCode::PERMISSION_DENIED));
  EXPECT_THAT(List(kAliceToken), ElementsAre("a1"));
}

TEST_F(TenantsTest, MaxSessionsBoundsTheTenantsSessions) {
  v1::AttachEvent event;
  ASSERT_TRUE(Attach(kBobToken, &event).ok());
  ASSERT_TRUE(Attach(kBobToken, &event).ok());
  EXPECT_THAT(Attach(kBobToken, &event), StatusIs(StatusCode::RESOURCE_EXHAUSTED,
                                                  "'bob' holds 2 sessions (attached or in "
                                                  "their grace period); its max_sessions=2"));
  EXPECT_TRUE(Attach(kAliceToken, &event).ok());  // another tenant's bound is not alice's
  EXPECT_TRUE(Attach(kAliceToken, &event).ok());
  EXPECT_TRUE(Attach(kAliceToken, &event).ok());
}

TEST_F(TenantsTest, TheClientLibrarySendsATenantsTokenOverTheUnixSocket) {
  const std::string address = "unix:" + daemon_->socket_path();
  ClientOptions options;
  options.auth_token = kAliceToken;
  absl::StatusOr<std::shared_ptr<Client>> alice = Client::Connect(address, options);
  ASSERT_TRUE(alice.ok()) << alice.status();
  CacheSpec spec;
  spec.num_layers = 1;
  spec.num_kv_heads = 1;
  spec.head_dim = 8;
  spec.dtype = DType::kFloat32;
  ASSERT_TRUE((*alice)->Allocate(spec, "lib").ok());
  absl::StatusOr<std::vector<CacheInfo>> listed = (*alice)->ListCaches();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].cache_id, "lib");
  EXPECT_THAT(List(kAliceToken), ElementsAre("lib"));
  EXPECT_TRUE(List(kBobToken).empty());

  options.auth_token = kBobToken + std::string("x");
  EXPECT_EQ(Client::Connect(address, options).status().code(), absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace kvarena
