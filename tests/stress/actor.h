// Actor: one thread's share of a stress worker. It owns a few caches no other thread
// touches, keeps a float64 copy of every layer it wrote (tests/support/kv_history.h), and runs
// random operations over them: allocate, append, attend (appending, or over what is
// cached), popn, reset, release, reserve + local writes + commit, and get_kv checks. Every
// result it can check is checked against the copy, K/V bit for bit.
//
// What the rules allow is counted, not failed: RESOURCE_EXHAUSTED from a cache's
// max_tokens (and, with arena_may_fill, from a full arena), popn refusals. Any other error,
// or a result that differs from the copy, is returned by Step (keeping the call's code, so
// a caller can tell UNAVAILABLE from the rest). After an append that failed part-way the
// cache is "ragged" (its layers differ in length): it then only gets per-layer appends and
// attends, checks, reset and release.
//
// Thread-compatible: one thread drives an Actor.
#ifndef KVARENA_TESTS_STRESS_ACTOR_H_
#define KVARENA_TESTS_STRESS_ACTOR_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvarena/client.h"
#include "tests/support/kv_history.h"

namespace kvarena::stress {

enum class OpKind {
  kAllocate,
  kAppend,        // served: append on every layer
  kAttend,        // served: append + attend on every layer (a decode or prefill step)
  kAttendCached,  // served: attend over what a global layer holds
  kPopn,
  kReset,
  kRelease,
  kLocal,   // local path: reserve, append_local / attention_local per layer, commit
  kVerify,  // get_kv of every layer and describe() against the copy
};
inline constexpr int kNumOpKinds = 9;
const char* OpName(OpKind kind);

struct ActorOptions {
  int max_caches = 3;
  // RESOURCE_EXHAUSTED may come from a full arena (else only from a cache's max_tokens).
  bool arena_may_fill = false;
  // Every cache in one geometry, hence one pool; appends of 16..64 tokens (filling fast).
  bool fill = false;
  // Past this many tokens a cache is reset or released (bounds memory and reference cost).
  int64_t max_len = 160;
};

// Operations tried per kind, and the non-OK outcomes the rules allowed.
struct Tally {
  std::array<int64_t, kNumOpKinds> ops{};
  std::map<std::string, int64_t> errors;  // "append:RESOURCE_EXHAUSTED" -> count
  int64_t popn_refused = 0;

  void Add(const Tally& other);
  int64_t total_ops() const;
  int64_t exhausted() const;  // RESOURCE_EXHAUSTED of any op
  // "ops=N allocate=.. append=.. ... errors=E append:RESOURCE_EXHAUSTED=.. popn_refused=.."
  std::string ToString() const;
};

class Actor {
 public:
  Actor(std::shared_ptr<Client> client, uint64_t seed, ActorOptions options);
  ~Actor();
  Actor(const Actor&) = delete;
  Actor& operator=(const Actor&) = delete;

  // One random operation.
  absl::Status Step();
  absl::Status VerifyAll();
  absl::Status ReleaseAll();
  // One line per cache: "cache ID pool P pages 3,4,9" (every layer's pages, from describe).
  absl::StatusOr<std::vector<std::string>> PageLines() const;

  const Tally& tally() const { return tally_; }
  std::vector<std::shared_ptr<GenericKvCacheHandle>> handles() const;

 private:
  struct Tracked;

  absl::Status Allocate();
  absl::Status Append(Tracked& c, bool attend);
  absl::Status AttendCached(Tracked& c);
  absl::Status Popn(Tracked& c);
  absl::Status Reset(Tracked& c);
  absl::Status Release(size_t index);
  absl::Status Local(Tracked& c);
  absl::Status Verify(const Tracked& c) const;
  // OK (counted) when the rules allow s for an op that would grow c's layer from len by
  // n; else s itself, or INTERNAL for a cap that was not enforced.
  absl::Status Judge(OpKind op, const absl::Status& s, const Tracked& c, int64_t len, int64_t n);
  int64_t Tokens(bool local);
  testing::HostTensor Random(const Tracked& c, int heads, int64_t n);

  std::shared_ptr<Client> client_;
  std::mt19937_64 rng_;
  ActorOptions options_;
  std::vector<std::unique_ptr<Tracked>> caches_;
  Tally tally_;
};

}  // namespace kvarena::stress

#endif  // KVARENA_TESTS_STRESS_ACTOR_H_
