// Popn, Reserve, Commit, GetKv, prefix reuse (prompt_tokens, SetTokens, Fork) and the
// ids of every other RPC at the extremes of their types, against a real kvarenad. Some
// of these once answered UNKNOWN with pages leaked, crashed the next append, or showed a
// sessionless reader another session's bytes.
#include "tests/daemon/extremes_fixture.h"

namespace kvarena {
namespace {

using grpc::StatusCode;

TEST_F(ExtremesTest, PagesPrefixesAndIdsAtTheirExtremesGetTheirCodeAndChangeNothing) {
  const std::string mib_id(1 << 20, 'x');
  std::string refusal;
  RunCases({
      // Popn: any n past seq_len is a refusal, not an error.
      {"popn n=u64max", [&refusal](ExtremesTest* t) { return t->Popn(kU64Max, &refusal); },
       StatusCode::OK, ""},
      {"popn n=2^63", [&refusal](ExtremesTest* t) { return t->Popn(k2To63, &refusal); },
       StatusCode::OK, ""},
      // Reserve / Commit.
      {"reserve tokens=u64max",
       [](ExtremesTest* t) {
         return t->Reserve({{"d", kU64Max}});
       },
       StatusCode::INVALID_ARGUMENT, "reserve: items[0].tokens=18446744073709551615"},
      {"reserve tokens=2^63-1",
       [](ExtremesTest* t) {
         return t->Reserve({{"d", uint64_t(kI64Max)}});
       },
       StatusCode::INVALID_ARGUMENT, "tokens=9223372036854775807"},
      {"reserve whose page total wraps across caches (was UNKNOWN, pages leaked)",
       [](ExtremesTest* t) {
         return t->Reserve({{"c", uint64_t{1} << 61}, {"d", uint64_t{1} << 62}});
       },
       StatusCode::INVALID_ARGUMENT, "tokens=2305843009213693952"},
      {"reserve of 70000 items",
       [](ExtremesTest* t) {
         std::vector<std::pair<std::string, uint64_t>> items(70000, {"d", 1});
         return t->Reserve(items);
       },
       StatusCode::INVALID_ARGUMENT, "70000 items; at most 65536"},
      {"commit tokens=2^63-1 (was accepted; the next append was SIGSEGV)",
       [](ExtremesTest* t) { return t->Commit("d", uint64_t(kI64Max)); },
       StatusCode::INVALID_ARGUMENT, "tokens=9223372036854775807"},
      {"commit tokens=u64max", [](ExtremesTest* t) { return t->Commit("d", kU64Max); },
       StatusCode::INVALID_ARGUMENT, "items[0].tokens=18446744073709551615"},
      // GetKv.
      {"get_kv layer=u32max", [](ExtremesTest* t) { return t->GetKvRange(kU32Max, 0, 0); },
       StatusCode::INVALID_ARGUMENT, "get_kv: layer=4294967295"},
      {"get_kv from_pos=u64max", [](ExtremesTest* t) { return t->GetKvRange(0, kU64Max, 0); },
       StatusCode::INVALID_ARGUMENT, "get_kv: from_pos=18446744073709551615"},
      {"get_kv max_tokens=2^63", [](ExtremesTest* t) { return t->GetKvRange(0, 0, k2To63); },
       StatusCode::INVALID_ARGUMENT, "get_kv: max_tokens=9223372036854775808"},
      {"get_kv from_pos=2^63-1 is an empty range",
       [](ExtremesTest* t) { return t->GetKvRange(0, uint64_t(kI64Max), 1); }, StatusCode::OK, ""},
      // Prefix reuse: prompt_tokens, SetTokens, Fork.
      {"allocate prompt_tokens with a negative id",
       [](ExtremesTest* t) {
         return t->AllocatePrompt({1, -1, 2});
       },
       StatusCode::INVALID_ARGUMENT, "allocate: prompt_tokens[1]=-1 must be >= 0"},
      {"allocate prompt_tokens of 2^20 + 1 ids",
       [](ExtremesTest* t) { return t->AllocatePrompt(std::vector<int32_t>((1 << 20) + 1, 7)); },
       StatusCode::INVALID_ARGUMENT, "prompt_tokens has 1048577 token ids; at most 1048576"},
      {"allocate prompt_tokens of int32 min",
       [](ExtremesTest* t) { return t->AllocatePrompt({std::numeric_limits<int32_t>::min()}); },
       StatusCode::INVALID_ARGUMENT, "prompt_tokens[0]=-2147483648"},
      {"allocate a 1 MiB prefix_namespace",
       [&mib_id](ExtremesTest* t) { return t->AllocatePrompt({1}, mib_id); },
       StatusCode::INVALID_ARGUMENT, "spec.prefix_namespace has 1048576 bytes; at most 1024"},
      {"set_tokens first_pos=u64max",
       [](ExtremesTest* t) { return t->SetTokens("c", kU64Max, {1}); },
       StatusCode::INVALID_ARGUMENT,
       "set_tokens: first_pos=18446744073709551615 must be below 2^63"},
      {"set_tokens first_pos=2^63-1",
       [](ExtremesTest* t) { return t->SetTokens("c", uint64_t(kI64Max), {1}); },
       StatusCode::INVALID_ARGUMENT,
       "first_pos=9223372036854775807 but cache 'c' knows the token ids of positions [0, 0)"},
      {"set_tokens past what is known (a gap)",
       [](ExtremesTest* t) { return t->SetTokens("c", 1, {1}); }, StatusCode::INVALID_ARGUMENT,
       "set_tokens: first_pos=1"},
      {"set_tokens a negative id",
       [](ExtremesTest* t) {
         return t->SetTokens("c", 0, {3, -5});
       },
       StatusCode::INVALID_ARGUMENT, "set_tokens: token_ids[1]=-5 must be >= 0"},
      {"set_tokens 2^20 + 1 ids",
       [](ExtremesTest* t) { return t->SetTokens("c", 0, std::vector<int32_t>((1 << 20) + 1, 1)); },
       StatusCode::INVALID_ARGUMENT, "token_ids has 1048577 token ids"},
      {"set_tokens on a missing cache",
       [](ExtremesTest* t) { return t->SetTokens("nope", 0, {1}); }, StatusCode::NOT_FOUND,
       "cache 'nope' not found"},
      {"set_tokens of no ids changes nothing",
       [](ExtremesTest* t) { return t->SetTokens("c", 0, {}); }, StatusCode::OK, ""},
      {"fork a missing cache", [](ExtremesTest* t) { return t->Fork("nope", "e"); },
       StatusCode::NOT_FOUND, "cache 'nope' not found"},
      {"fork an empty id", [](ExtremesTest* t) { return t->Fork("", "e"); }, StatusCode::NOT_FOUND,
       "cache '' not found"},
      {"fork into an id in use", [](ExtremesTest* t) { return t->Fork("c", "d"); },
       StatusCode::ALREADY_EXISTS, "fork: cache 'd' already exists"},
      {"fork into a 1 MiB id", [&mib_id](ExtremesTest* t) { return t->Fork("c", mib_id); },
       StatusCode::INVALID_ARGUMENT, "fork: new_cache_id has 1048576 bytes; at most 256"},
      // Ids on every other RPC.
      {"describe a 1 MiB id",
       [&mib_id](ExtremesTest* t) {
         v1::DescribeRequest req;
         req.set_cache_id(mib_id);
         v1::DescribeResponse resp;
         return t->stub()->Describe(Ctx().get(), req, &resp);
       },
       StatusCode::NOT_FOUND, "(1048576 bytes) not found"},
      {"stats of a 1 MiB id",
       [&mib_id](ExtremesTest* t) {
         v1::StatsRequest req;
         req.set_cache_id(mib_id);
         v1::StatsResponse resp;
         return t->stub()->Stats(Ctx().get(), req, &resp);
       },
       StatusCode::NOT_FOUND, "(1048576 bytes) not found"},
      {"release an empty id",
       [](ExtremesTest* t) {
         v1::ReleaseRequest req;
         v1::ReleaseResponse resp;
         return t->stub()->Release(Ctx().get(), req, &resp);
       },
       StatusCode::NOT_FOUND, "cache '' not found"},
      {"reset a 1 MiB id",
       [&mib_id](ExtremesTest* t) {
         v1::ResetRequest req;
         req.set_cache_id(mib_id);
         v1::ResetResponse resp;
         return t->stub()->Reset(Ctx().get(), req, &resp);
       },
       StatusCode::NOT_FOUND, "(1048576 bytes) not found"},
      {"a request above --max_message_bytes",
       [](ExtremesTest* t) {
         v1::ReleaseRequest req;
         req.set_cache_id(std::string(size_t{65} << 20, 'y'));
         v1::ReleaseResponse resp;
         return t->stub()->Release(Ctx().get(), req, &resp);
       },
       StatusCode::RESOURCE_EXHAUSTED, ""},
  });
  EXPECT_EQ(refusal, "popn: n=9223372036854775808 but seq_len=5");
  EXPECT_GT(Stats().pages().refusals(), 0u);
}

// Reserve + Commit without writes, then GetKv, once returned the bytes of the cache whose
// pages were freed last, across sessions and users (a sessionless TCP client read them).
class TcpReaderTest : public KvarenadTest {
 protected:
  void SetUp() override {
    port_ = PickUnusedPort();
    StartDaemon({"--arena_bytes=64Mi", "--scratch_bytes=2Mi",
                 absl::StrCat("--listen=unix:", dir_.path(), "/k.sock,127.0.0.1:", port_)});
  }
  TempDir dir_;
  int port_ = 0;
};

TEST_F(TcpReaderTest, ReservedPagesNeverShowAnotherSessionsBytes) {
  const std::string victim = Attach("victim");
  v1::AllocateRequest req;
  *req.mutable_spec() = Spec(1, 2, 8);
  req.set_cache_id("secret");
  v1::AllocateResponse resp;
  ASSERT_TRUE(stub_->Allocate(Ctx(victim).get(), req, &resp).ok());
  ASSERT_TRUE(Append("secret", 0, 0, RandomTensor(v1::FLOAT32, 2, 16, 8, 7),
                     RandomTensor(v1::FLOAT32, 2, 16, 8, 8), victim)
                  .ok());
  v1::ReleaseRequest release;
  release.set_cache_id("secret");
  v1::ReleaseResponse released;
  ASSERT_TRUE(stub_->Release(Ctx(victim).get(), release, &released).ok());

  auto tcp = v1::KvCacheService::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials()));
  req.set_cache_id("reader");
  ASSERT_TRUE(tcp->Allocate(Ctx().get(), req, &resp).ok());
  v1::ReserveRequest reserve;
  v1::CacheTokens* item = reserve.add_items();
  item->set_cache_id("reader");
  item->set_tokens(16);
  v1::ReserveResponse reserved;
  ASSERT_TRUE(tcp->Reserve(Ctx().get(), reserve, &reserved).ok());
  v1::CommitRequest commit;
  *commit.add_items() = *item;
  v1::CommitResponse committed;
  ASSERT_TRUE(tcp->Commit(Ctx().get(), commit, &committed).ok());
  v1::GetKvRequest get;
  get.set_cache_id("reader");
  v1::GetKvResponse kv;
  ASSERT_TRUE(tcp->GetKv(Ctx().get(), get, &kv).ok());
  EXPECT_EQ(kv.k().data().size(), 16u * 2 * 8 * 4);
  EXPECT_EQ(kv.k().data(), std::string(kv.k().data().size(), '\0'));
  EXPECT_EQ(kv.v().data(), std::string(kv.v().data().size(), '\0'));
}

}  // namespace
}  // namespace kvarena
