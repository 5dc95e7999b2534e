// kvarena_worker: a model worker stand-in for the multi-process tests. It allocates one
// cache, runs prefill and decode steps through handle->attention (append + attend) with
// random q/k/v, and checks every output against its own float64 reference over the K/V
// it sent. Mid-way it pops 3 tokens and re-appends different ones. At the end it compares
// get_kv with what it sent, releases the cache and exits 0; any mismatch or error is
// printed and exits 1.
//
// With --local every step goes through the local path instead (reserve, attention_local
// on every layer over the mapped pool, commit) and, in lockstep, through the served path
// on a twin cache with the same q/k/v: the two outputs must be bit-identical (same kernels,
// same thread count as the daemon's --num_threads) and match the reference; get_kv of the
// local cache must equal what was written; the decode phase may make at most
// ceil(decode / page_size) Reserve RPCs (counted by the client) and no Describe.
//
// --rounds=N repeats all of it N times over one client (one mapping of the pool), the
// twin released too: a later round's pages land in chunks the daemon decommitted and
// committed again, which the mapping must follow.
//
// With --check_mapping it finally reads every layer through its own mapping of the pool
// (get_kv_local: the local kernels over the imported region, CPU or CUDA) and requires the
// bytes to equal get_kv's.
//
// With --pause_after_prefill the first round stops after its prefill, holding its cache,
// prints "paused after prefill" and waits for SIGUSR1 before decoding: tests line up
// several workers this way to see them hold the arena at once, or to keep one alive while
// they check another, without depending on how fast anything runs.
//
// stdout: "allocated ...", "prefill done ...", "paused after prefill" (with the flag),
// "decode step I/N ..." every --print_every steps (tests wait for it before killing the
// worker), "local path: ..." with --local, "mapping ok: ..." with --check_mapping,
// "worker ok".

#include "tests/support/worker_main.h"

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvarena/client.h"
#include "tests/support/kv_history.h"

ABSL_FLAG(std::string, address, kvarena::kDefaultAddress, "unix:PATH, HOST:PORT or inproc:");
ABSL_FLAG(uint64_t, seed, 1, "random seed of q/k/v");
ABSL_FLAG(int, layers, 4, "num_layers");
ABSL_FLAG(int, kv_heads, 2, "num_kv_heads");
ABSL_FLAG(int, q_heads, 4, "query heads (a multiple of kv_heads)");
ABSL_FLAG(int, head_dim, 64, "head_dim");
ABSL_FLAG(std::string, dtype, "float16", "float32, float16 or bfloat16");
ABSL_FLAG(int, page_size, 0, "tokens per page; 0: the daemon's default");
ABSL_FLAG(int, prefill, 32, "prefill tokens");
ABSL_FLAG(int, decode, 64, "decode steps");
ABSL_FLAG(int, window, 0, "sliding window of the odd layers (0: every layer global)");
ABSL_FLAG(int, step_delay_ms, 0, "sleep after each decode step");
ABSL_FLAG(int, print_every, 8, "print a progress line every N decode steps");
ABSL_FLAG(bool, local, false, "decode through the local path, checked against a served twin");
ABSL_FLAG(int, reserve_ahead, 0, "--local: tokens a Reserve asks for at least (0: a page)");
ABSL_FLAG(int, num_threads, 1, "CPU threads of the local path's kernels (match kvarenad's)");
ABSL_FLAG(int, rounds, 1,
          "run everything (allocate .. release) this many times over one client: later "
          "rounds reuse pool memory the daemon gave back and took again meanwhile");
ABSL_FLAG(bool, pause_after_prefill, false,
          "after the first round's prefill, print \"paused after prefill\" and wait for SIGUSR1");
ABSL_FLAG(bool, check_mapping, false,
          "at the end, read every layer through this process's mapping of the pool "
          "(get_kv_local) and require it to equal get_kv");

namespace kvarena {
namespace {

using testing::HostTensor;
using testing::KvHistory;

absl::StatusOr<DType> ParseDType(const std::string& s) {
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    if (s == DTypeName(d)) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat("--dtype=", s, " is not a dtype"));
}

class Worker {
 public:
  // With a twin, steps run the local path on cache and the served path on twin.
  Worker(std::shared_ptr<GenericKvCacheHandle> cache, int q_heads, uint64_t seed,
         std::shared_ptr<GenericKvCacheHandle> twin = nullptr)
      : cache_(std::move(cache)), twin_(std::move(twin)), q_heads_(q_heads), rng_(seed) {
    for (int l = 0; l < cache_->num_layers(); ++l) {
      history_.emplace_back(cache_->num_kv_heads(), cache_->head_dim());
    }
  }

