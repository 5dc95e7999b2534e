// TenantsTest: the real kvarenad with --tenants_file listing alice, bob, carol (tenants;
// bob with max_sessions=2, carol with max_caches=3 max_pages=4) and ops (role=operator),
// and contexts that carry a tenant's bearer token.
//
// Thread-compatible: one test thread drives it.
#ifndef KVARENA_TESTS_ACCESS_TENANT_FIXTURE_H_
#define KVARENA_TESTS_ACCESS_TENANT_FIXTURE_H_

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kvarena/v1/kvarena.grpc.pb.h"
#include "tests/daemon/daemon_process.h"

namespace kvarena {

inline constexpr char kAliceToken[] = "alice-token-0123456789abcdef";
inline constexpr char kBobToken[] = "bob-token-0123456789abcdef";
inline constexpr char kOpsToken[] = "ops-token-0123456789abcdef";
inline constexpr char kCarolToken[] = "carol-token-0123456789abcdef";

// Writes `contents` to dir/name and returns the path.
std::string WriteTestFile(const TempDir& dir, const std::string& name, const std::string& contents);

class TenantsTest : public ::testing::Test {
 protected:
  // Starts kvarenad with the four tenants.
  void SetUp() override;
  // Flags kvarenad gets besides the tenants file (a test that needs others overrides it).
  virtual std::vector<std::string> DaemonFlags() const {
    return {"--arena_bytes=64Mi", "--scratch_bytes=1Mi"};
  }
  void TearDown() override;

  // A context carrying `token` as a bearer token ("" = none) and `session` ("" = none).
  static std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token,
                                                  const std::string& session = "");
  // Allocates `id` for the tenant of `token` (page_size 4, 2 layers, 2 heads, head_dim 8),
  // with a prefix namespace and prompt when given; returns the status and fills *info.
  grpc::Status Allocate(const std::string& token, const std::string& id, const std::string& ns = "",
                        const std::vector<int32_t>& prompt = {}, v1::CacheInfo* info = nullptr,
                        const std::string& session = "");
  // Appends n float32 tokens of `seed` to every layer at pos.
  grpc::Status Fill(const std::string& token, const std::string& id, uint64_t pos, int n,
                    float seed, const std::string& session = "");
  // The ids ListCaches shows the tenant of `token`, sorted.
  std::vector<std::string> List(const std::string& token);
  // Opens an Attach stream for `token` (resuming resume_token when set) and returns its
  // first event's status; *event gets the event. The stream stays open until TearDown.
  grpc::Status Attach(const std::string& token, v1::AttachEvent* event,
                      const std::string& resume_token = "");

  TempDir files_;  // the tenants file and the token files; outlives daemon_
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<v1::KvCacheService::Stub> stub_;

 private:
  struct Stream {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::ClientReader<v1::AttachEvent>> reader;
  };
  std::vector<Stream> streams_;
};

}  // namespace kvarena

#endif  // KVARENA_TESTS_ACCESS_TENANT_FIXTURE_H_
