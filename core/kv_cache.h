// KvCache: one sequence's paged KV cache — a LayerTable per layer drawing pages from one
// PagePool — and the operations on it: dense append, attend, popn, reset, release, get_kv,
// and the local path's reserve / commit.
//
// Thread-safety: every public method takes the cache's own lock, except the *Locked ones,
// which REQUIRE it (the store holds several caches' locks for an all-or-nothing Reserve).
// Every operation validates before it mutates: an error leaves pages, lengths and
// counters exactly as they were. After Release() every operation returns NOT_FOUND.
//
// Page contents: every slot of every page the cache holds was written by this cache,
// zeroed when the page was taken from the pool (KvKernels::ClearPages), or — prefix
// reuse — holds the K/V another cache of the same namespace and geometry wrote for
// exactly the same token prefix (pages adopted at Allocate, shared by Fork), so no read —
// GetKv, Attend, a view — can return bytes written for other tokens.
//
// Prefix reuse (kv_cache_prefix.cc): a cache may know the token ids of its positions
// (prompt, SetTokens). With a prefix namespace, every full page of a layer whose tokens
// are known is registered in the pool's PrefixIndex and becomes immutable; a page is
// written only while Writable (its only reference, unregistered): appends write the
// partial last page or new ones, which never are shared, and popn into a shared page
// first copies what it keeps (copy-on-write).
#ifndef KVARENA_CORE_KV_CACHE_H_
#define KVARENA_CORE_KV_CACHE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/byte_budget.h"
#include "core/layer_table.h"
#include "core/page_pool.h"
#include "core/prefix_hash.h"
#include "core/quota.h"
#include "core/tier_set.h"
#include "core/types.h"
#include "core/validate.h"
#include "kernels/kv_kernels.h"

namespace kvarena {

// Arena-wide counters that Stats reads in O(1); each cache adds its deltas as it changes.
struct StoreCounters {
  std::atomic<int64_t> seq_len_sum{0};
  std::atomic<int64_t> layers_materialized{0};
  std::atomic<int64_t> layers_total{0};
  std::atomic<int64_t> layers_sliding{0};
  std::atomic<uint64_t> pages_evicted{0};
  std::atomic<uint64_t> refusals{0};
  // Reap's work, each counted once the caches it released gave their pages back.
  std::atomic<uint64_t> sessions_reaped{0};
  std::atomic<uint64_t> caches_reaped_grace{0};  // their session's grace ran out
  std::atomic<uint64_t> caches_reaped_idle{0};   // sessionless, idle past idle_ttl
  std::atomic<uint64_t> prefix_lookups{0};
  std::atomic<uint64_t> prefix_requested_tokens{0};
  std::atomic<uint64_t> prefix_hit_tokens{0};
  std::atomic<uint64_t> forks{0};
  std::atomic<uint64_t> cow_copies{0};
};

// What a cache shares with its store; everything outlives the cache except the pool and
// quota, which it co-owns.
struct CacheContext {
  std::shared_ptr<PagePool> pool;
  std::shared_ptr<Quota> quota;  // the owner session's (or the sessionless caches')
  KvKernels* kernels = nullptr;
  StoreCounters* counters = nullptr;
  const RequestLimits* limits = nullptr;
  size_t max_reply_bytes = 0;
  // Takes n pages of `pool` (PoolSet::Allocate: retried after the arena's other pools give
  // budget back, or cached prefixes metadata); null: pool->Allocate alone. Called with no
  // pool lock held.
  std::function<absl::Status(PagePool* pool, int64_t n, std::vector<int32_t>* ids,
                             std::vector<int32_t>* committed)>
      allocate;
  // Called with no pool lock held. reclaim_metadata(budget, bytes): when that makes room
  // for `bytes` in `budget` (the cache's, inside the daemon's), evicts cached prefixes
  // until it does; whether it did (KvStore's ReclaimMetadata). trim_cached_metadata():
  // evicts them until they keep no more than their share of it. Null: neither is done.
  std::function<bool(const ByteBudget* budget, size_t bytes)> reclaim_metadata;
  std::function<void()> trim_cached_metadata;
  int prefix_hash_bits = 128;      // tests: fewer bits make page hashes collide
  TierSet* tiers = nullptr;        // the tiers below the arena, if any (core/tier_set.h)
  ByteBudget* metadata = nullptr;  // --metadata_bytes: declared tokens are charged to it
};

// A cache's prefix-reuse state (kv_cache_prefix.cc): the token ids it declared, their
// chained page hashes, its holds on the pool's index, and what it reused. One member of
// KvCache, guarded by the cache's lock.
struct CachePrefix {
  CachePrefix(std::string key, const Hash128& hash, int num_layers)
      : root_key(std::move(key)), root_hash(hash), reg_next(size_t(num_layers), 0) {}

