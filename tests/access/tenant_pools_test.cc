// Pools are per tenant (--tenants_file), through the real kvarenad: two tenants' caches of
// one geometry draw from two pools, a session lists and maps (over the fd socket) only its
// own tenant's pools — another tenant's pool is NOT_FOUND with no fd sent, as an unknown
// id is — and the operator's Stats names each pool's tenant.
#include <unistd.h>

#include <cstdint>
#include <string>

#include "arena/fd_passing.h"
#include "tests/access/tenant_fixture.h"
#include "tests/daemon/rpc_test_util.h"

namespace kvarena {
namespace {

using ::testing::ElementsAre;

class TenantPoolsTest : public TenantsTest {
 protected:
  // Asks the fd socket to export region_id to session: the reply's code, and in *fds how
  // many descriptors came with it (closed here).
  int Export(const std::string& session, uint64_t region_id, size_t* fds) {
    absl::StatusOr<int> sock = ConnectUnix(daemon_->socket_path() + ".fds");
    EXPECT_TRUE(sock.ok()) << sock.status();
    if (!sock.ok()) return -1;
    v1::FdRequest req;
    req.set_session_id(session);
    req.mutable_export_region()->set_region_id(region_id);
    v1::FdReply reply;
    *fds = 0;
    absl::StatusOr<Message> in =
        SendMessage(*sock, req.SerializeAsString()).ok()
            ? RecvMessage(*sock, absl::Now() + absl::Seconds(30))
            : absl::StatusOr<Message>(absl::UnavailableError("send failed"));
    close(*sock);
    EXPECT_TRUE(in.ok()) << in.status();
    if (!in.ok()) return -1;
    *fds = in->fds.size();
    for (int fd : in->fds) close(fd);
    EXPECT_TRUE(reply.ParseFromString(in->bytes));
    last_message_ = reply.message();
    return reply.code();
  }
  // The pool ids of the regions in a session's Attach event.
  static std::vector<uint64_t> PoolIds(const v1::AttachEvent& event) {
    std::vector<uint64_t> ids;
    for (const v1::RegionDescriptor& r : event.regions()) {
      if (!r.scratch()) ids.push_back(r.pool_id());
    }
    return ids;
  }

  std::string last_message_;
};

TEST_F(TenantPoolsTest, TwoTenantsOfOneGeometryDrawFromTwoPools) {
  v1::CacheInfo a, b;
  ASSERT_TRUE(Allocate(kAliceToken, "c", "", {}, &a).ok());
  ASSERT_TRUE(Allocate(kBobToken, "c", "", {}, &b).ok());
  ASSERT_TRUE(Fill(kAliceToken, "c", 0, 4, 1.0f).ok());
  ASSERT_TRUE(Fill(kBobToken, "c", 0, 4, 2.0f).ok());
  EXPECT_NE(a.pool_id(), b.pool_id());
  v1::CacheInfo a2;
  ASSERT_TRUE(Allocate(kAliceToken, "d", "", {}, &a2).ok());
  EXPECT_EQ(a2.pool_id(), a.pool_id());  // one tenant's caches still share its pool

  v1::StatsResponse ops;
  ASSERT_TRUE(stub_->Stats(Ctx(kOpsToken).get(), v1::StatsRequest(), &ops).ok());
  ASSERT_EQ(ops.pools_size(), 2);
  for (const v1::PoolStats& p : ops.pools()) {
    EXPECT_EQ(p.tenant(), p.pool_id() == a.pool_id() ? "alice" : "bob");
    EXPECT_EQ(p.pages_used(), 2u);  // 4 tokens of page 4 on each of 2 layers
  }
  v1::StatsResponse alice;
  ASSERT_TRUE(stub_->Stats(Ctx(kAliceToken).get(), v1::StatsRequest(), &alice).ok());
  ASSERT_EQ(alice.pools_size(), 1);
  EXPECT_EQ(alice.pools(0).pool_id(), a.pool_id());
  EXPECT_EQ(alice.pools(0).tenant(), "alice");
  EXPECT_EQ(alice.pages().pages_used(), 4u);  // the arena's totals: its pages are shared
}

TEST_F(TenantPoolsTest, ASessionMapsOnlyItsOwnTenantsPool) {
  v1::AttachEvent alice_session, bob_session;
  ASSERT_TRUE(Attach(kAliceToken, &alice_session).ok());
  ASSERT_TRUE(Attach(kBobToken, &bob_session).ok());
  v1::CacheInfo a;
  ASSERT_TRUE(Allocate(kAliceToken, "c", "", {}, &a, alice_session.session_id()).ok());
  ASSERT_TRUE(Fill(kAliceToken, "c", 0, 4, 1.0f, alice_session.session_id()).ok());
  const uint64_t alice_region = a.pool_id() + 1;

  size_t fds = 0;
  EXPECT_EQ(Export(alice_session.session_id(), alice_region, &fds), 0) << last_message_;
  EXPECT_GT(fds, 0u);
  // Bob's session: as unknown as a region that never was, and no fd.
  EXPECT_EQ(Export(bob_session.session_id(), alice_region, &fds), int(grpc::StatusCode::NOT_FOUND));
  EXPECT_EQ(fds, 0u);
  EXPECT_EQ(last_message_, "export: no region " + std::to_string(alice_region));

  // A new Attach lists the regions a session may map: bob's lists no pool of alice's.
  v1::AttachEvent bob_again, alice_again;
  ASSERT_TRUE(Attach(kBobToken, &bob_again).ok());
  ASSERT_TRUE(Attach(kAliceToken, &alice_again).ok());
  EXPECT_TRUE(PoolIds(bob_again).empty());
  EXPECT_THAT(PoolIds(alice_again), ElementsAre(a.pool_id()));

  // Bob's own cache of the same geometry gets bob a pool he may map; alice still may not
  // map it, and was served throughout.
  v1::CacheInfo b;
  ASSERT_TRUE(Allocate(kBobToken, "c", "", {}, &b, bob_session.session_id()).ok());
  ASSERT_TRUE(Fill(kBobToken, "c", 0, 4, 2.0f, bob_session.session_id()).ok());
  ASSERT_NE(b.pool_id(), a.pool_id());
  EXPECT_EQ(Export(bob_session.session_id(), b.pool_id() + 1, &fds), 0) << last_message_;
  EXPECT_GT(fds, 0u);
  EXPECT_EQ(Export(alice_session.session_id(), b.pool_id() + 1, &fds),
            int(grpc::StatusCode::NOT_FOUND));
  EXPECT_EQ(fds, 0u);
  EXPECT_TRUE(Fill(kAliceToken, "c", 4, 4, 3.0f, alice_session.session_id()).ok());
}

}  // namespace
}  // namespace kvarena
