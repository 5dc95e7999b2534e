// kvarena_arena_filler: a worker that makes kvarenad refuse work for want of arena memory,
// so tests/prometheus can watch the refusal counters and the arena's fullness move.
//
// --fill: allocates a cache and appends one page of tokens per call (the served path) until
// an Append is refused RESOURCE_EXHAUSTED (the arena full: one refusal), and keeps the cache
// (the daemon holds it for its session's grace after this process exits).
// --refusals=N: allocates a new cache and makes N appends of one page each, every one of
// which must be refused RESOURCE_EXHAUSTED (run after --fill, the arena still full); then
// releases that cache.
//
// stdout: "filled P pages, 1 refusal" / "refused N appends". Exits 0 when every call went
// as described; 1, printing the status, otherwise.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvarena/client.h"

ABSL_FLAG(std::string, address, kvarena::kDefaultAddress, "unix:PATH or HOST:PORT");
ABSL_FLAG(bool, fill, false, "append pages until the arena refuses one");
ABSL_FLAG(int, refusals, 0, "appends that must be refused (after --fill)");
ABSL_FLAG(int, max_pages, 100000, "--fill fails when this many pages fit");

namespace kvarena {
namespace {

// One page of 128 KiB (K and V of 16 tokens x 8 heads x 128 float32): an 8 MiB arena
// holds 64 of them.
constexpr int kPageSize = 16, kKvHeads = 8, kHeadDim = 128;

CacheSpec Spec() {
  CacheSpec spec;
  spec.num_layers = 1;
  spec.num_kv_heads = kKvHeads;
  spec.head_dim = kHeadDim;
  spec.dtype = DType::kFloat32;
  spec.page_size = kPageSize;
  return spec;
}

// Appends one page of tokens (zeros) to layer 0.
absl::Status AppendPage(GenericKvCacheHandle& cache) {
  static const std::vector<float> zeros(size_t(kKvHeads) * kPageSize * kHeadDim, 0.f);
  const TensorArg kv{DType::kFloat32,
                     {1, kKvHeads, kPageSize, kHeadDim},
                     zeros.data(),
                     zeros.size() * sizeof(float)};
  return cache.append(0, kv, kv).status();
}

absl::Status Fill(Client& client, int max_pages) {
  KVARENA_ASSIGN_OR_RETURN(auto cache, client.Allocate(Spec(), "arena-filler"));
  for (int pages = 0; pages <= max_pages; ++pages) {
    const absl::Status s = AppendPage(*cache);
    if (absl::IsResourceExhausted(s)) {
      std::printf("filled %d pages, 1 refusal: %s\n", pages, s.ToString().c_str());
      return absl::OkStatus();
    }
    KVARENA_RETURN_IF_ERROR(s);
  }
  return absl::FailedPreconditionError(
      absl::StrCat("fill: ", max_pages + 1, " pages appended and none refused"));
}

absl::Status Refuse(Client& client, int refusals) {
  KVARENA_ASSIGN_OR_RETURN(auto cache, client.Allocate(Spec()));
  for (int i = 0; i < refusals; ++i) {
    const absl::Status s = AppendPage(*cache);
    if (!absl::IsResourceExhausted(s)) {
      return absl::FailedPreconditionError(
          absl::StrCat("append ", i + 1, " of ", refusals,
                       " was not refused RESOURCE_EXHAUSTED: ", s.ToString()));
    }
  }
  std::printf("refused %d appends\n", refusals);
  return cache->release();
}

absl::Status Run() {
  KVARENA_ASSIGN_OR_RETURN(auto client, Client::Connect(absl::GetFlag(FLAGS_address)));
  if (absl::GetFlag(FLAGS_fill)) {
    KVARENA_RETURN_IF_ERROR(Fill(*client, absl::GetFlag(FLAGS_max_pages)));
  }
  if (absl::GetFlag(FLAGS_refusals) > 0) {
    KVARENA_RETURN_IF_ERROR(Refuse(*client, absl::GetFlag(FLAGS_refusals)));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace kvarena

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status s = kvarena::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "kvarena_arena_filler: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
