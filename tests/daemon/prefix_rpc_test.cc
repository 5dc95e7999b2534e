// Prefix reuse at the wire, against a real kvarenad: prompt_tokens on Allocate, SetTokens,
// Fork, the prefix fields of CacheInfo and PageStats, the /metrics families, and
// WatchEvents (replay, the daemon's incarnation, a from_seq past the newest event).
#include <signal.h>
#include <sys/wait.h>
#include <xxhash.h>

#include <chrono>
#include <string>

#include "tests/daemon/rpc_test_util.h"

namespace kvarena {
namespace {

using ::testing::HasSubstr;

// The body of GET /metrics ("" on failure).
std::string Scrape(int port) {
  const std::string response = GetMetrics(port);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// The chained page hash as docs/prefix-reuse.md documents it, computed here from the
// document rather than with core's code: what a router would write. 16 bytes, high half
// first, big-endian (KvEvent's form).
std::string LittleEndian(uint64_t v, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out.push_back(char((v >> (8 * i)) & 0xff));
  return out;
}
XXH128_hash_t DocumentedRoot(const std::string& ns, uint32_t dtype, uint32_t page_size,
                             uint32_t kv_heads, uint32_t head_dim, uint32_t layers) {
  // The KV format defaults to the dtype's own (same number), which has no scales (0, and
  // a static scales' digest of 0); no layer has a window.
  std::string b = "kvarena.prefix.v3" + LittleEndian(ns.size(), 4) + ns;
  for (uint32_t v : {dtype, dtype, 0u, page_size, kv_heads, head_dim, layers})
    b += LittleEndian(v, 4);
  b += LittleEndian(0, 8);
  for (uint32_t l = 0; l < layers; ++l) b += LittleEndian(0, 4);  // every layer global
  return XXH3_128bits(b.data(), b.size());
}
XXH128_hash_t DocumentedPage(XXH128_hash_t parent, const std::vector<int32_t>& ids) {
  std::string b = LittleEndian(parent.low64, 8) + LittleEndian(parent.high64, 8);
  for (int32_t id : ids) b += LittleEndian(uint32_t(id), 4);
  return XXH3_128bits(b.data(), b.size());
}
std::string WireHash(XXH128_hash_t h) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  return std::string(reinterpret_cast<const char*>(c.digest), sizeof(c.digest));
}

class PrefixRpcTest : public KvarenadTest {
 protected:
  void SetUp() override {
    port_ = PickUnusedPort();
    StartDaemon({"--arena_bytes=16Mi", "--metrics_port=" + std::to_string(port_)});
  }
  v1::CacheInfo AllocatePrompt(const std::vector<int32_t>& prompt, const std::string& id) {
    v1::AllocateRequest req;
    *req.mutable_spec() = Spec(2, 2, 8);  // page_size 4
    req.mutable_spec()->set_prefix_namespace("model-x");
    req.set_cache_id(id);
    req.mutable_prompt_tokens()->Assign(prompt.begin(), prompt.end());
    v1::AllocateResponse resp;
    const grpc::Status s = stub_->Allocate(Ctx().get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.cache();
  }
  int port_ = 0;
};

TEST_F(PrefixRpcTest, PromptTokensSetTokensAndForkOverTheWire) {
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 12, 13};
  v1::CacheInfo a = AllocatePrompt(prompt, "a");
  EXPECT_EQ(a.cached_tokens(), 0u);
  EXPECT_EQ(a.tokens_known(), 9u);
  EXPECT_EQ(a.spec().prefix_namespace(), "model-x");
  for (uint32_t l = 0; l < 2; ++l) ASSERT_TRUE(AppendF32("a", l, 0, 9, 2, 8, 1.0f + l).ok());

  v1::CacheInfo b = AllocatePrompt(prompt, "b");
  EXPECT_EQ(b.cached_tokens(), 8u);
  EXPECT_EQ(b.seq_len(), 8u);
  // b's K/V of the adopted positions are a's, bit for bit ([1, heads, tokens, dim]).
  constexpr size_t kRow = 8 * 4;  // one token of one head
  for (uint32_t l = 0; l < 2; ++l) {
    const v1::GetKvResponse ka = GetKv("a", l), kb = GetKv("b", l);
    ASSERT_EQ(kb.k().data().size(), 2 * 8 * kRow);
    for (size_t h = 0; h < 2; ++h) {
      EXPECT_EQ(kb.k().data().substr(h * 8 * kRow, 8 * kRow),
                ka.k().data().substr(h * 9 * kRow, 8 * kRow));
      EXPECT_EQ(kb.v().data().substr(h * 8 * kRow, 8 * kRow),
                ka.v().data().substr(h * 9 * kRow, 8 * kRow));
    }
  }
  v1::StatsResponse st = Stats();
  EXPECT_EQ(st.pages().pages_shared(), 4u);
  EXPECT_EQ(st.pages().prefix_lookups(), 2u);
  EXPECT_EQ(st.pages().prefix_requested_tokens(), 18u);
  EXPECT_EQ(st.pages().prefix_hit_tokens(), 8u);
  EXPECT_EQ(st.pools(0).pages_shared(), 4u);

