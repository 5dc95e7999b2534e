// KvStore: the whole KV arena of one device — pools per geometry, the caches drawn from
// them, sessions that own caches, and every operation the daemon serves. The daemon's
// handlers and the client's inproc mode both call this, so each rule lives here once.
//
// Thread-safety: every method is safe to call concurrently. Operations on different
// caches run in parallel; operations on one cache are serialised by that cache's lock.
// Lock order: DESIGN.md, "Locks" (map lock -> session table -> cache locks -> pool set ->
// pool -> tier queue -> events). Stats read counters only.
//
// Errors (absl::Status codes, mapped one-to-one to gRPC codes by the daemon):
//   INVALID_ARGUMENT    bad spec, shape, dtype, layer or pos
//   NOT_FOUND           no such cache
//   RESOURCE_EXHAUSTED  arena full, max_tokens reached, a bound below; tagged with the
//                       bound it met (core/refusal.h: RefusalOf)
//   FAILED_PRECONDITION state (attend over evicted keys, unknown session, ...)
//   PERMISSION_DENIED   the cache belongs to another session
//   ALREADY_EXISTS      Allocate with a cache_id in use
// A rejected call changes nothing — no page, length, byte or page counter — except the
// `refusals` counter, which records it for operators.
//
// `session` is the caller's session id ("" for none). A cache allocated in a session
// belongs to it; any other caller touching it gets PERMISSION_DENIED (Stats excepted).
#ifndef KVARENA_CORE_KV_STORE_H_
#define KVARENA_CORE_KV_STORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "arena/region.h"
#include "base/clock.h"
#include "core/prefix_events.h"
#include "core/session_table.h"
#include "core/types.h"
#include "kernels/kv_kernels.h"

namespace kvarena {

class TierSet;

// What one owner's caches may hold together; 0: no bound. Refusals are RESOURCE_EXHAUSTED
// naming the owner as "tenant 'NAME'" and the bound (max_caches, max_pages).
struct OwnerBounds {
  int64_t max_caches = 0;  // live caches, sessionless ones included
  int64_t max_pages = 0;   // pages its caches hold, each counted once per cache holding it
  // Metadata bytes its caches hold (StoreOptions::metadata_bytes: tables, declared ids);
  // 0: an equal share of metadata_bytes among the owners listed, so no owner can take
  // what the others need.
  size_t max_metadata_bytes = 0;
};

struct StoreOptions {
  size_t arena_bytes = size_t{1} << 30;  // the budget every pool (and scratch region) draws from
  int default_page_size = 16;
  int num_threads = -1;  // CPU attention workers besides the caller; -1: cores - 1
  // How long an idle CPU attention worker stays awake before it sleeps (ThreadPool), in
  // [0, 1s]: longer saves served calls the wake-up, at the cost of a core kept busy.
  absl::Duration cpu_pool_awake = absl::FromChrono(ThreadPool::kDefaultAwake);
  int empty_chunks_kept = 1;  // per pool, kept committed to avoid commit/decommit churn
  // Empty chunks kept committed and resident (warm) beyond empty_chunks_kept, every pool
  // together, so that a load or an append writes pages already faulted in; they give way to
  // any other use of the budget, and keep an idle pool (as cached pages do). 0: none.
  size_t arena_warm_bytes = 0;
  bool arena_prefault = false;  // chunks are faulted in when committed (Region::Prefault)
  // Per session, host memory for zero-copy tensors: created when the session first maps
  // it (ExportRegion) and charged to arena_bytes from then while the session lives; a
  // session the budget cannot cover then is refused it (its tensors go inline), and a
  // session whose peer cannot map (SessionPeer::can_map) gets none.
  size_t scratch_bytes = size_t{16} << 20;
  // The kernels for the backend's pages; null: the CPU kernels with num_threads threads.
  std::shared_ptr<KvKernels> kernels;

  // Bounds (each refusal is RESOURCE_EXHAUSTED naming the bound, unless noted).
  int max_pools = 64;                     // geometries alive at once; empty pools are destroyed
  int64_t max_sessions = 1024;            // attached or in their grace period
  int64_t max_sessions_per_peer = 256;    // of them opened by one SessionPeer::key
  int64_t max_caches = 16384;             // caches alive at once
  int64_t max_caches_per_session = 4096;  // the caches allocated without a session count as
                                          // one session, for this bound and the next
  int64_t session_max_pages = 0;          // pages one session's caches may hold; 0: no quota
  // Bounds on what one owner (SessionPeer::owner, Allocate's owner: the daemon's tenant)
  // holds across its sessions and its sessionless caches together (core/quota.h); the
  // sessionless caches of each owner listed here count as their own one session.
  std::map<std::string, OwnerBounds> owners;
  int64_t max_request_tokens = 1 << 20;  // tokens one Append / Attend / Reserve item may carry
                                         // (INVALID_ARGUMENT beyond)
  // Queries x keys attended x q heads of one Attend (keys: an upper bound, all the call can
  // see); 2^37 passes an 8k-token prefill chunk over a 128k context at 64 q heads.
  int64_t max_attend_work = int64_t{1} << 37;
  // The bytes one GetKv reply may take: its K+V and kGetKvReplyEnvelopeBytes (validate.h).
  size_t max_reply_bytes = size_t{64} << 20;
  // Caches allocated without a session are released after this long untouched; 0: never.
  absl::Duration idle_ttl = absl::ZeroDuration();