  // n new tokens on every layer; checks each output against the reference.
  absl::Status Step(int64_t n, const std::string& what) {
    if (twin_ != nullptr) KVARENA_RETURN_IF_ERROR(cache_->reserve(n));
    for (int layer = 0; layer < cache_->num_layers(); ++layer) {
      const int64_t pos = history_[layer].len();
      HostTensor q = Random(q_heads_, n), k = Random(cache_->num_kv_heads(), n),
                 v = Random(cache_->num_kv_heads(), n);
      auto out = twin_ != nullptr ? cache_->attention_local(layer, q.arg(), k.arg(), v.arg())
                                  : cache_->attention(layer, q.arg(), k.arg(), v.arg());
      if (!out.ok()) {
        return absl::Status(out.status().code(), absl::StrCat(what, " layer ", layer, " pos ", pos,
                                                              ": ", out.status().message()));
      }
      if (twin_ != nullptr) {
        KVARENA_ASSIGN_OR_RETURN(auto served, twin_->attention(layer, q.arg(), k.arg(), v.arg()));
        if (served.data != out->data) {
          return absl::InternalError(absl::StrCat(what, " layer ", layer, " pos ", pos,
                                                  ": local and served outputs differ"));
        }
      }
      history_[layer].Append(k, v);
      const auto ref = history_[layer].Attention(q, pos, 0, cache_->layer_windows()[layer]);
      KVARENA_RETURN_IF_ERROR(
          testing::CompareOutput(absl::StrCat(what, " layer ", layer, " pos ", pos), *out, ref));
    }
    if (twin_ != nullptr) KVARENA_RETURN_IF_ERROR(cache_->commit(n));
    return CheckLength(what);
  }

  absl::Status CheckLength(const std::string& what) const {
    const int64_t want = history_[0].len();
    if (cache_->num_tokens() != want) {
      return absl::InternalError(
          absl::StrCat(what, ": num_tokens() = ", cache_->num_tokens(), ", want ", want));
    }
    return absl::OkStatus();
  }

  // Every layer's get_kv equals what was sent, from its first_pos on.
  absl::Status CheckGetKv(const std::string& what) const {
    for (int layer = 0; layer < cache_->num_layers(); ++layer) {
      KVARENA_ASSIGN_OR_RETURN(auto kv, cache_->get_kv(layer));
      const std::string at = absl::StrCat(what, " get_kv layer ", layer);
      KVARENA_RETURN_IF_ERROR(
          testing::CompareExact(at + " k", kv.k, history_[layer].HeadMajor(0, kv.first_pos)));
      KVARENA_RETURN_IF_ERROR(
          testing::CompareExact(at + " v", kv.v, history_[layer].HeadMajor(1, kv.first_pos)));
    }
    return absl::OkStatus();
  }

  // Every layer read through the mapped pool (get_kv_local) equals get_kv, byte for byte.
  absl::Status CheckMapping() const {
    int64_t bytes = 0;
    for (int layer = 0; layer < cache_->num_layers(); ++layer) {
      KVARENA_ASSIGN_OR_RETURN(auto served, cache_->get_kv(layer));
      KVARENA_ASSIGN_OR_RETURN(auto mapped, cache_->get_kv_local(layer));
      if (mapped.first_pos != served.first_pos || mapped.k.shape != served.k.shape ||
          mapped.k.data != served.k.data || mapped.v.data != served.v.data) {
        return absl::InternalError(absl::StrCat(
            "layer ", layer, ": K/V read through the mapping (first_pos ", mapped.first_pos, ", ",
            mapped.k.data.size(), " bytes) differ from get_kv (first_pos ", served.first_pos, ", ",
            served.k.data.size(), " bytes)"));
      }
      bytes += int64_t(mapped.k.data.size() + mapped.v.data.size());
    }
    std::printf("mapping ok: %d layers, %lld K/V bytes read through the mapped pool on %s\n",
                cache_->num_layers(), static_cast<long long>(bytes), cache_->device().c_str());
    std::fflush(stdout);
    return absl::OkStatus();
  }