  const std::string root_key;  // namespace and geometry, exactly ("" without a namespace)
  const Hash128 root_hash;
  std::vector<int32_t> tokens;    // declared ids of positions [0, size)
  std::vector<Hash128> hashes;    // chained hash of each full block of them
  std::vector<Hash128> keys;      // the same, as the index keys them
  PrefixChain chain;              // index nodes of those blocks (sharing only)
  std::vector<int64_t> reg_next;  // per layer: blocks below were registered or skipped
  int64_t cached_tokens = 0;
  uint64_t cow_copies = 0;
  uint64_t requested = 0;  // this cache's lookup, at start
  uint64_t hit = 0;
  // Where the positions loaded from the tiers begin (-1: none were): cached positions
  // from here on came from a tier (CacheInfo.tier_loaded_tokens).
  int64_t tier_from = -1;
};

class KvCache {
 public:
  // The metadata bytes a cache of `spec` named `id` costs before it declares any token:
  // the object, its per-layer tables and its map entries. Charged by the store (the
  // `metadata` charge the constructor takes over), so a cache that does not fit is never
  // built.
  static size_t FixedMetadataBytes(const CacheSpec& spec, const std::string& id);
  // The most metadata bytes declaring n tokens (a prompt) charges a new cache of `spec`:
  // its ids and their page hashes and, with a prefix namespace, an index node per page.
  static size_t DeclaredMetadataBytes(const CacheSpec& spec, int64_t n);
  // What a fork of this cache charges besides FixedMetadataBytes: a copy of its declared
  // ids and hashes, and a table slot for each page it holds.
  size_t ForkMetadataBytes() const;

  // REQUIRES: spec resolved by ResolveSpec and matching the pool's layout. The quota has
  // already counted this cache and `metadata` holds FixedMetadataBytes of
  // ctx.metadata; the destructor gives both back.
  KvCache(std::string id, CacheSpec spec, std::string owner, CacheContext ctx, absl::Time now,
          BudgetCharge metadata = {});
  ~KvCache();  // releases what it still holds; never throws
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const std::string& id() const { return id_; }
  const std::string& owner() const { return owner_; }
  const CacheSpec& spec() const { return spec_; }
  PagePool* pool() const { return ctx_.pool.get(); }
  Quota* quota() const { return ctx_.quota.get(); }
  const std::shared_ptr<Quota>& shared_quota() const { return ctx_.quota; }

  // When an operation last found this cache (for --idle_ttl).
  void Touch(absl::Time now) {
    last_used_.store(absl::ToUnixNanos(now), std::memory_order_relaxed);
  }
  absl::Time last_used() const {
    return absl::FromUnixNanos(last_used_.load(std::memory_order_relaxed));
  }

  absl::StatusOr<AppendResult> Append(int layer, int64_t pos, const TensorArg& k,
                                      const TensorArg& v);
  absl::StatusOr<AttendResult> Attend(const AttendArgs& args, void* out, size_t out_bytes,
                                      const StopToken* stop = nullptr);
  absl::StatusOr<PopnResult> Popn(uint64_t n);
  absl::StatusOr<CacheInfo> Reset(bool keep_pages);
  void Release();
  absl::StatusOr<GetKvResult> GetKv(int layer, const GetKvRange& range);
  absl::StatusOr<CacheDescription> Describe();
  absl::StatusOr<CacheInfo> Info();
  absl::StatusOr<PageStats> Stats();