  v1::SetTokensRequest set;
  set.set_cache_id("a");
  set.set_first_pos(9);
  set.add_token_ids(42);
  v1::SetTokensResponse set_resp;
  ASSERT_TRUE(stub_->SetTokens(Ctx().get(), set, &set_resp).ok());
  EXPECT_EQ(set_resp.cache().tokens_known(), 10u);
  set.set_first_pos(2);  // position 2 holds token 7
  set.set_token_ids(0, 99);
  EXPECT_THAT(stub_->SetTokens(Ctx().get(), set, &set_resp),
              StatusIs(grpc::StatusCode::FAILED_PRECONDITION, "position 2 holds token 7"));

  v1::ForkRequest fork;
  fork.set_cache_id("a");
  fork.set_new_cache_id("f");
  v1::ForkResponse forked;
  ASSERT_TRUE(stub_->Fork(Ctx().get(), fork, &forked).ok());
  EXPECT_EQ(forked.cache().cache_id(), "f");
  EXPECT_EQ(forked.cache().seq_len(), 9u);
  EXPECT_EQ(forked.cache().cached_tokens(), 9u);
  EXPECT_EQ(GetKv("f", 1).v().data(), GetKv("a", 1).v().data());
  EXPECT_EQ(Stats().pages().forks(), 1u);

  for (const char* id : {"a", "b", "f"}) {
    v1::ReleaseRequest release;
    release.set_cache_id(id);
    v1::ReleaseResponse released;
    ASSERT_TRUE(stub_->Release(Ctx().get(), release, &released).ok());
  }
  st = Stats();
  EXPECT_EQ(st.pages().pages_used(), 0u);
  EXPECT_EQ(st.pages().pages_cached(), 4u);  // a's two full pages on each layer
  EXPECT_EQ(st.pools_size(), 1);             // kept for them
  EXPECT_EQ(st.pools(0).pages_cached(), 4u);

  const std::string metrics = Scrape(port_);
  EXPECT_THAT(metrics, HasSubstr("kvarena_pages_cached 4"));
  EXPECT_THAT(metrics, HasSubstr("kvarena_prefix_lookups_total 2"));
  EXPECT_THAT(metrics, HasSubstr("kvarena_prefix_requested_tokens_total 18"));
  EXPECT_THAT(metrics, HasSubstr("kvarena_prefix_hit_tokens_total 8"));
  EXPECT_THAT(metrics, HasSubstr("kvarena_forks_total 1"));
  EXPECT_THAT(metrics, HasSubstr("kvarena_cow_copies_total 0"));
  EXPECT_THAT(metrics, HasSubstr("kvarena_pages_evicted_by_reason_total{reason=\"lru\"} 0"));
  EXPECT_THAT(metrics, HasSubstr("kvarena_pages_evicted_by_reason_total{reason=\"window\"} 0"));
  EXPECT_THAT(metrics, HasSubstr("kvarena_rpc_total{method=\"Fork\",code=\"OK\"} 1"));
  EXPECT_THAT(metrics,
              HasSubstr("kvarena_rpc_total{method=\"SetTokens\",code=\"FAILED_PRECONDITION\"} 1"));
}

TEST_F(PrefixRpcTest, WatchEventsReplaysAndStreamsIndexChanges) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub_->WatchEvents(&ctx, v1::WatchEventsRequest());
  v1::WatchEventsResponse msg;
  ASSERT_TRUE(reader->Read(&msg));  // at once: nothing recorded yet
  EXPECT_EQ(msg.events_size(), 0);
  EXPECT_EQ(msg.next_seq(), 1u);
  EXPECT_FALSE(msg.events_lost());

  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 12, 13};
  AllocatePrompt(prompt, "a");
  for (uint32_t l = 0; l < 2; ++l) ASSERT_TRUE(AppendF32("a", l, 0, 9, 2, 8, 1.0f + l).ok());
  std::vector<v1::KvEvent> events;
  while (events.size() < 4 && reader->Read(&msg))
    events.insert(events.end(), msg.events().begin(), msg.events().end());
  ASSERT_EQ(events.size(), 4u);  // two full pages on each layer
  for (size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(events[i].seq(), i + 1);
    ASSERT_TRUE(events[i].has_stored());
    const v1::KvEvent::BlockStored& st = events[i].stored();
    EXPECT_EQ(st.layer(), i / 2);
    EXPECT_EQ(st.block_hash().size(), 16u);
    EXPECT_EQ(std::vector<int32_t>(st.token_ids().begin(), st.token_ids().end()),
              std::vector<int32_t>(prompt.begin() + (i % 2) * 4, prompt.begin() + (i % 2) * 4 + 4));
    if (i % 2 == 1) {
      EXPECT_EQ(st.parent_hash(), events[i - 1].stored().block_hash());  // chained
    }
  }
  EXPECT_EQ(events[0].stored().block_hash(),
            events[2].stored().block_hash());  // same page, next layer
  for (const v1::KvEvent& e : events) {
    EXPECT_EQ(e.stored().num_tokens(), 4u);
    EXPECT_EQ(e.stored().prefix_namespace(), "model-x");
    EXPECT_EQ(e.stored().medium(), "cpu");
  }
  // A router recomputes the hashes from the token ids alone (docs/prefix-reuse.md).
  const XXH128_hash_t root = DocumentedRoot("model-x", v1::FLOAT32, 4, 2, 8, 2);
  const XXH128_hash_t page0 = DocumentedPage(root, {5, 6, 7, 8});
  const XXH128_hash_t page1 = DocumentedPage(page0, {9, 10, 11, 12});
  EXPECT_EQ(events[0].stored().parent_hash(), WireHash(root));
  EXPECT_EQ(events[0].stored().block_hash(), WireHash(page0));
  EXPECT_EQ(events[1].stored().block_hash(), WireHash(page1));

