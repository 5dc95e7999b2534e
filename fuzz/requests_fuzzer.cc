// libFuzzer target: any sequence of wire requests, read from the input bytes, applied to
// a KvStore through the daemon's own decode-and-dispatch path (daemon/requests.h), with
// sessions, shared slices, reaping, a fake clock and, in its tier mode, the tiers below
// the arena. After every request it checks that the page accounting is whole
// (KvStore::TEST_CheckInvariants: every page owned once, pools and quotas equal to what
// caches hold, the index's tier flags, the tiers' write queue) and that a refused request
// changed nothing a client can observe (KvStore::TEST_DebugState). Any violation aborts, which
// libFuzzer reports as a crash. KVARENA_FUZZ_TRACE=1 prints every step's status.
//
// The input is read front to back as a program (fuzz/make_seeds.py writes seeds in it):
//   input   := [0xFF config:u8 | 0xFE] step...
//                                        (0xFF first: the store has tiers below its arena
//                                         and whole page hashes, fuzz/requests_tiers.h;
//                                         0xFE: metadata pressure, a budget cached
//                                         prefixes fill and give back before a refusal)
//   step    := op:u8 session:u8 fields...        (op < 240: op % 15, the original 15 ops;
//                                                 op >= 240: (op - 240) % 3 + 15, prefix
//                                                 reuse: Allocate with a namespace and
//                                                 prompt_tokens, SetTokens, Fork; with
//                                                 tiers (op - 240) % 6 + 15, then the
//                                                 tier ops: Flush, Corrupt, Pressure;
//                                                 session % (sessions + 2); the
//                                                 caller's tenant (session >> 6) % 4:
//                                                 none, alpha, beta, the operator)
//   tokens  := n:u8 int... (n % 24 token ids, small ones mostly, so prompts share prefixes)
//   int     := s:u8 [...]   s < 32: s % (small + 1); s < 48: an edge value (next u8);
//                           else the next sizeof(T) bytes, little-endian
//   id      := b:u8 [len:u8 bytes]   b < 224: one of a few ids; else a string of len bytes
//   tensor  := dtype:u8 ndims:u8 dims:int... payload:u8 [...]
//              payload % 4: 0 a scratch slice (region:u8 [int] offset:int length:int),
//              1 none, 2 exactly the shape's bytes (generated from seed:u8), 3 len:u8 bytes
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "core/kv_store.h"
#include "daemon/requests.h"
#include "fuzz/fuzz_program.h"
#include "fuzz/requests_tiers.h"
#include "kvarena/v1/kvarena.pb.h"

namespace kvarena {
namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "requests_fuzzer: %s\n", what.c_str());
  std::abort();
}

class Harness {
 public:
  static constexpr uint8_t kMetadataMode = 0xFE;

  explicit Harness(Program& in) {
    StoreOptions o;
    o.arena_bytes = size_t{12} << 20;
    o.default_page_size = 4;
    o.num_threads = 0;
    o.scratch_bytes = size_t{2} << 20;
    o.max_pools = 3;
    o.max_sessions = 3;
    o.max_caches = 12;
    o.max_caches_per_session = 6;
    o.session_max_pages = 64;
    o.max_request_tokens = 48;
    o.max_reply_bytes = 1 << 16;
    // Small enough that tiny pages' bookkeeping, long prompts and forks meet both bounds.
    o.metadata_bytes = size_t{6} << 20;
    o.session_metadata_bytes = size_t{4} << 10;
    // What cached prefixes may keep: a few dozen index nodes, so releases trim them.
    o.cached_metadata_bytes = size_t{32} << 10;
    o.idle_ttl = absl::Seconds(30);
    o.clock = &clock_;
    o.TEST_prefix_hash_bits = 6;  // collisions happen: the token-id check must hold
    // Two tenants as --tenants_file lists them: alpha with max_caches / max_pages and an
    // equal share of the metadata, beta with a small share of its own.
    o.owners["alpha"] = OwnerBounds{/*max_caches=*/4, /*max_pages=*/32};
    o.owners["beta"] = OwnerBounds{0, 0, /*max_metadata_bytes=*/size_t{2} << 10};
    if (in.Peek() == FuzzTiers::kTierMode && !in.done()) {
      in.Byte();
      tiers_ = std::make_unique<FuzzTiers>(in);
      tiers_->Configure(&o);
    } else if (in.Peek() == kMetadataMode && !in.done()) {
      in.Byte();
      // A budget a few hundred index nodes fill (a pool of 512-byte pages keeps 64 KiB
      // of it for page bookkeeping), which cached prefixes may take whole: a charge
      // that finds it full takes it back from them, or is refused changing nothing.
      o.metadata_bytes = size_t{192} << 10;
      o.session_metadata_bytes = 0;
      o.cached_metadata_bytes = o.metadata_bytes;
      o.TEST_prefix_hash_bits = 128;  // chains grow whole, to fill the budget
    }
    auto store = KvStore::Create(o, NewHostBackend());
    if (!store.ok()) Fail(std::string(store.status().message()));
    store_ = *std::move(store);
    requests_ = std::make_unique<Requests>(store_.get());
    // Two tenants and the operator, as --tenants_file would list them; callers without a
    // tenant share the store too, which the daemon never mixes but the store allows.
    tenants_[0] = Tenant{"alpha", "alpha-token-0123456789"};
    tenants_[1] = Tenant{"beta", "beta-token-0123456789"};
    tenants_[2] = Tenant{"ops", "ops-token-0123456789", /*operator_role=*/true};
  }

