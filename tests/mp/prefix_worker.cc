// kvarena_prefix_worker: a model worker stand-in for the prefix-reuse tests. Its "model"
// is deterministic: the K, V and query of position p on layer l are a function of the
// token ids [0, p] and l alone, so two processes computing the same prompt write the same
// bytes, and an output at position p is a function of the prompt up to p.
//
// It allocates one cache with the prompt as prompt_tokens (and --namespace as the spec's
// prefix_namespace), checks that the cached_tokens it adopted hold exactly the model's
// K/V, computes the rest of the prompt (in two blocks with --split_at, so a run without
// reuse can make the very calls a run with reuse makes), decodes --decode tokens (each
// one's id declared with SetTokens), and checks every output against a float64 reference
// and every layer's get_kv against the model bit for bit. --out writes one line per output
// row: "pos layer fnv64-of-its-bytes", for tests that compare runs bit for bit.
//
// --local computes through the local path (reserve, attention_local over the mapped pool
// — adopted pages included — and commit) instead of Attend RPCs. --fork forks the cache
// after the prompt and decodes different tokens into each, checking that neither sees the
// other's. --pause_after_prefill and --hold stop (after the prompt; before release) until
// SIGUSR1, holding the cache, so tests can look at the arena or SIGKILL the worker there.
//
// stdout: "allocated cached_tokens=N ...", "prefill done ...", "paused after prefill",
// "fork ok", "holding", "worker ok"; or "worker FAILED: ...".

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvarena/client.h"
#include "tests/support/kv_history.h"
#include "tests/support/worker_main.h"

ABSL_FLAG(std::string, address, kvarena::kDefaultAddress, "unix:PATH, HOST:PORT or inproc:");
ABSL_FLAG(std::string, prefix_namespace, "model",
          "the spec's prefix_namespace (\"\": share nothing)");
ABSL_FLAG(int, prompt_len, 200, "prompt tokens");
ABSL_FLAG(int, prompt_seed, 1, "which prompt");
ABSL_FLAG(int, differ_at, -1, "change the prompt's token at this index (-1: none)");
ABSL_FLAG(int, previous_answer, 0,
          "a next turn: the prompt, then the first N tokens a previous run decoded (decode_seed "
          "+ step), then 50 new ones");
ABSL_FLAG(int, layers, 4, "num_layers");
ABSL_FLAG(int, kv_heads, 2, "num_kv_heads");
ABSL_FLAG(int, q_heads, 4, "query heads");
ABSL_FLAG(int, head_dim, 64, "head_dim");
ABSL_FLAG(int, page_size, 16, "tokens per page");
ABSL_FLAG(int, window, 0, "sliding window of the odd layers (0: every layer global)");
ABSL_FLAG(int, decode, 8, "decode steps after the prompt");
ABSL_FLAG(int, decode_seed, 1000, "the decoded tokens are decode_seed + step");
ABSL_FLAG(int, split_at, -1, "compute the prompt from cached_tokens in two blocks split here");
ABSL_FLAG(int, expect_cached, -1, "fail unless cached_tokens is this (-1: no check)");
ABSL_FLAG(bool, local, false, "compute through the local path");
ABSL_FLAG(int, num_threads, 1, "CPU threads of the local path's kernels");
ABSL_FLAG(bool, fork, false, "fork after the prompt; decode different tokens into each");
ABSL_FLAG(bool, pause_after_prefill, false, "print \"paused after prefill\", wait for SIGUSR1");
ABSL_FLAG(bool, hold, false, "before releasing, print \"holding\" and wait for SIGUSR1");
ABSL_FLAG(std::string, out, "", "write \"pos layer fnv\" per output row here");
ABSL_FLAG(bool, check, true,
          "check outputs against the float64 reference (off: only time the prefill, for the "
          "time-to-first-token figures in bench/RESULTS.md)");