  // Pops 3 tokens, checks the cache shrank, re-appends 3 different ones.
  absl::Status PopnAndReappend() {
    int64_t twin_popped = -1;
    if (twin_ != nullptr) {
      KVARENA_ASSIGN_OR_RETURN(auto t, twin_->popn(3));
      twin_popped = t.popped;
    }
    KVARENA_ASSIGN_OR_RETURN(auto r, cache_->popn(3));
    if (twin_ != nullptr && twin_popped != r.popped) {
      return absl::InternalError(
          absl::StrCat("popn(3): local path popped ", r.popped, ", served twin ", twin_popped));
    }
    if (r.popped != 3) {
      bool sliding = false;
      for (int w : cache_->layer_windows()) sliding |= w > 0;
      if (r.popped == 0 && sliding) {  // allowed when a sliding layer evicted what it needs
        std::printf("popn refused (sliding window): %s\n", r.refusal.c_str());
        return absl::OkStatus();
      }
      return absl::InternalError(absl::StrCat("popn(3) popped ", r.popped, ": ", r.refusal));
    }
    for (KvHistory& h : history_) h.Truncate(h.len() - 3);
    KVARENA_RETURN_IF_ERROR(CheckLength("after popn"));
    KVARENA_RETURN_IF_ERROR(CheckGetKv("after popn"));
    for (int i = 0; i < 3; ++i) KVARENA_RETURN_IF_ERROR(Step(1, "re-append"));
    std::printf("popn ok: popped 3, re-appended 3, seq_len %lld\n",
                static_cast<long long>(cache_->num_tokens()));
    return absl::OkStatus();
  }

 private:
  HostTensor Random(int heads, int64_t n) {
    return testing::RandomTensor(rng_, cache_->dtype(), heads, n, cache_->head_dim());
  }