  // The daemon's bookkeeping that requests make it hold besides the arena: caches' tables,
  // declared token ids and their page hashes, prefix-index nodes. A request that would
  // pass it is refused (RESOURCE_EXHAUSTED naming metadata_bytes); a prefix chain the
  // index cannot cover is simply not indexed further.
  size_t metadata_bytes = size_t{256} << 20;
  // One session's share of it (the caches without a session count as one); 0: no share
  // beyond metadata_bytes (or its owner's, OwnerBounds::max_metadata_bytes).
  size_t session_metadata_bytes = 0;
  // What prefixes no cache holds any more (kept for reuse: the index nodes of cached
  // pages) may keep of metadata_bytes; 0: half of it. Past it, and whenever a metadata
  // charge finds the budget full, the least recently cached pages are evicted (their
  // nodes with them) before anything is refused.
  size_t cached_metadata_bytes = 0;

  // Prefix-index events kept for WatchEvents (the oldest go first): at most this many
  // (at least 1) and at most prefix_event_bytes of them (each event's size with its token
  // ids and namespace).
  size_t prefix_event_capacity = 65536;
  size_t prefix_event_bytes = size_t{64} << 20;
  // Called after each prefix-index event is recorded, under the lock of the pool that
  // changed: it may only schedule work (the daemon pokes its WatchEvents streams) and must
  // not call the store.
  std::function<void()> on_prefix_events;

  // The tiers below the arena (core/tier_set.h, docs/tiers.md); null: none. The store
  // feeds them the chunks its pools evict (and, write-through, the full ones), reads them
  // for a prompt's prefix past the arena's hit, and gives them its event log.
  std::shared_ptr<TierSet> tiers;

  // Tests only: keep this many bits of each page hash (fewer force collisions, which the
  // token-id check must catch). 128: the whole hash.
  int TEST_prefix_hash_bits = 128;

  // Where the store reads the time; null: the system clock. Must outlive the store.
  Clock* clock = nullptr;
  // Called, with no store lock held, after a pool was created or destroyed: the regions
  // a session may map changed (the daemon tells attached workers).
  std::function<void()> on_regions_changed;
};

// A memory region an attached session may map: every pool, and its own scratch region.
struct RegionInfo {
  uint64_t region_id = 0;  // pools: pool_id + 1; scratch: kScratchRegionBase + n
  std::string kind;        // Region::share_kind()
  uint64_t size = 0;
  uint64_t pool_id = 0;  // pools only
  bool scratch = false;
  std::string ipc_handle;  // cuda_ipc only
};
inline constexpr uint64_t kScratchRegionBase = uint64_t{1} << 32;

// Who opens a session (KvStore::AttachSession).
struct SessionPeer {
  // Whether the peer can map a scratch region (reaches the fd socket: a Unix-socket
  // peer). false: the session gets none, and nothing is charged for it.
  bool can_map = true;
  // Who the peer is, for max_sessions_per_peer ("uid 1000", "tcp 10.0.0.7"); "" when
  // unknown: such sessions count against max_sessions only.
  std::string key;
  // Who may resume and use the session: the daemon's tenant ("" without tenants). A
  // resume token of another owner's session resumes nothing (NOT_FOUND).
  std::string owner;
  // Sessions the owner may hold at once (RESOURCE_EXHAUSTED beyond); 0: no bound.
  int64_t owner_max_sessions = 0;
};

// A tensor's bytes inside a session's scratch region, resolved to a pointer. Holding it
// keeps the region mapped even if the session ends meanwhile.
struct ResolvedSlice {
  std::shared_ptr<const Region> region;
  uint8_t* data = nullptr;
  size_t bytes = 0;
};

class KvStore {
 public:
  static absl::StatusOr<std::unique_ptr<KvStore>> Create(const StoreOptions& options,
                                                         std::unique_ptr<Backend> backend);
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // cache_id "" picks a fresh id. Pages are taken lazily, on each layer's first write.
  // options.prompt_tokens declares the token ids of the first positions and, with
  // spec.prefix_namespace, adopts the longest cached prefix of them (CacheInfo.cached_tokens:
  // a multiple of page_size below the prompt's length, filled on every layer; the caller
  // computes positions from there on). INVALID_ARGUMENT for a negative id or more than
  // max_request_tokens of them. `owner` is whose the cache is when session is "" (the
  // daemon's tenant; a session's caches are its owner's, SessionPeer::owner): its pages
  // come from that owner's pool of the geometry.
  absl::StatusOr<CacheInfo> Allocate(const std::string& session, const CacheSpec& spec,
                                     const std::string& cache_id,
                                     const AllocateOptions& options = {},
                                     const std::string& owner = "");

