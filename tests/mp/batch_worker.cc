// kvarena_batch_worker: a model worker on the batched local path, for the multi-process
// tests (batch_test.cc, backend_test.cc). It allocates --batch caches (2 layers, the second
// sliding, 2 kv / 8 q heads, --head_dim, float16, page 4), prefills each to a different
// length through the local path, then decodes --steps steps (0: until killed) through one
// DecodeBatch, checking every sequence's output against the float64 reference (batch_reference.h).
// At the end it checks each cache's K/V with get_kv and releases them.
//
// stdout: "allocated cache ID" per cache, "decode step N" every --print_every steps,
// "calls: reserve R commit C describe D", "batch worker ok" and "worker ok" at the end; or
// "worker FAILED: why" and exit 1 (tests/support/worker_main.h).
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "base/status_macros.h"
#include "kvarena/client.h"
#include "kvarena/decode_batch.h"
#include "tests/support/batch_reference.h"
#include "tests/support/worker_main.h"

ABSL_FLAG(std::string, address, kvarena::kDefaultAddress, "unix:PATH or inproc:");
ABSL_FLAG(int, batch, 4, "caches decoding together");
ABSL_FLAG(int, head_dim, 32, "head_dim of the caches (the CUDA kernels take 64, 128, 256)");
ABSL_FLAG(int, steps, 40, "decode steps (0: until killed)");
ABSL_FLAG(int, print_every, 10, "print a progress line every N steps");
ABSL_FLAG(uint64_t, seed, 1, "random seed of the tensors");

namespace kvarena::testing {
namespace {

absl::Status Run() {
  ClientOptions options;
  options.client_name = "kvarena_batch_worker";
  options.num_threads = 1;
  KVARENA_ASSIGN_OR_RETURN(auto client, Client::Connect(absl::GetFlag(FLAGS_address), options));
  CacheSpec spec;
  spec.num_layers = 2;
  spec.num_kv_heads = 2;
  spec.head_dim = absl::GetFlag(FLAGS_head_dim);
  spec.dtype = DType::kFloat16;
  spec.page_size = 4;
  spec.layer_windows = {0, 6};
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  std::vector<std::shared_ptr<GenericKvCacheHandle>> caches;
  std::vector<std::vector<KvHistory>> history;
  for (int b = 0; b < absl::GetFlag(FLAGS_batch); ++b) {
    KVARENA_ASSIGN_OR_RETURN(auto h, (client)->Allocate(spec));
    std::printf("allocated cache %s\n", (h)->cache_id().c_str());
    caches.push_back(h);
    history.emplace_back(2, KvHistory(2, spec.head_dim));
    if (auto s = PrefillLocal(*h, history.back(), 3 * b, rng); !s.ok()) return s;
  }
  std::fflush(stdout);
  KVARENA_ASSIGN_OR_RETURN(auto batch, DecodeBatch::Create(caches));
  const int steps = absl::GetFlag(FLAGS_steps),
            every = std::max(1, absl::GetFlag(FLAGS_print_every));
  for (int step = 0; steps == 0 || step < steps; ++step) {
    if (auto s = CheckedBatchStep(*batch, caches, history, rng, 8); !s.ok()) return s;
    if ((step + 1) % every == 0) {
      std::printf("decode step %d\n", step + 1);
      std::fflush(stdout);
    }
  }
  if (auto s = CheckBatchKv(caches, history); !s.ok()) return s;
  const CallCounts calls = (client)->call_counts();
  std::printf("calls: reserve %lld commit %lld describe %lld\n",
              static_cast<long long>(calls.reserve), static_cast<long long>(calls.commit),
              static_cast<long long>(calls.describe));
  for (const auto& h : caches) {
    if (auto s = h->release(); !s.ok()) return s;
  }
  std::printf("batch worker ok\n");
  return absl::OkStatus();
}

}  // namespace
}  // namespace kvarena::testing

int main(int argc, char** argv) {
  return kvarena::testing::WorkerMain(argc, argv, kvarena::testing::Run);
}
