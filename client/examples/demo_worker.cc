// kvarena_demo: a tour of the client API against a running kvarenad (default
// unix:/tmp/kvarena.sock). It allocates a 4-layer cache (layer 3 has a 32-token sliding
// window), runs a prefill and decode steps through attention (append + attend), rolls back
// a rejected 3-token draft with popn, and prints the page statistics after each phase.
// Then four caches decode together through a DecodeBatch (the batched local path).
// The working caches belong to the demo's session and are released at the end.
//
// With --keep (the default) it also leaves one cache, "kvarena-demo", allocated with no
// session so it outlives the demo and `kvarena caches` / `kvarena stats` show it. A rerun
// replaces it; grpcurl's Release (printed at the end) frees it.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "kvarena/client.h"
#include "kvarena/decode_batch.h"

ABSL_FLAG(std::string, address, kvarena::kDefaultAddress, "unix:PATH, HOST:PORT or inproc:");
ABSL_FLAG(bool, keep, true, "leave the 'kvarena-demo' cache allocated (no session)");
ABSL_FLAG(int, prefill, 100, "prefill tokens");
ABSL_FLAG(int, decode, 40, "decode steps");

namespace kvarena {
namespace {

constexpr int kLayers = 4, kKvHeads = 2, kQHeads = 8, kHeadDim = 64, kWindow = 32;

// A float32 tensor [batch, heads, n, head_dim] of small random values.
struct Tensor {
  std::vector<float> data;
  TensorArg arg;
  Tensor(std::mt19937& rng, int heads, int64_t n, int batch = 1)
      : data(size_t(batch) * heads * n * kHeadDim) {
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    for (float& x : data) x = dist(rng);
    arg = {DType::kFloat32, {batch, heads, n, kHeadDim}, data.data(), data.size() * sizeof(float)};
  }
};

std::string Bytes(uint64_t b) {
  if (b < 1024) return absl::StrCat(b, " B");
  if (b < (1u << 20)) return absl::StrCat(b / 1024, " KiB");
  return absl::StrCat(b >> 20, " MiB");
}

absl::Status Show(const char* phase, Client& client, const GenericKvCacheHandle& cache) {
  KVARENA_ASSIGN_OR_RETURN(auto p, cache.page_stats());
  KVARENA_ASSIGN_OR_RETURN(auto a, client.Stats());
  std::printf("[%-8s] cache %s: %" PRId64 " tokens, %" PRId64 " pages (%s), layers %" PRId64
              "/%" PRId64 " materialized, %" PRId64 " sliding, %" PRIu64 " pages evicted\n",
              phase, cache.cache_id().c_str(), p.seq_len, p.pages_used, Bytes(p.bytes_used).c_str(),
              p.layers_materialized, p.layers_total, p.layers_sliding, p.pages_evicted);
  std::printf("%11s arena: %" PRId64 " of %" PRId64 " pages used, %" PRId64 " caches, %" PRId64
              " sessions, %s committed\n",
              "", a.pages.pages_used, a.pages.num_pages, a.num_caches, a.num_sessions,
              Bytes(a.bytes_committed).c_str());
  return absl::OkStatus();
}

// n tokens on every layer through attention (append k/v, attend q over past + new).
absl::Status Run(GenericKvCacheHandle& cache, std::mt19937& rng, int64_t n) {
  for (int layer = 0; layer < cache.num_layers(); ++layer) {
    Tensor q(rng, kQHeads, n), k(rng, kKvHeads, n), v(rng, kKvHeads, n);
    KVARENA_ASSIGN_OR_RETURN(auto out, cache.attention(layer, q.arg, k.arg, v.arg));
  }
  return absl::OkStatus();
}

CacheSpec DemoSpec() {
  CacheSpec spec;
  spec.num_layers = kLayers;
  spec.num_kv_heads = kKvHeads;
  spec.head_dim = kHeadDim;
  spec.dtype = DType::kFloat32;
  spec.layer_windows = {0, 0, 0, kWindow};
  return spec;
}

// The batched local path (kvarena/decode_batch.h): kBatch caches decode together, one Run
// per layer for all of them over this process's mapping of the pool; the daemon only
// reserves pages (about one Reserve per page) and commits lengths (one Commit per step).
// Needs the pool mapped (unix: or inproc:); over TCP it says why and is skipped.
absl::Status BatchDecode(Client& client, std::mt19937& rng, int steps) {
  constexpr int kBatch = 4;
  std::vector<std::shared_ptr<GenericKvCacheHandle>> caches;
  for (int b = 0; b < kBatch; ++b) {
    KVARENA_ASSIGN_OR_RETURN(auto c, client.Allocate(DemoSpec()));
    caches.push_back(c);
  }
  auto batch = DecodeBatch::Create(caches);
  if (absl::IsFailedPrecondition(batch.status())) {
    std::printf("[batch   ] skipped: %s\n", batch.status().ToString().c_str());
  } else if (!batch.ok()) {
    return batch.status();
  } else {
    const CallCounts before = client.call_counts();
    std::vector<float> out(size_t(kBatch) * kQHeads * kHeadDim);
    for (int step = 0; step < steps; ++step) {
      KVARENA_RETURN_IF_ERROR((*batch)->Plan());
      for (int layer = 0; layer < kLayers; ++layer) {
        Tensor q(rng, kQHeads, 1, kBatch), k(rng, kKvHeads, 1, kBatch), v(rng, kKvHeads, 1, kBatch);
        const TensorBuffer o{out.data(), out.size() * sizeof(float)};
        KVARENA_RETURN_IF_ERROR((*batch)->Run(layer, q.arg, k.arg, v.arg, o));
      }
      KVARENA_RETURN_IF_ERROR((*batch)->Commit());
    }
    const CallCounts after = client.call_counts();
    std::printf(
        "[batch   ] %d caches x %d steps through one DecodeBatch: %d kernel calls a step, "
        "%" PRId64 " Reserve and %" PRId64 " Commit RPCs in all\n",
        kBatch, steps, 2 * kLayers, after.reserve - before.reserve, after.commit - before.commit);
    KVARENA_RETURN_IF_ERROR(Show("batch", client, *caches[0]));
  }
  for (const auto& c : caches) {
    KVARENA_RETURN_IF_ERROR(c->release());
  }
  return absl::OkStatus();
}

absl::Status KeepOne(const std::string& address, std::mt19937& rng) {
  ClientOptions options;
  options.attach = false;  // no session: the cache outlives this process
  options.client_name = "kvarena-demo-keep";
  KVARENA_ASSIGN_OR_RETURN(auto client, Client::Connect(address, options));
  auto cache = (client)->Allocate(DemoSpec(), "kvarena-demo");
  if (cache.status().code() == absl::StatusCode::kAlreadyExists) {  // from an earlier run
    KVARENA_RETURN_IF_ERROR((client)->Release("kvarena-demo"));
    cache = (client)->Allocate(DemoSpec(), "kvarena-demo");
  }
  KVARENA_RETURN_IF_ERROR(cache.status());
  KVARENA_RETURN_IF_ERROR(Run(**cache, rng, 48));
  return Show("kept", *client, **cache);
}

absl::Status Demo() {
  const std::string address = absl::GetFlag(FLAGS_address);
  ClientOptions options;
  options.client_name = "kvarena-demo";
  KVARENA_ASSIGN_OR_RETURN(auto client, Client::Connect(address, options));
  std::printf("connected to %s, session %s\n", address.c_str(),
              SessionIdForLog((client)->session_id()).c_str());

  KVARENA_ASSIGN_OR_RETURN(auto cache, (client)->Allocate(DemoSpec()));
  GenericKvCacheHandle& c = *cache;
  std::printf(
      "allocated cache %s: %d layers, %d kv heads, head_dim %d, %s, page_size %d, "
      "device %s, windows [%s]\n",
      c.cache_id().c_str(), c.num_layers(), c.num_kv_heads(), c.head_dim(), DTypeName(c.dtype()),
      c.page_size(), c.device().c_str(), absl::StrJoin(c.layer_windows(), ",").c_str());
  KVARENA_RETURN_IF_ERROR(Show("empty", *client, c));

  std::mt19937 rng(7);
  KVARENA_RETURN_IF_ERROR(Run(c, rng, absl::GetFlag(FLAGS_prefill)));
  KVARENA_RETURN_IF_ERROR(Show("prefill", *client, c));

  for (int i = 0; i < absl::GetFlag(FLAGS_decode); ++i) {
    KVARENA_RETURN_IF_ERROR(Run(c, rng, 1));
  }
  KVARENA_RETURN_IF_ERROR(Show("decode", *client, c));

  auto popped = c.popn(3);  // a rejected 3-token speculative draft
  KVARENA_RETURN_IF_ERROR(popped.status());
  std::printf("popn(3): popped %" PRId64 "%s\n", popped->popped,
              popped->refusal.empty() ? "" : absl::StrCat(" (", popped->refusal, ")").c_str());
  KVARENA_RETURN_IF_ERROR(Show("popn", *client, c));

  KVARENA_ASSIGN_OR_RETURN(auto table, c.block_table(3));
  KVARENA_ASSIGN_OR_RETURN(auto kv, c.get_kv(3));
  std::printf(
      "layer 3 (window %d): block table [%s], get_kv holds positions %" PRId64 "..%" PRId64 "\n",
      kWindow, absl::StrJoin(table, ",").c_str(), kv.first_pos, kv.first_pos + kv.k.shape[2] - 1);

  KVARENA_RETURN_IF_ERROR(c.release());
  std::printf("released %s (is_valid=%s)\n", c.cache_id().c_str(), c.is_valid() ? "true" : "false");

  KVARENA_RETURN_IF_ERROR(BatchDecode(*client, rng, absl::GetFlag(FLAGS_decode)));

  if (absl::GetFlag(FLAGS_keep)) {
    KVARENA_RETURN_IF_ERROR(KeepOne(address, rng));
    const bool unix_socket = address.rfind("unix:", 0) == 0;
    std::printf(
        "left cache 'kvarena-demo' allocated (no session). Free it with:\n"
        "  grpcurl -plaintext%s -d '{\"cache_id\":\"kvarena-demo\"}' %s "
        "kvarena.v1.KvCacheService/Release\n",
        unix_socket ? " -unix" : "", unix_socket ? address.substr(5).c_str() : address.c_str());
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace kvarena

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = kvarena::Demo(); !s.ok()) {
    std::fprintf(stderr, "kvarena_demo: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