  // Dense append of n tokens to one layer: pos must equal the layer's length.
  // k, v: [1, num_kv_heads, n, head_dim] in the cache's dtype.
  absl::StatusOr<AppendResult> Append(const std::string& session, const std::string& cache_id,
                                      int layer, int64_t pos, const TensorArg& k,
                                      const TensorArg& v);

  // With k/v: append them at pos (== layer length), then attend q (same n) over past+new,
  // causally. Without: attend q at positions [pos, pos + n) over what is cached
  // (pos + n <= layer length). q: [1, num_q_heads, n, head_dim]; out receives q's shape
  // and dtype and must be exactly q.bytes long. queries x keys x q heads above
  // max_attend_work is refused up front. With `stop` (it must outlive the call): once it
  // says stop — when the call starts or between units of the CPU kernels — the call ends
  // with CANCELLED or DEADLINE_EXCEEDED, its append undone and out incomplete.
  absl::StatusOr<AttendResult> Attend(const std::string& session, const AttendArgs& args, void* out,
                                      size_t out_bytes, const StopToken* stop = nullptr);

  // Rolls back the last n tokens on every layer, all or nothing (see DESIGN.md).
  // n > seq_len (any n) is a refusal: popped 0 and the reason, not an error.
  absl::StatusOr<PopnResult> Popn(const std::string& session, const std::string& cache_id,
                                  uint64_t n);

  // Drops every token; keep_pages keeps the cache's pages reserved for reuse.
  absl::StatusOr<CacheInfo> Reset(const std::string& session, const std::string& cache_id,
                                  bool keep_pages);
  absl::Status Release(const std::string& session, const std::string& cache_id);

  // Declares the token ids of positions [first_pos, first_pos + n) (KvCache::SetTokens):
  // a generated answer, so that a later prompt containing it finds its pages.
  absl::StatusOr<CacheInfo> SetTokens(const std::string& session, const SetTokensArgs& args);
  // A new cache (new_cache_id; "" picks one) in the caller's session that shares every
  // full page of cache_id and holds a copy of each layer's partial last page; the two
  // diverge independently (copy-on-write). Errors as Allocate's, and RESOURCE_EXHAUSTED
  // when the quota or arena cannot cover the fork's pages.
  absl::StatusOr<CacheInfo> Fork(const std::string& session, const std::string& cache_id,
                                 const std::string& new_cache_id);

  // RESOURCE_EXHAUSTED when the range's K+V bytes and the reply's envelope exceed
  // max_reply_bytes; the message advises a max_tokens that fits.
  absl::StatusOr<GetKvResult> GetKv(const std::string& session, const std::string& cache_id,
                                    int layer, const GetKvRange& range = {});
  absl::StatusOr<CacheDescription> Describe(const std::string& session,
                                            const std::string& cache_id);

  // Local path. Reserve makes room for `tokens` more tokens on every layer of each listed
  // cache, all-or-nothing across the list; Commit advances the lengths by the same counts
  // (after the worker wrote the K/V itself) and applies windows.
  absl::StatusOr<std::vector<ReserveResult>> Reserve(const std::string& session,
                                                     const std::vector<CacheTokens>& items);
  absl::StatusOr<std::vector<CacheInfo>> Commit(const std::string& session,
                                                const std::vector<CacheTokens>& items);

  ArenaStats Stats() const;
  absl::StatusOr<PageStats> CacheStats(const std::string& cache_id) const;
  // Every cache, in id order (bytewise).
  std::vector<CacheInfo> ListCaches() const;
  // One page of ListCaches: at most max_caches (at least 1) of the caches whose ids sort
  // after `after` ("": from the first), in O(log caches + max_caches). The store's map lock
  // is held only to pick the page's ids (no copy of the whole map); a cache released
  // meanwhile is left out.
  struct CachePage {
    std::vector<CacheInfo> caches;
    std::string last_id;  // the page's last id considered: `after` for the next page
    bool more = false;    // caches with ids after last_id remain
  };
  CachePage ListCaches(const std::string& after, size_t max_caches) const;