namespace kvarena {
namespace {

using testing::HostTensor;
using testing::KvHistory;

uint64_t Fnv(const void* data, size_t n, uint64_t h = 1469598103934665603u) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211u;
  return h;
}

std::vector<int32_t> Prompt() {
  std::vector<int32_t> t;
  const int seed = absl::GetFlag(FLAGS_prompt_seed);
  for (int i = 0; i < absl::GetFlag(FLAGS_prompt_len); ++i)
    t.push_back((seed * 1000003 + i * 7919) % 50000);
  if (int d = absl::GetFlag(FLAGS_differ_at); d >= 0 && d < int(t.size())) t[size_t(d)] += 1;
  if (const int answer = absl::GetFlag(FLAGS_previous_answer); answer > 0) {
    for (int s = 0; s < answer; ++s) t.push_back(absl::GetFlag(FLAGS_decode_seed) + s);
    for (int i = 0; i < 50; ++i) t.push_back(40000 + i);
  }
  return t;
}

// One cache and the token ids of its positions, computed through the toy model.
class Sequence {
 public:
  Sequence(std::shared_ptr<GenericKvCacheHandle> cache, std::vector<int32_t> tokens, FILE* out)
      : cache_(std::move(cache)), tokens_(std::move(tokens)), out_(out) {
    for (int l = 0; l < cache_->num_layers(); ++l)
      history_.emplace_back(cache_->num_kv_heads(), cache_->head_dim());
  }
  GenericKvCacheHandle& cache() { return *cache_; }
  std::vector<int32_t>& tokens() { return tokens_; }

  // The model's tensor of positions [from, to): kind 0 = K, 1 = V, 2 = q.
  HostTensor Model(int layer, int kind, int64_t from, int64_t to) const {
    const int heads = kind == 2 ? absl::GetFlag(FLAGS_q_heads) : cache_->num_kv_heads();
    const int dim = cache_->head_dim();
    HostTensor t;
    t.dtype = cache_->dtype();
    t.shape = {1, heads, to - from, dim};
    t.values.resize(size_t(heads * (to - from) * dim));
    uint64_t h = Fnv(&layer, sizeof layer, 1469598103934665603u ^ uint64_t(kind));
    for (int64_t p = 0; p < from; ++p) h = Fnv(&tokens_[size_t(p)], 4, h);
    for (int64_t p = from; p < to; ++p) {
      h = Fnv(&tokens_[size_t(p)], 4, h);
      for (int hd = 0; hd < heads; ++hd) {
        for (int d = 0; d < dim; ++d) {
          const uint64_t x = (h ^ uint64_t(hd * dim + d)) * 0x9E3779B97F4A7C15u;
          const double v = double(int64_t(x >> 40) % 2001 - 1000) / 1000.0;
          t.values[size_t((hd * (to - from) + (p - from)) * dim + d)] =
              testing::RoundTo(v, t.dtype);
        }
      }
    }
    t.bytes = testing::EncodeValues(t.values, t.dtype);
    return t;
  }

  // Positions [0, n) were adopted: the history takes the model's K/V (get_kv must show
  // them: CheckGetKv).
  void Adopted(int64_t n) {
    if (n == 0) return;
    for (int l = 0; l < cache_->num_layers(); ++l)
      history_[size_t(l)].Append(Model(l, 0, 0, n), Model(l, 1, 0, n));
  }