  std::shared_ptr<GenericKvCacheHandle> cache_;
  std::shared_ptr<GenericKvCacheHandle> twin_;  // the served path's copy (--local)
  int q_heads_;
  std::mt19937_64 rng_;
  std::vector<KvHistory> history_;
};

// The decode phase's local-path calls: Reserve at most once per page of tokens (plus one
// for a popn that lands just past a page boundary), one Commit per step, no Describe but
// popn's re-read.
absl::Status CheckLocalCalls(Client& client, const CallCounts& before, int decode,
                             const GenericKvCacheHandle& cache) {
  const CallCounts now = client.call_counts();
  const int64_t reserves = now.reserve - before.reserve;
  const int64_t page = cache.page_size();
  const int64_t ahead = std::max<int64_t>(cache.reserve_ahead(), page);
  const int64_t popn_extra = 1;
  const int64_t limit = (decode + 3 + ahead - 1) / ahead + popn_extra;
  std::printf(
      "local path: decode_steps %d reserve_calls %lld commit_calls %lld describe_calls %lld "
      "(ceil(decode/page_size) = %lld)\n",
      decode, static_cast<long long>(reserves), static_cast<long long>(now.commit - before.commit),
      static_cast<long long>(now.describe - before.describe),
      static_cast<long long>((decode + page - 1) / page));
  std::fflush(stdout);
  if (reserves > limit) {
    return absl::InternalError(
        absl::StrCat("local path made ", reserves, " Reserve calls for ", decode, " decode steps"));
  }
  return absl::OkStatus();
}

absl::Status RunRound(Client& client, const CacheSpec& spec, uint64_t seed, bool pause);

absl::Status Run() {
  KVARENA_ASSIGN_OR_RETURN(auto dtype, ParseDType(absl::GetFlag(FLAGS_dtype)));
  ClientOptions options;
  options.client_name = absl::StrCat("kvarena_worker-", absl::GetFlag(FLAGS_seed));
  options.num_threads = absl::GetFlag(FLAGS_num_threads);
  KVARENA_ASSIGN_OR_RETURN(auto client, Client::Connect(absl::GetFlag(FLAGS_address), options));

  CacheSpec spec;
  spec.num_layers = absl::GetFlag(FLAGS_layers);
  spec.num_kv_heads = absl::GetFlag(FLAGS_kv_heads);
  spec.head_dim = absl::GetFlag(FLAGS_head_dim);
  spec.dtype = dtype;
  spec.page_size = absl::GetFlag(FLAGS_page_size);
  if (const int w = absl::GetFlag(FLAGS_window); w > 0) {
    for (int l = 0; l < spec.num_layers; ++l) spec.layer_windows.push_back(l % 2 ? w : 0);
  }
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  for (int round = 0; round < rounds; ++round) {
    KVARENA_RETURN_IF_ERROR(RunRound(*client, spec, absl::GetFlag(FLAGS_seed) + round,
                                     round == 0 && absl::GetFlag(FLAGS_pause_after_prefill)));
    if (rounds > 1) {
      std::printf("round %d/%d ok\n", round + 1, rounds);
      std::fflush(stdout);
    }
  }
  return absl::OkStatus();
}

// One cache (and its twin with --local) from Allocate to release.
absl::Status RunRound(Client& client, const CacheSpec& spec, uint64_t seed, bool pause) {
  KVARENA_ASSIGN_OR_RETURN(auto cache, client.Allocate(spec));
  std::printf("allocated cache %s (session %s, device %s, page_size %d)\n",
              (cache)->cache_id().c_str(), SessionIdForLog(client.session_id()).c_str(),
              (cache)->device().c_str(), (cache)->page_size());
  std::fflush(stdout);

  const bool local = absl::GetFlag(FLAGS_local);
  std::shared_ptr<GenericKvCacheHandle> twin;
  if (local) {
    KVARENA_ASSIGN_OR_RETURN(auto t, client.Allocate(spec));
    twin = t;
    if (int ahead = absl::GetFlag(FLAGS_reserve_ahead); ahead > 0)
      (cache)->set_reserve_ahead(ahead);
  }
  Worker worker(cache, absl::GetFlag(FLAGS_q_heads), seed, twin);
  KVARENA_RETURN_IF_ERROR(worker.Step(absl::GetFlag(FLAGS_prefill), "prefill"));
  KVARENA_ASSIGN_OR_RETURN(auto pages, (cache)->pages_used());
  std::printf("prefill done: %d tokens, pages_used %lld\n", absl::GetFlag(FLAGS_prefill),
              static_cast<long long>(pages));
  std::fflush(stdout);
  if (pause) testing::WaitForSigusr1("paused after prefill");

  const int decode = absl::GetFlag(FLAGS_decode);
  const int every = std::max(1, absl::GetFlag(FLAGS_print_every));
  const CallCounts before_decode = client.call_counts();
  for (int step = 0; step < decode; ++step) {
    KVARENA_RETURN_IF_ERROR(worker.Step(1, absl::StrCat("decode step ", step)));
    if (step == decode / 2) KVARENA_RETURN_IF_ERROR(worker.PopnAndReappend());
    if ((step + 1) % every == 0) {
      std::printf("decode step %d/%d seq_len %lld\n", step + 1, decode,
                  static_cast<long long>((cache)->num_tokens()));
      std::fflush(stdout);
    }
    if (int ms = absl::GetFlag(FLAGS_step_delay_ms); ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    }
  }
  if (local) KVARENA_RETURN_IF_ERROR(CheckLocalCalls(client, before_decode, decode, *cache));
  KVARENA_RETURN_IF_ERROR(worker.CheckGetKv("final"));
  if (absl::GetFlag(FLAGS_check_mapping)) KVARENA_RETURN_IF_ERROR(worker.CheckMapping());
  KVARENA_ASSIGN_OR_RETURN(auto stats, (cache)->stats());
  if (stats.seq_len != (cache)->num_tokens()) {
    return absl::InternalError(absl::StrCat("stats().seq_len = ", stats.seq_len,
                                            ", num_tokens() = ", (cache)->num_tokens()));
  }
  KVARENA_RETURN_IF_ERROR((cache)->release());
  if ((cache)->is_valid()) return absl::InternalError("is_valid() after release()");
  if (twin != nullptr) KVARENA_RETURN_IF_ERROR(twin->release());
  return absl::OkStatus();
}

}  // namespace
}  // namespace kvarena

int main(int argc, char** argv) { return kvarena::testing::WorkerMain(argc, argv, kvarena::Run); }