  // Sessions. AttachSession opens a session with an unguessable id and resume token
  // (RESOURCE_EXHAUSTED beyond max_sessions, or beyond max_sessions_per_peer held by
  // peer.key) when resume_token is empty, and otherwise
  // resumes the session that token names, with its caches, while its grace has not run
  // out by the store's clock (NOT_FOUND after; SessionTable::Resume). A new session's
  // scratch region is listed (when peer.can_map) but costs nothing until it is first
  // exported. OpenSession is
  // AttachSession's id without a token. DetachSession starts the grace period, unless
  // epoch names an attachment the session has been resumed past; Reap releases the
  // caches of sessions whose grace has run out (only caches they still own) and
  // sessionless caches idle past idle_ttl, by the store's clock.
  absl::StatusOr<SessionAttachment> AttachSession(const std::string& client_name,
                                                  const std::string& resume_token,
                                                  const SessionPeer& peer = {});
  absl::StatusOr<std::string> OpenSession(const std::string& client_name);
  void DetachSession(const std::string& session_id, absl::Duration grace, uint64_t epoch = 0);
  // Returns the number of caches released.
  int Reap();
  bool HasSession(const std::string& session_id) const;
  // Whether session_id is held and was opened by owner (SessionPeer::owner).
  bool SessionOwnedBy(const std::string& session_id, const std::string& owner) const;
  // Whether session_id is held and owns cache_id.
  bool SessionOwnsCache(const std::string& session_id, const std::string& cache_id) const;

  // Zero-copy data plane. The regions a session may map: its scratch region and its
  // owner's pools (new entries as new geometries appear; another owner's pools are never
  // listed nor exported: NOT_FOUND, as for an unknown id); FAILED_PRECONDITION for no or
  // an unknown session.
  absl::StatusOr<std::vector<RegionInfo>> SessionRegions(const std::string& session) const;
  // The fds a peer maps to see one region (new fds the caller owns); with
  // after_generation, only the pieces committed since. One page of them, as
  // Region::ExportPiecesAfter: the oldest generations first, without the first `first`,
  // at most max_pieces, fds created for those only; *total (when given) is how many there
  // are after after_generation in all.
  // The session's first export of its scratch region creates it and charges scratch_bytes
  // to the arena: RESOURCE_EXHAUSTED (arena_full) when the budget cannot cover them.
  // PERMISSION_DENIED for another session's scratch region, NOT_FOUND for an unknown id.
  absl::StatusOr<std::vector<SharedPiece>> ExportRegion(
      const std::string& session, uint64_t region_id, uint64_t after_generation = 0,
      size_t first = 0, size_t max_pieces = std::numeric_limits<size_t>::max(),
      size_t* total = nullptr);
  // [offset, offset + length) of the session's own scratch region. INVALID_ARGUMENT when
  // outside it; PERMISSION_DENIED for any other region.
  absl::StatusOr<ResolvedSlice> ResolveSlice(const std::string& session, uint64_t region_id,
                                             uint64_t offset, uint64_t length) const;
  // Prefix-index events (BlockStored / BlockRemoved / AllCleared, core/prefix_events.h):
  // up to max with seq >= from_seq (0: the oldest kept), oldest first; *lost when some
  // from from_seq on are no longer kept. Any caller (like Stats).
  std::vector<PrefixEvent> PrefixEvents(uint64_t from_seq, size_t max, bool* lost) const;
  uint64_t NextPrefixEventSeq() const;
  // Where the pages live, as events and handles name it: "cpu" (host backend), "cuda:0".
  std::string Medium() const;

  // The pool memory in this process (inproc clients view pages through it).
  absl::StatusOr<uint8_t*> PoolBase(uint64_t pool_id) const;

  // The memory of a pool, for tests.
  const Region* TEST_PoolRegion(uint64_t pool_id) const;
  // Audits the page accounting: every page's reference count equal to the caches' table
  // slots naming it, each pool's pages_used equal to the distinct pages its caches hold,
  // cached pages registered and unreferenced, the prefix index's holds equal to what
  // caches declare, pages a cache may write private, quotas equal to what their caches
  // hold. INTERNAL naming the first discrepancy. Call while no operation runs.
  absl::Status TEST_CheckInvariants() const;
  // Everything a client could observe — arena stats (refusal counters aside) and every
  // cache's lengths, pages and a hash of its K/V — whoever owns it.
  std::string TEST_DebugState() const;

 private:
  struct Impl;
  explicit KvStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvarena

#endif  // KVARENA_CORE_KV_STORE_H_