  // Computes positions [from, to) on every layer, checking outputs against the reference.
  absl::Status Compute(int64_t from, int64_t to, bool local) {
    const int64_t n = to - from;
    if (local) KVARENA_RETURN_IF_ERROR(cache_->reserve(n));
    for (int l = 0; l < cache_->num_layers(); ++l) {
      HostTensor q = Model(l, 2, from, to), k = Model(l, 0, from, to), v = Model(l, 1, from, to);
      auto out = local ? cache_->attention_local(l, q.arg(), k.arg(), v.arg())
                       : cache_->attention(l, q.arg(), k.arg(), v.arg());
      if (!out.ok()) {
        return absl::Status(out.status().code(),
                            absl::StrCat("layer ", l, " positions [", from, ", ", to,
                                         "): ", out.status().message()));
      }
      history_[size_t(l)].Append(k, v);
      if (absl::GetFlag(FLAGS_check)) {
        const auto ref =
            history_[size_t(l)].Attention(q, from, 0, cache_->layer_windows()[size_t(l)]);
        KVARENA_RETURN_IF_ERROR(
            testing::CompareOutput(absl::StrCat("layer ", l, " pos ", from), *out, ref));
      }
      if (out_ != nullptr) {  // one row per position: every head's output there
        const int heads = absl::GetFlag(FLAGS_q_heads);
        const size_t row = out->data.size() / size_t(heads * n);
        for (int64_t i = 0; i < n; ++i) {
          uint64_t h = 1469598103934665603u;
          for (int hd = 0; hd < heads; ++hd)
            h = Fnv(out->data.data() + (size_t(hd * n + i)) * row, row, h);
          std::fprintf(out_, "%lld %d %016llx\n", static_cast<long long>(from + i), l,
                       static_cast<unsigned long long>(h));
        }
      }
    }
    if (local) KVARENA_RETURN_IF_ERROR(cache_->commit(n));
    return absl::OkStatus();
  }

  // Decodes one token: declares its id, computes its position.
  absl::Status Decode(int32_t token, bool local) {
    const int64_t pos = int64_t(tokens_.size());
    tokens_.push_back(token);
    KVARENA_RETURN_IF_ERROR(cache_->set_tokens(pos, {token}));
    return Compute(pos, pos + 1, local);
  }