  // Prefix reuse (kv_cache_prefix.cc).
  // Right after construction, before any other caller can see the cache: declares the
  // prompt's token ids (checked by CheckTokenIds) as positions [0, n) and, with a prefix
  // namespace, adopts the longest cached prefix — at most floor((n - 1) / page_size)
  // pages, so at least one position is left to compute — charging the quota for it
  // (nothing is adopted when the quota refuses). Counts the lookup. RESOURCE_EXHAUSTED
  // (metadata_bytes; nothing declared) when the metadata budget cannot cover the ids.
  absl::Status StartWithPrompt(const std::vector<int32_t>& prompt);
  // Declares the token ids of [first_pos, first_pos + n): first_pos <= tokens_known
  // (INVALID_ARGUMENT otherwise; RESOURCE_EXHAUSTED when the metadata budget cannot
  // cover them). Ids of positions below seq_len must equal what is
  // declared there (FAILED_PRECONDITION); declared ids past the call's end at positions
  // not yet written are forgotten. Registers the pages that became full and known.
  absl::StatusOr<CacheInfo> SetTokens(int64_t first_pos, const std::vector<int32_t>& ids);
  // Makes this cache — new, empty, not yet visible — a fork of src: every full page of
  // every layer shared, each partial last page copied, the lengths, windows' evictions
  // and declared tokens the same. RESOURCE_EXHAUSTED (quota, arena) changes nothing.
  absl::Status ForkFrom(KvCache& src);

  // The audit (kv_cache_audit.cc).
  // Adds this cache's holds on index nodes to *holds, checks that the pages it may write
  // (each layer's partial last block and reserved blocks) are Writable and that its
  // metadata charge is what it declares, and returns that charge in *metadata.
  absl::Status TEST_Audit(absl::flat_hash_map<uint64_t, int64_t>* holds, size_t* metadata);
  // The ids of every page this cache holds (each layer's live blocks), for audits.
  std::vector<int32_t> HeldPages();
  // Lengths, page ids and a hash of every held token's K/V bytes, for tests that check a
  // refused request changed nothing.
  std::string DebugState();

