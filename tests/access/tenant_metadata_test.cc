// Each tenant's share of --metadata_bytes through the real kvarenad: a tenant whose line
// states no max_metadata_bytes gets an equal share among the tenants (alice, bob and carol
// here), so carol — the red team's shape: her max_caches of 1024-layer caches at page size
// 1, declaring ids until refused — is refused RESOURCE_EXHAUSTED naming her share, and
// alice is served meanwhile.
#include <string>
#include <vector>

#include "tests/access/tenant_fixture.h"
#include "tests/daemon/rpc_test_util.h"

namespace kvarena {
namespace {

using grpc::StatusCode;

constexpr uint64_t kMetadataBytes = uint64_t{9} << 20;

class TenantMetadataTest : public TenantsTest {
 protected:
  std::vector<std::string> DaemonFlags() const override {
    return {"--arena_bytes=64Mi", "--scratch_bytes=1Mi", "--metadata_bytes=9Mi"};
  }
  grpc::Status AllocateWide(const std::string& token, const std::string& id) {
    v1::AllocateRequest req;
    *req.mutable_spec() = Spec(1024, 1, 4, v1::FLOAT32, /*page_size=*/1);
    req.set_cache_id(id);
    v1::AllocateResponse resp;
    return stub_->Allocate(Ctx(token).get(), req, &resp);
  }
  grpc::Status SetTokens(const std::string& token, const std::string& id, uint64_t pos, int n) {
    v1::SetTokensRequest req;
    req.set_cache_id(id);
    req.set_first_pos(pos);
    for (int i = 0; i < n; ++i) req.add_token_ids(i + 1);
    v1::SetTokensResponse resp;
    return stub_->SetTokens(Ctx(token).get(), req, &resp);
  }
};

TEST_F(TenantMetadataTest, ATenantFillingItsShareLeavesTheOthersServed) {
  grpc::Status refused;
  for (int c = 0; c < 3 && refused.ok(); ++c) {  // carol's max_caches=3
    const std::string id = "c" + std::to_string(c);
    refused = AllocateWide(kCarolToken, id);
    for (uint64_t pos = 0; refused.ok(); pos += 5000)
      refused = SetTokens(kCarolToken, id, pos, 5000);
  }
  const std::string share = std::to_string(kMetadataBytes / 3);
  EXPECT_THAT(refused, StatusIs(StatusCode::RESOURCE_EXHAUSTED,
                                "tenant 'carol' max_metadata_bytes=" + share));
  v1::StatsResponse stats;
  ASSERT_TRUE(stub_->Stats(Ctx(kOpsToken).get(), v1::StatsRequest(), &stats).ok());
  EXPECT_LE(stats.metadata_bytes_used(), kMetadataBytes / 3);
  // Alice: the same shape, served, and the red team's 55,000 ids declared.
  ASSERT_TRUE(AllocateWide(kAliceToken, "a0").ok());
  EXPECT_TRUE(SetTokens(kAliceToken, "a0", 0, 55000).ok());
}

}  // namespace
}  // namespace kvarena