  // Every layer's get_kv equals the model's K/V from its first_pos on, bit for bit.
  absl::Status CheckGetKv(const std::string& what) const {
    for (int l = 0; l < cache_->num_layers(); ++l) {
      KVARENA_ASSIGN_OR_RETURN(auto kv, cache_->get_kv(l));
      const std::string at = absl::StrCat(what, " get_kv layer ", l);
      KVARENA_RETURN_IF_ERROR(
          testing::CompareExact(at + " k", kv.k, history_[size_t(l)].HeadMajor(0, kv.first_pos)));
      KVARENA_RETURN_IF_ERROR(
          testing::CompareExact(at + " v", kv.v, history_[size_t(l)].HeadMajor(1, kv.first_pos)));
    }
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<GenericKvCacheHandle> cache_;
  std::vector<int32_t> tokens_;
  FILE* out_;
  std::vector<KvHistory> history_;
};

absl::Status Run() {
  ClientOptions options;
  options.client_name = "kvarena_prefix_worker";
  options.num_threads = absl::GetFlag(FLAGS_num_threads);
  KVARENA_ASSIGN_OR_RETURN(auto client, Client::Connect(absl::GetFlag(FLAGS_address), options));
  CacheSpec spec;
  spec.num_layers = absl::GetFlag(FLAGS_layers);
  spec.num_kv_heads = absl::GetFlag(FLAGS_kv_heads);
  spec.head_dim = absl::GetFlag(FLAGS_head_dim);
  spec.dtype = DType::kFloat32;
  spec.page_size = absl::GetFlag(FLAGS_page_size);
  spec.prefix_namespace = absl::GetFlag(FLAGS_prefix_namespace);
  if (const int w = absl::GetFlag(FLAGS_window); w > 0) {
    for (int l = 0; l < spec.num_layers; ++l) spec.layer_windows.push_back(l % 2 ? w : 0);
  }
  const std::vector<int32_t> prompt = Prompt();
  const auto t0 = std::chrono::steady_clock::now();
  KVARENA_ASSIGN_OR_RETURN(auto cache, (client)->Allocate(spec, "", AllocateOptions{prompt}));
  const double allocate_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const int64_t cached = (cache)->cached_tokens();
  std::printf("allocated cached_tokens=%lld cache %s prompt %zu in %.2f ms\n",
              static_cast<long long>(cached), (cache)->cache_id().c_str(), prompt.size(),
              allocate_ms);
  std::fflush(stdout);
  if (int want = absl::GetFlag(FLAGS_expect_cached); want >= 0 && cached != want) {
    return absl::InternalError(absl::StrCat("cached_tokens=", cached, ", want ", want));
  }
  FILE* out = nullptr;
  if (const std::string path = absl::GetFlag(FLAGS_out); !path.empty()) {
    out = std::fopen(path.c_str(), "w");
    if (out == nullptr) return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  const bool local = absl::GetFlag(FLAGS_local);
  Sequence seq(cache, prompt, out);
  seq.Adopted(cached);  // the worker's reference, not timed
  const auto t1 = std::chrono::steady_clock::now();
  const int64_t split = absl::GetFlag(FLAGS_split_at);
  const int64_t len = int64_t(prompt.size());
  if (split > cached && split < len) {
    KVARENA_RETURN_IF_ERROR(seq.Compute(cached, split, local));
    KVARENA_RETURN_IF_ERROR(seq.Compute(split, len, local));
  } else {
    KVARENA_RETURN_IF_ERROR(seq.Compute(cached, len, local));
  }
  // Allocate, then the prompt up to its last output: the arena's part of time to first token.
  const double ms =
      allocate_ms +
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
  KVARENA_ASSIGN_OR_RETURN(auto pages, (cache)->pages_used());
  std::printf("prefill done: pages_used %lld, %lld positions computed, %.2f ms\n",
              static_cast<long long>(pages), static_cast<long long>(len - cached), ms);
  std::fflush(stdout);
  KVARENA_RETURN_IF_ERROR(seq.CheckGetKv("after the prompt"));  // the adopted prefix included
  if (absl::GetFlag(FLAGS_pause_after_prefill)) testing::WaitForSigusr1("paused after prefill");

  const int decode = absl::GetFlag(FLAGS_decode);
  const int first = absl::GetFlag(FLAGS_decode_seed);
  if (absl::GetFlag(FLAGS_fork)) {
    KVARENA_ASSIGN_OR_RETURN(auto forked, (cache)->fork());
    Sequence other(forked, seq.tokens(), nullptr);
    other.Adopted(len);
    KVARENA_RETURN_IF_ERROR(other.CheckGetKv("fork"));
    for (int s = 0; s < decode; ++s) {
      KVARENA_RETURN_IF_ERROR(seq.Decode(first + s, local));
      KVARENA_RETURN_IF_ERROR(other.Decode(first + 5000 + s, local));
    }
    KVARENA_RETURN_IF_ERROR(seq.CheckGetKv("original after fork"));
    KVARENA_RETURN_IF_ERROR(other.CheckGetKv("fork"));
    // popn back into the shared prompt pages, then a different continuation: copy-on-write.
    KVARENA_ASSIGN_OR_RETURN(auto popped, other.cache().popn(decode + 5));
    if (popped.popped != decode + 5)
      return absl::InternalError(absl::StrCat("fork popn: ", popped.refusal));
    // The fork's model history is rebuilt from the model for what it keeps.
    Sequence again(forked, std::vector<int32_t>(prompt.begin(), prompt.end() - 5), nullptr);
    again.Adopted(len - 5);
    KVARENA_RETURN_IF_ERROR(again.CheckGetKv("fork after popn"));
    for (int s = 0; s < 7; ++s) KVARENA_RETURN_IF_ERROR(again.Decode(first + 9000 + s, local));
    KVARENA_RETURN_IF_ERROR(seq.CheckGetKv("original after the fork's popn"));
    KVARENA_RETURN_IF_ERROR(again.CheckGetKv("fork after popn"));
    KVARENA_RETURN_IF_ERROR((forked)->release());
    std::printf("fork ok\n");
    std::fflush(stdout);
  } else {
    for (int s = 0; s < decode; ++s) KVARENA_RETURN_IF_ERROR(seq.Decode(first + s, local));
  }
  KVARENA_RETURN_IF_ERROR(seq.CheckGetKv("final"));
  if (out != nullptr) std::fclose(out);
  if (absl::GetFlag(FLAGS_hold)) testing::WaitForSigusr1("holding");
  return (cache)->release();
}

}  // namespace
}  // namespace kvarena

int main(int argc, char** argv) { return kvarena::testing::WorkerMain(argc, argv, kvarena::Run); }
