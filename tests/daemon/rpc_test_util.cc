#include "tests/daemon/rpc_test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "tests/support/attention_reference.h"

namespace kvarena {

std::string GetMetrics(int port, int timeout_s) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const timeval tv{timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if (write(fd, req.data(), req.size()) == ssize_t(req.size())) {
      char buf[4096];
      for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) response.append(buf, size_t(n));
    }
  }
  close(fd);
  return response;
}

const char* GrpcCodeName(grpc::StatusCode code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  const int c = static_cast<int>(code);
  return c >= 0 && c < 17 ? kNames[c] : "?";
}

}  // namespace kvarena

void grpc::PrintTo(const grpc::Status& status, std::ostream* os) {
  *os << kvarena::GrpcCodeName(status.error_code()) << ": " << status.error_message();
}

namespace kvarena {

v1::CacheSpec Spec(int num_layers, int num_kv_heads, int head_dim, v1::DType dtype, int page_size) {
  v1::CacheSpec s;
  s.set_num_layers(num_layers);
  s.set_num_kv_heads(num_kv_heads);
  s.set_head_dim(head_dim);
  s.set_dtype(dtype);
  s.set_page_size(page_size);
  return s;
}

v1::Tensor F32Tensor(int heads, int tokens, int head_dim, float seed) {
  std::vector<float> values(size_t(heads) * tokens * head_dim);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = std::sin(seed + 0.37f * float(i)) * 0.5f + 0.01f * seed;
  }
  v1::Tensor t;
  t.add_shape(1);
  t.add_shape(heads);
  t.add_shape(tokens);
  t.add_shape(head_dim);
  t.set_dtype(v1::FLOAT32);
  t.set_data(values.data(), values.size() * sizeof(float));
  return t;
}

v1::Tensor RandomTensor(v1::DType dtype, int heads, int tokens, int head_dim, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t n = size_t(heads) * tokens * head_dim;
  std::string bytes;
  if (dtype == v1::FLOAT32) {
    std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    bytes.assign(reinterpret_cast<const char*>(v.data()), n * 4);
  } else {
    // Random 16-bit patterns whose exponent is never all ones (no Inf / NaN).
    const int exp_shift = dtype == v1::FLOAT16 ? 10 : 7;
    const uint16_t exp_mask = dtype == v1::FLOAT16 ? 0x1f : 0xff;
    std::vector<uint16_t> v(n);
    for (uint16_t& x : v) {
      x = static_cast<uint16_t>(rng());
      if (((x >> exp_shift) & exp_mask) == exp_mask) x &= ~uint16_t(1u << exp_shift);
    }
    bytes.assign(reinterpret_cast<const char*>(v.data()), n * 2);
  }
  v1::Tensor t = F32Tensor(heads, tokens, head_dim, 0);
  t.set_dtype(dtype);
  t.set_data(std::move(bytes));
  return t;
}

std::vector<float> FloatsOf(const v1::Tensor& t) {
  std::vector<float> out(t.data().size() / sizeof(float));
  std::memcpy(out.data(), t.data().data(), out.size() * sizeof(float));
  return out;
}

v1::Tensor SliceTokens(const v1::Tensor& t, int64_t from, int64_t n) {
  const int64_t heads = t.shape(1), tokens = t.shape(2);
  const size_t row = t.data().size() / size_t(heads * tokens);  // bytes per token per head
  v1::Tensor out = t;
  out.set_shape(2, n);
  std::string bytes;
  for (int64_t h = 0; h < heads; ++h) {
    bytes.append(t.data(), size_t(h * tokens + from) * row, size_t(n) * row);
  }
  out.set_data(std::move(bytes));
  return out;
}

std::vector<float> ReferenceAttention(const std::vector<float>& q, int q_heads, int n,
                                      const std::vector<float>& k, const std::vector<float>& v,
                                      int kv_heads, int tokens, int head_dim, int64_t pos,
                                      double scale) {
  // Head-major [kv_heads][tokens][head_dim] to the reference's token-major rows.
  const size_t count = size_t(kv_heads) * tokens * head_dim;
  std::vector<double> k_rows(count), v_rows(count);
  for (int h = 0; h < kv_heads; ++h) {
    for (int t = 0; t < tokens; ++t) {
      for (int d = 0; d < head_dim; ++d) {
        const size_t from = (size_t(h) * tokens + t) * head_dim + d;
        const size_t to = (size_t(t) * kv_heads + h) * head_dim + d;
        k_rows[to] = k[from];
        v_rows[to] = v[from];
      }
    }
  }
  const std::vector<double> q64(q.begin(), q.end());
  const testing::ReferenceKv rows{k_rows.data(), v_rows.data(), 0, tokens, kv_heads, head_dim};
  const std::vector<double> out =
      testing::ReferenceAttention(rows, q64.data(), q_heads, n, pos, scale, /*window=*/0);
  return std::vector<float>(out.begin(), out.end());
}