  // Local path, under the lock (see class comment).
  absl::Mutex& mu() ABSL_LOCK_RETURNED(mu_) { return mu_; }
  // Pages needed so every layer covers [len, seq_len + tokens); checks tokens and max_tokens.
  absl::StatusOr<int64_t> PagesToReserveLocked(int64_t tokens) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the pages counted above (already charged to the quota, taken from the pool and
  // cleared) to the layers, consuming ids from *next on.
  ReserveResult AddReservedLocked(int64_t tokens, const std::vector<int32_t>& ids, size_t* next)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks that Commit(tokens) is possible: every layer at seq_len with pages reserved.
  absl::Status CheckCommitLocked(int64_t tokens) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  CacheInfo CommitLocked(int64_t tokens) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckLiveLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountRefusal() {
    refusals_.fetch_add(1, std::memory_order_relaxed);
    ctx_.counters->refusals.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  int64_t SeqLenLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t MaterializedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks that op (reserve, commit) may grow every layer by tokens: live, tokens within
  // the request limits, the length within max_tokens.
  absl::Status CheckGrowLocked(absl::string_view op, int64_t tokens) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckLayerLocked(absl::string_view op, int layer) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What an append took: blocks added to the layer, chunks the pool committed for them.
  struct Taken {
    int64_t blocks = 0;
    std::vector<int32_t> chunks;
  };
  // Charges the quota and takes taken->blocks pages from the pool, all or nothing; the
  // refusal names op and layer. The pages are not cleared.
  absl::Status TakePagesLocked(absl::string_view op, int layer, Taken* taken,
                               std::vector<int32_t>* ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives pages back to the pool (one reference each, in order: a chain's tail first) and
  // the quota.
  void ReturnPagesLocked(std::vector<int32_t>& ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pool's Allocate, retried once after trimming other pools' cached pages.
  absl::Status AllocateLocked(int64_t n, std::vector<int32_t>* ids, std::vector<int32_t>* chunks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every held page, deepest block first across layers (release order).
  std::vector<int32_t> TailFirstLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool sharing() const { return !spec_.prefix_namespace.empty(); }
  // Prefix adoption at start (kv_cache_tiers.cc). The identities of the tier chunks past
  // an arena hit of `blocks` pages, up to max_adopt pages (none without tiers).
  std::vector<ChunkIdentity> TierChunksLocked(int64_t blocks, int64_t max_adopt) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the arena's hit (pages adopted and charged) and what the tiers found for
  // `wanted`: the longest run of pages every layer needs, loading the tiers' part into new
  // pages that are registered (or adopted, when another cache registered them meanwhile),
  // giving back arena pages a longer hit no longer needs. A tier part the quota or the
  // arena cannot take is left out (a miss).
  void AdoptHitLocked(const PrefixHit& hit, int64_t max_adopt,
                      const std::vector<ChunkIdentity>& wanted,
                      const std::vector<std::shared_ptr<const LoadedChunk>>& loaded)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PrefixQuery QueryLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The metadata bytes of n declared tokens: the ids, two hashes per full page and, when
  // sharing, the chain's link to each page's index node.
  size_t DeclaredBytes(int64_t n) const;
  // The same for a cache of `spec` (DeclaredMetadataBytes adds the index nodes to it).
  static size_t DeclaredIdBytes(const CacheSpec& spec, int64_t n);
  // Makes metadata_ cover n declared tokens, before they are declared: RESOURCE_EXHAUSTED
  // naming metadata_bytes and the numbers (nothing charged) unless the budget also has
  // room for the index nodes the new full pages may create (new_nodes: a fork holds the
  // source's nodes instead).
  absl::Status ChargeDeclaredLocked(absl::string_view op, int64_t n, bool new_nodes = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replaces the declared tokens (first changed position: changed_from): hashes and the
  // chain follow from the block holding it. REQUIRES: ChargeDeclaredLocked covered them
  // when they grow; a shrink gives the bytes back.
  void DeclareLocked(std::vector<int32_t> tokens, int64_t changed_from)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the declared tokens from pos on (popn, reset).
  void ForgetTokensLocked(int64_t pos) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Registers the full, known pages of `layer` (-1: every layer) not registered yet.
  void RegisterLocked(int layer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Popn's copy-on-write: gives every layer that keeps part of a page it may not write
  // (shared or registered) a private copy of that part. Nothing changes on an error.
  absl::Status CopyKeptPagesLocked(int64_t end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Validates an append of k/v at pos (== the layer's length), takes the pages it needs
  // and writes the tokens; sets the length but neither evicts nor publishes. Returns what
  // it took, which UndoAppendLocked gives back exactly.
  absl::StatusOr<Taken> AppendLocked(absl::string_view op, int layer, int64_t pos,
                                     const TensorArg& k, const TensorArg& v)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UndoAppendLocked(int layer, int64_t old_len, const Taken& taken)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the blocks of a sliding layer wholly below block_start - window + 1: what no query
  // at block_start or later can see. Evicting relative to the start of the latest block
  // (not its end) keeps that block's keys, so a speculative draft appended as one block
  // can always be rolled back with popn; the price is that a prefill's early pages stay
  // until the next append.
  void EvictLocked(int layer, int64_t block_start) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishLocked(int64_t old_seq, int64_t old_mat) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  CacheInfo InfoLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PagedKvView ViewLocked(int layer) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const RequestLimits& limits() const { return *ctx_.limits; }
  KvKernels& kernels() const { return *ctx_.kernels; }

  const std::string id_;
  const CacheSpec spec_;
  const std::string owner_;
  const CacheContext ctx_;
  // The metadata bytes the cache holds besides its declared tokens: FixedMetadataBytes,
  // and for a fork the slots of the page tables it copied.
  size_t fixed_metadata_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> last_used_;

  mutable absl::Mutex mu_;
  std::vector<LayerTable> layers_ ABSL_GUARDED_BY(mu_);
  int64_t pages_held_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pages_evicted_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> refusals_{0};
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  BudgetCharge metadata_ ABSL_GUARDED_BY(mu_);  // fixed_metadata_ + DeclaredBytes(tokens)

  CachePrefix prefix_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvarena

#endif  // KVARENA_CORE_KV_CACHE_H_