  // A second watcher replays from seq 3.
  grpc::ClientContext ctx2;
  ctx2.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::WatchEventsRequest from3;
  from3.set_from_seq(3);
  auto replay = stub_->WatchEvents(&ctx2, from3);
  ASSERT_TRUE(replay->Read(&msg));
  ASSERT_EQ(msg.events_size(), 2);
  EXPECT_EQ(msg.events(0).seq(), 3u);
  EXPECT_EQ(msg.next_seq(), 5u);
  ctx.TryCancel();
  ctx2.TryCancel();
}

// A watcher that resumes with from_seq tells a restarted daemon by its incarnation: the
// same on every message of one daemon process (AttachEvent included), another after a
// restart, never 0. And the restarted daemon, asked for a seq past its newest, says the
// watcher lost events and replays what it keeps, rather than waiting for that seq.
TEST_F(PrefixRpcTest, EveryMessageCarriesTheIncarnationARestartChanges) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub_->WatchEvents(&ctx, v1::WatchEventsRequest());
  v1::WatchEventsResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  const uint64_t incarnation = msg.daemon_incarnation();
  EXPECT_NE(incarnation, 0u);
  AllocatePrompt({1, 2, 3, 4, 5}, "a");
  for (uint32_t l = 0; l < 2; ++l) ASSERT_TRUE(AppendF32("a", l, 0, 5, 2, 8, 1.0f).ok());
  int events = 0;
  while (events < 2 && reader->Read(&msg)) {
    events += msg.events_size();
    EXPECT_EQ(msg.daemon_incarnation(), incarnation);
  }
  ASSERT_EQ(events, 2);  // one full page on each layer
  const uint64_t resume_from = msg.next_seq();
  ctx.TryCancel();
  {
    grpc::ClientContext attach;
    attach.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto stream = stub_->Attach(&attach, v1::AttachRequest());
    v1::AttachEvent event;
    ASSERT_TRUE(stream->Read(&event));
    EXPECT_EQ(event.daemon_incarnation(), incarnation);
    attach.TryCancel();
  }

  StartDaemon({"--arena_bytes=16Mi"});
  grpc::ClientContext ctx2;
  ctx2.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::WatchEventsRequest resume;
  resume.set_from_seq(resume_from);
  auto again = stub_->WatchEvents(&ctx2, resume);
  ASSERT_TRUE(again->Read(&msg));
  EXPECT_NE(msg.daemon_incarnation(), incarnation);
  EXPECT_NE(msg.daemon_incarnation(), 0u);
  EXPECT_TRUE(msg.events_lost());  // resume_from is past the new daemon's newest event
  EXPECT_EQ(msg.next_seq(), 1u);
  ctx2.TryCancel();
}

TEST_F(PrefixRpcTest, AFromSeqPastTheNewestReportsLostEventsAndMissesNone) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::WatchEventsRequest far;
  far.set_from_seq(1000);
  auto reader = stub_->WatchEvents(&ctx, far);
  v1::WatchEventsResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  EXPECT_TRUE(msg.events_lost());
  EXPECT_EQ(msg.events_size(), 0);
  EXPECT_EQ(msg.next_seq(), 1u);
  // The events that follow come from seq 1, not from 1000.
  AllocatePrompt({1, 2, 3, 4, 5}, "a");
  ASSERT_TRUE(AppendF32("a", 0, 0, 5, 2, 8, 1.0f).ok());
  ASSERT_TRUE(reader->Read(&msg));
  ASSERT_GE(msg.events_size(), 1);
  EXPECT_EQ(msg.events(0).seq(), 1u);
  EXPECT_FALSE(msg.events_lost());
  ctx.TryCancel();
}

TEST_F(PrefixRpcTest, AWatcherDoesNotHoldUpShutdown) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub_->WatchEvents(&ctx, v1::WatchEventsRequest());
  v1::WatchEventsResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  daemon_->Signal(SIGTERM);
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  const std::optional<int> exit = daemon_->WaitExit(absl::Seconds(30));
  ASSERT_TRUE(exit.has_value());
  EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0) << daemon_->Log();
}

}  // namespace
}  // namespace kvarena