v1::WatchEventsResponse FirstEventsBatch(v1::KvCacheService::Stub* stub, grpc::ClientContext* ctx) {
  auto watch = stub->WatchEvents(ctx, v1::WatchEventsRequest());
  v1::WatchEventsResponse batch;
  EXPECT_TRUE(watch->Read(&batch));
  ctx->TryCancel();
  watch->Finish();
  return batch;
}

void KvarenadTest::StartDaemon(std::vector<std::string> flags) {
  stub_.reset();
  daemon_ = std::make_unique<DaemonProcess>(std::move(flags));
  ASSERT_TRUE(daemon_->WaitServing()) << daemon_->Log();
  stub_ = v1::KvCacheService::NewStub(daemon_->NewChannel());
}

void KvarenadTest::TearDown() {
  // A failed test shows what the daemon said (a crash, a sanitizer report).
  if (HasFailure() && daemon_ != nullptr)
    std::fprintf(stderr, "kvarenad log:\n%s\n", daemon_->Log().c_str());
  for (AttachStream& a : attached_) {
    a.context->TryCancel();
    a.reader->Finish();
  }
  attached_.clear();
}

std::unique_ptr<grpc::ClientContext> KvarenadTest::Ctx(const std::string& session) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  if (!session.empty()) ctx->AddMetadata("kvarena-session", session);
  return ctx;
}

std::string KvarenadTest::Allocate(const v1::CacheSpec& spec, const std::string& session) {
  v1::AllocateRequest req;
  *req.mutable_spec() = spec;
  v1::AllocateResponse resp;
  const grpc::Status s = stub_->Allocate(Ctx(session).get(), req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp.cache().cache_id();
}

grpc::Status KvarenadTest::Append(const std::string& id, uint32_t layer, uint64_t pos,
                                  const v1::Tensor& k, const v1::Tensor& v,
                                  const std::string& session, v1::AppendResponse* resp) {
  v1::AppendRequest req;
  req.set_cache_id(id);
  req.set_layer(layer);
  req.set_pos(pos);
  *req.mutable_k() = k;
  *req.mutable_v() = v;
  v1::AppendResponse ignored;
  return stub_->Append(Ctx(session).get(), req, resp != nullptr ? resp : &ignored);
}

grpc::Status KvarenadTest::AppendF32(const std::string& id, uint32_t layer, uint64_t pos, int n,
                                     int heads, int head_dim, float seed,
                                     const std::string& session) {
  return Append(id, layer, pos, F32Tensor(heads, n, head_dim, seed),
                F32Tensor(heads, n, head_dim, seed + 100), session);
}

v1::StatsResponse KvarenadTest::Stats(const std::string& cache_id) {
  v1::StatsRequest req;
  req.set_cache_id(cache_id);
  v1::StatsResponse resp;
  const grpc::Status s = stub_->Stats(Ctx().get(), req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp;
}

v1::DescribeResponse KvarenadTest::Describe(const std::string& id, const std::string& session) {
  v1::DescribeRequest req;
  req.set_cache_id(id);
  v1::DescribeResponse resp;
  const grpc::Status s = stub_->Describe(Ctx(session).get(), req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp;
}

v1::GetKvResponse KvarenadTest::GetKv(const std::string& id, uint32_t layer,
                                      const std::string& session) {
  v1::GetKvRequest req;
  req.set_cache_id(id);
  req.set_layer(layer);
  v1::GetKvResponse resp;
  const grpc::Status s = stub_->GetKv(Ctx(session).get(), req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp;
}

std::string KvarenadTest::Attach(const std::string& client_name, grpc::ClientContext** context) {
  AttachStream a;
  a.channel = daemon_->NewChannel();
  a.context = std::make_unique<grpc::ClientContext>();
  v1::AttachRequest req;
  req.set_client_name(client_name);
  a.reader = v1::KvCacheService::NewStub(a.channel)->Attach(a.context.get(), req);
  v1::AttachEvent event;
  EXPECT_TRUE(a.reader->Read(&event)) << "Attach sent no first event";
  if (context != nullptr) *context = a.context.get();
  attached_.push_back(std::move(a));
  return event.session_id();
}

std::string KvarenadTest::Snapshot(const std::string& id, const std::string& session) {
  v1::StatsResponse arena = Stats();
  arena.mutable_pages()->clear_refusals();
  v1::StatsResponse cache = Stats(id);
  cache.mutable_pages()->clear_refusals();
  const v1::DescribeResponse described = Describe(id, session);
  std::string out =
      absl::StrCat("arena {", arena.ShortDebugString(), "}\ncache {", cache.ShortDebugString(),
                   "}\ndescribe {", described.ShortDebugString(), "}\n");
  for (uint32_t layer = 0; layer < described.cache().spec().num_layers(); ++layer) {
    absl::StrAppend(&out, "layer ", layer, " {", GetKv(id, layer, session).ShortDebugString(),
                    "}\n");
  }
  return out;
}

}  // namespace kvarena
