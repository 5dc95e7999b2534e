// Without --tenants_file, prefix namespaces and token ids are the operator's to see: a
// caller with no session over the Unix socket (as the kvarena CLI is) sees every one in
// ListCaches and WatchEvents; a caller with a session sees the namespaces of its own
// session's caches only, and events without namespaces or token ids.
#include "tests/daemon/rpc_test_util.h"

namespace kvarena {
namespace {

using ::testing::ElementsAre;

class NameRedactionTest : public KvarenadTest {
 protected:
  // Allocates `id` in `session` with namespace "model-x" and a one-page prompt, filled.
  void AllocateFilled(const std::string& id, const std::string& session, int32_t first_token) {
    v1::AllocateRequest req;
    *req.mutable_spec() = Spec(1, 2, 8);  // page_size 4
    req.mutable_spec()->set_prefix_namespace("model-x");
    req.set_cache_id(id);
    for (int32_t t = first_token; t < first_token + 5; ++t) req.add_prompt_tokens(t);
    v1::AllocateResponse resp;
    ASSERT_TRUE(stub_->Allocate(Ctx(session).get(), req, &resp).ok());
    ASSERT_TRUE(AppendF32(id, 0, 0, 5, 2, 8, 1.0f, session).ok());
  }
  // "id=namespace" for every cache ListCaches shows the caller.
  std::vector<std::string> Listed(const std::string& session) {
    v1::ListCachesResponse resp;
    EXPECT_TRUE(stub_->ListCaches(Ctx(session).get(), v1::ListCachesRequest(), &resp).ok());
    std::vector<std::string> out;
    for (const v1::CacheInfo& c : resp.caches())
      out.push_back(c.cache_id() + "=" + c.spec().prefix_namespace());
    return out;
  }
  // "namespace:token ids" of each stored event a WatchEvents stream replays.
  std::vector<std::string> Replayed(const std::string& session) {
    const v1::WatchEventsResponse batch = FirstEventsBatch(stub_.get(), Ctx(session).get());
    std::vector<std::string> out;
    for (const v1::KvEvent& e : batch.events()) {
      if (e.has_stored())
        out.push_back(
            absl::StrCat(e.stored().prefix_namespace(), ":", e.stored().token_ids_size()));
    }
    return out;
  }
};

TEST_F(NameRedactionTest, OnlyTheOperatorSeesOtherCachesNamespacesAndEventTokens) {
  const std::string session = Attach("worker");
  AllocateFilled("mine", session, 1);
  AllocateFilled("shared", "", 100);
  EXPECT_THAT(Listed(""), ElementsAre("mine=model-x", "shared=model-x"));
  EXPECT_THAT(Listed(session), ElementsAre("mine=model-x", "shared="));
  EXPECT_THAT(Replayed(""), ElementsAre("model-x:4", "model-x:4"));
  EXPECT_THAT(Replayed(session), ElementsAre(":0", ":0"));
}

}  // namespace
}  // namespace kvarena
