#include "tests/access/tenant_fixture.h"

#include <algorithm>
#include <fstream>

#include "absl/time/clock.h"
#include "tests/daemon/rpc_test_util.h"

namespace kvarena {

std::string WriteTestFile(const TempDir& dir, const std::string& name,
                          const std::string& contents) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path) << contents;
  return path;
}

void TenantsTest::SetUp() {
  WriteTestFile(files_, "alice.token", std::string(kAliceToken) + "\n");
  WriteTestFile(files_, "bob.token", std::string(kBobToken) + "\n");
  WriteTestFile(files_, "ops.token", std::string(kOpsToken) + "\n");
  WriteTestFile(files_, "carol.token", std::string(kCarolToken) + "\n");
  const std::string tenants = WriteTestFile(files_, "tenants",
                                            "# name  token file  options\n"
                                            "alice alice.token\n"
                                            "\n"
                                            "bob " +
                                                files_.path() +
                                                "/bob.token max_sessions=2\n"
                                                "ops ops.token role=operator  # read-only\n"
                                                "carol carol.token max_caches=3 max_pages=4\n");
  std::vector<std::string> flags = DaemonFlags();
  flags.push_back("--tenants_file=" + tenants);
  daemon_ = std::make_unique<DaemonProcess>(flags);
  // Health stays open: WaitServing polls it without a token.
  ASSERT_TRUE(daemon_->WaitServing()) << daemon_->Log();
  stub_ = v1::KvCacheService::NewStub(daemon_->NewChannel());
}

void TenantsTest::TearDown() {
  if (HasFailure() && daemon_ != nullptr)
    std::fprintf(stderr, "kvarenad log:\n%s\n", daemon_->Log().c_str());
  for (Stream& s : streams_) {
    s.context->TryCancel();
    s.reader->Finish();
  }
  streams_.clear();
}

std::unique_ptr<grpc::ClientContext> TenantsTest::Ctx(const std::string& token,
                                                      const std::string& session) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  if (!session.empty()) ctx->AddMetadata("kvarena-session", session);
  return ctx;
}

grpc::Status TenantsTest::Allocate(const std::string& token, const std::string& id,
                                   const std::string& ns, const std::vector<int32_t>& prompt,
                                   v1::CacheInfo* info, const std::string& session) {
  v1::AllocateRequest req;
  *req.mutable_spec() = Spec(2, 2, 8);
  req.mutable_spec()->set_prefix_namespace(ns);
  req.set_cache_id(id);
  req.mutable_prompt_tokens()->Assign(prompt.begin(), prompt.end());
  v1::AllocateResponse resp;
  grpc::Status s = stub_->Allocate(Ctx(token, session).get(), req, &resp);
  if (info != nullptr) *info = resp.cache();
  return s;
}

grpc::Status TenantsTest::Fill(const std::string& token, const std::string& id, uint64_t pos, int n,
                               float seed, const std::string& session) {
  for (uint32_t layer = 0; layer < 2; ++layer) {
    v1::AppendRequest req;
    req.set_cache_id(id);
    req.set_layer(layer);
    req.set_pos(pos);
    *req.mutable_k() = F32Tensor(2, n, 8, seed + layer);
    *req.mutable_v() = F32Tensor(2, n, 8, seed + layer + 100);
    v1::AppendResponse resp;
    if (grpc::Status s = stub_->Append(Ctx(token, session).get(), req, &resp); !s.ok()) return s;
  }
  return grpc::Status::OK;
}

std::vector<std::string> TenantsTest::List(const std::string& token) {
  v1::ListCachesResponse resp;
  const grpc::Status s = stub_->ListCaches(Ctx(token).get(), v1::ListCachesRequest(), &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  std::vector<std::string> ids;
  for (const v1::CacheInfo& c : resp.caches()) ids.push_back(c.cache_id());
  std::sort(ids.begin(), ids.end());
  return ids;
}

grpc::Status TenantsTest::Attach(const std::string& token, v1::AttachEvent* event,
                                 const std::string& resume_token) {
  Stream s;
  s.context = std::make_unique<grpc::ClientContext>();
  if (!token.empty()) s.context->AddMetadata("authorization", "Bearer " + token);
  v1::AttachRequest req;
  req.set_client_name("tenant-test");
  req.set_resume_token(resume_token);
  s.reader = stub_->Attach(s.context.get(), req);
  if (s.reader->Read(event)) {
    streams_.push_back(std::move(s));
    return grpc::Status::OK;
  }
  return s.reader->Finish();
}

}  // namespace kvarena