  void Run(Program& in) {
    for (int steps = 0; !in.done() && steps < 256; ++steps) Step(in);
    Check("end", absl::OkStatus(), "");
    if (trace_ && tiers_) std::fprintf(stderr, "%s", tiers_->Summary().c_str());
    if (trace_) {
      const ArenaStats s = store_->Stats();
      std::fprintf(stderr,
                   "metadata: %llu of %llu used, cached prefixes %llu of %llu, %llu pages "
                   "reclaimed for metadata\n",
                   (unsigned long long)s.metadata_bytes_used, (unsigned long long)s.metadata_bytes,
                   (unsigned long long)s.cached_metadata_bytes,
                   (unsigned long long)s.cached_metadata_limit,
                   (unsigned long long)s.pages.pages_reclaimed_for_metadata);
    }
  }

 private:
  Caller CallerOf(Program& in) {
    const uint8_t b = in.Byte();
    Caller caller;
    caller.tenant = (b >> 6) % 4 == 0 ? nullptr : &tenants_[(b >> 6) % 4 - 1];
    const size_t i = b % (sessions_.size() + 2);
    if (i < sessions_.size())
      caller.session = sessions_[i];
    else
      caller.session = i == sessions_.size() ? "" : "not-a-session";
    return caller;
  }
  std::string CacheId(Program& in) {
    static const char* kIds[] = {"a", "b", "c", "d", "", "cache-1", "cache-2"};
    const uint8_t b = in.Byte();
    if (b < 224) return kIds[b % std::size(kIds)];
    return in.Bytes(b == 255 ? 300 : in.Byte());
  }
  void FillSpec(Program& in, v1::CacheSpec* s) {
    s->set_num_layers(in.Int<uint32_t>(3));
    s->set_num_kv_heads(in.Int<uint32_t>(3));
    s->set_head_dim(in.Int<uint32_t>(8));
    s->set_dtype(v1::DType(in.Byte() % 5));
    s->set_page_size(in.Int<uint32_t>(5));
    const int windows = in.Byte() % 5;
    for (int i = 0; i < windows; ++i) s->add_layer_windows(in.Int<uint32_t>(9));
    if (in.Bool()) s->set_max_tokens(in.Int<uint64_t>(40));
  }
  template <typename Field>
  void FillTokens(Program& in, Field* ids) {
    const int n = in.Byte() % 24;
    for (int i = 0; i < n; ++i) ids->Add(in.Int<int32_t>(3));
  }
  void FillTensor(Program& in, v1::Tensor* t) {
    t->set_dtype(v1::DType(in.Byte() % 5));
    const int dims = in.Byte() % 6;
    int64_t count = 1;
    for (int d = 0; d < dims; ++d) {
      const int64_t v = in.Int<int64_t>(d == 3 ? 8 : 3);
      t->add_shape(v);
      count = (v >= 0 && v < 4096 && count < 4096) ? count * v : int64_t{1} << 20;
    }
    const int64_t elem = t->dtype() == v1::FLOAT32 ? 4 : 2;
    switch (in.Byte() % 4) {
      case 0: {
        v1::SharedSlice* s = t->mutable_shared();
        const uint8_t r = in.Byte();
        s->set_region_id(r < 128 ? (uint64_t{1} << 32) + r % 4 : in.Int<uint64_t>());
        s->set_offset(in.Int<uint64_t>(255) * 64);
        const uint64_t length = in.Int<uint64_t>(255);
        s->set_length(length == 0 && count < 4096 ? uint64_t(count * elem) : length);
        break;
      }
      case 1:
        break;
      case 2: {
        std::string data(count < 4096 ? size_t(count * elem) : 0, '\0');
        uint32_t x = in.Byte() * 2654435761u + 1;  // finite values as raw bits don't matter
        for (char& c : data) c = char((x = x * 1103515245u + 12345u) >> 24);
        t->set_data(std::move(data));
        break;
      }
      default:
        t->set_data(in.Bytes(in.Byte()));
    }
  }

  void Check(const char* op, const absl::Status& status, const std::string& before) {
    if (trace_) std::fprintf(stderr, "%s: %s\n", op, status.ToString().c_str());
    if (absl::Status s = store_->TEST_CheckInvariants(); !s.ok()) {
      Fail(absl::StrCat("after ", op, " (", status.ToString(), "): ", s.message()));
    }
    if (!status.ok() && store_->TEST_DebugState() != before) {
      Fail(absl::StrCat(op, " was refused (", status.ToString(), ") but changed the store:\n",
                        before, "---\n", store_->TEST_DebugState()));
    }
  }

  void Step(Program& in);

  FakeClock clock_;
  std::unique_ptr<FuzzTiers> tiers_;  // tier mode only
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<Requests> requests_;
  std::vector<std::string> sessions_;
  Tenant tenants_[3];
  const bool trace_ = std::getenv("KVARENA_FUZZ_TRACE") != nullptr;
};

void Harness::Step(Program& in) {
  const uint8_t code = in.Byte();
  const int op = code < 240 ? code % 15 : 15 + (code - 240) % (tiers_ ? 3 + FuzzTiers::kOps : 3);
  const Caller session = CallerOf(in);
  const std::string before = store_->TEST_DebugState();
  absl::Status status;
  const char* name = "";
  switch (op) {
    case 0: {
      name = "Allocate";
      v1::AllocateRequest req;
      FillSpec(in, req.mutable_spec());
      req.set_cache_id(CacheId(in));
      v1::AllocateResponse resp;
      status = requests_->Allocate(session, req, &resp);
      break;
    }
    case 1: {
      name = "Append";
      v1::AppendRequest req;
      req.set_cache_id(CacheId(in));
      req.set_layer(in.Int<uint32_t>(3));
      req.set_pos(in.Int<uint64_t>(40));
      FillTensor(in, req.mutable_k());
      if (in.Bool()) {
        *req.mutable_v() = req.k();
      } else {
        FillTensor(in, req.mutable_v());
      }
      v1::AppendResponse resp;
      status = requests_->Append(session, req, &resp);
      break;
    }
    case 2: {
      name = "Attend";
      v1::AttendRequest req;
      req.set_cache_id(CacheId(in));
      req.set_layer(in.Int<uint32_t>(3));
      req.set_pos(in.Int<uint64_t>(40));
      FillTensor(in, req.mutable_q());
      const uint8_t kv = in.Byte();
      if (kv & 1) FillTensor(in, req.mutable_k());
      if (kv & 2) FillTensor(in, req.mutable_v());
      if (kv & 4) req.set_scale(in.Raw<double>());
      req.set_window(in.Int<uint32_t>(9));
      if (kv & 8) {
        v1::Tensor t;
        FillTensor(in, &t);
        if (t.has_shared()) *req.mutable_out() = t.shared();
      }
      v1::AttendResponse resp;
      status = requests_->Attend(session, req, &resp);
      break;
    }
    case 3: {
      name = "Popn";
      v1::PopnRequest req;
      req.set_cache_id(CacheId(in));
      req.set_n(in.Int<uint64_t>(8));
      v1::PopnResponse resp;
      status = requests_->Popn(session, req, &resp);
      break;
    }
    case 4: {
      name = "Reset";
      v1::ResetRequest req;
      req.set_cache_id(CacheId(in));
      req.set_keep_pages(in.Bool());
      v1::ResetResponse resp;
      status = requests_->Reset(session, req, &resp);
      break;
    }
    case 5: {
      name = "Release";
      v1::ReleaseRequest req;
      req.set_cache_id(CacheId(in));
      v1::ReleaseResponse resp;
      status = requests_->Release(session, req, &resp);
      break;
    }
    case 6:
    case 7: {
      name = op == 6 ? "Reserve" : "Commit";
      google::protobuf::RepeatedPtrField<v1::CacheTokens> items;
      const int n = in.Byte() % 5;
      for (int i = 0; i < n; ++i) {
        v1::CacheTokens* t = items.Add();
        t->set_cache_id(CacheId(in));
        t->set_tokens(in.Int<uint64_t>(20));
      }
      if (op == 6) {
        v1::ReserveRequest req;
        *req.mutable_items() = items;
        v1::ReserveResponse resp;
        status = requests_->Reserve(session, req, &resp);
      } else {
        v1::CommitRequest req;
        *req.mutable_items() = items;
        v1::CommitResponse resp;
        status = requests_->Commit(session, req, &resp);
      }
      break;
    }
    case 8: {
      name = "GetKv";
      v1::GetKvRequest req;
      req.set_cache_id(CacheId(in));
      req.set_layer(in.Int<uint32_t>(3));
      req.set_from_pos(in.Int<uint64_t>(40));
      req.set_max_tokens(in.Int<uint64_t>(40));
      v1::GetKvResponse resp;
      status = requests_->GetKv(session, req, &resp);
      break;
    }
    case 9: {
      name = "Describe";
      v1::DescribeRequest req;
      req.set_cache_id(CacheId(in));
      v1::DescribeResponse resp;
      status = requests_->Describe(session, req, &resp);
      break;
    }
    case 10: {
      name = "Stats";
      v1::StatsRequest req;
      if (in.Bool()) req.set_cache_id(CacheId(in));
      v1::StatsResponse resp;
      status = requests_->Stats(session, req, &resp);
      break;
    }
    case 11: {
      name = "OpenSession";  // a new session changes the stats: only the invariants apply
      SessionPeer peer;
      peer.owner = TenantScope(session.tenant).owner();
      absl::StatusOr<SessionAttachment> s =
          store_->AttachSession(in.Bytes(in.Byte() % 8), "", peer);
      if (s.ok()) sessions_.push_back(s->session_id);
      return Check(name, absl::OkStatus(), before);
    }
    case 12: {
      name = "DetachSession";
      if (!session.session.empty()) {
        store_->DetachSession(session.session, absl::Seconds(in.Byte() % 10));
      }
      return Check(name, absl::OkStatus(), before);
    }
    case 13: {
      name = "Reap";
      clock_.Advance(absl::Seconds(in.Byte() % 40));
      store_->Reap();
      return Check(name, absl::OkStatus(), before);
    }
    case 14: {
      name = "ListCaches";
      v1::ListCachesResponse resp;
      status = requests_->ListCaches(session, v1::ListCachesRequest(), &resp);
      break;
    }
    case 15: {
      name = "AllocatePrompt";
      v1::AllocateRequest req;
      FillSpec(in, req.mutable_spec());
      static const char* kNamespaces[] = {"", "m", "n"};
      req.mutable_spec()->set_prefix_namespace(kNamespaces[in.Byte() % 3]);
      req.set_cache_id(CacheId(in));
      FillTokens(in, req.mutable_prompt_tokens());
      v1::AllocateResponse resp;
      status = requests_->Allocate(session, req, &resp);
      break;
    }
    case 16: {
      name = "SetTokens";
      v1::SetTokensRequest req;
      req.set_cache_id(CacheId(in));
      req.set_first_pos(in.Int<uint64_t>(40));
      FillTokens(in, req.mutable_token_ids());
      v1::SetTokensResponse resp;
      status = requests_->SetTokens(session, req, &resp);
      break;
    }
    case 17: {
      name = "Fork";
      v1::ForkRequest req;
      req.set_cache_id(CacheId(in));
      req.set_new_cache_id(CacheId(in));
      v1::ForkResponse resp;
      status = requests_->Fork(session, req, &resp);
      break;
    }
    default:  // the tier ops: their effects show only in the invariants
      return Check(tiers_->Step(op - 18, in, store_.get()), absl::OkStatus(), before);
  }
  Check(name, status, before);
}

}  // namespace
}  // namespace kvarena

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvarena::Program in(data, size);
  kvarena::Harness harness(in);
  harness.Run(in);
  return 0;
}
