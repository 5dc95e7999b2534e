// TierSet: the tiers below the arena (docs/tiers.md) — an ordered list of TierStores (host,
// then disk, then a Redis Cluster), the write queue that feeds them and the lookup that
// reads from them. The arena is tier 0; a pool hands the TierSet each full chunk of a
// prefix chain (core/tier_chunk.h) whose pages it evicts (write-back) or, for the stores
// that take every chunk (--tier_write_through; the cluster tier always), that became full
// and registered; a cache allocated with a prompt reads the chunks past its arena hit.
//
// Writes never block a caller: a pool first Reserves room in the queue for a chunk's
// footprint (QueuedFootprint) and copies the chunk's pages only when it got it; Queue
// then takes the copy and returns. One writer thread encodes each chunk and puts it into
// its target stores (a value a store already has is not written again), hands what a
// store evicted down to the next store (host -> disk), and records the tier's KvEvents.
// A full queue (by footprint bytes) refuses the reservation and counts a dropped write.
//
// A write-through chunk no store took — refused by the full queue, or failed by a store —
// is handed back to its pool (TakeReturns, which the pool calls under its own lock: the
// set never calls into a pool): the pool clears the chunk's tier flag and offers it again
// when it is due — a refused one once the queue has room, a failed one retry_delay after
// the failure, doubling with each, for at most max_write_attempts failed writes — or at
// its eviction, whichever comes first. So a node's kTierFull flag stands, in the end,
// only for a chunk a store holds.
//
// Reads are verified: every value is decoded against the identity the reader demands
// (DecodeChunk) before anything of it is used; a value that fails is a miss, counted as
// corrupt and erased from that store. A store error is a miss, counted. A lookup stops at
// the first chunk no store has, or at its deadline (--tier_timeout). Two lookups of one
// key at once share one read.
//
// Thread-safety: safe for concurrent use. Reserve, Queue and TakeReturns may be called
// under a pool's lock (they take only the queue's own lock); no store is called under
// any lock of the arena, nor under the queue's.
#ifndef KVARENA_CORE_TIER_SET_H_
#define KVARENA_CORE_TIER_SET_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/clock.h"
#include "core/prefix_events.h"
#include "core/tier_chunk.h"
#include "core/tier_store.h"
#include "core/types.h"

namespace kvarena {

struct TierOptions {
  // Pages per chunk (--tier_chunk_pages); 0: DefaultChunkPages of each pool's geometry.
  int32_t chunk_pages = 0;
  // Bytes of chunks waiting for the writer, each counted by its footprint
  // (TierSet::QueuedFootprint); past it a write is dropped and counted.
  size_t write_queue_bytes = size_t{256} << 20;
  // A write-through chunk a store failed is offered again retry_delay after the failure,
  // the delay doubling with each failure, until max_write_attempts writes of it failed.
  absl::Duration retry_delay = absl::Milliseconds(100);
  int max_write_attempts = 8;
  // Chunks handed back to their pools and not yet taken, across pools; past it a chunk
  // is given up (and stays eligible only for its eviction).
  size_t max_returns = 65536;
  // Where retry times are read; null: the system clock. Must outlive the set. Lookup
  // deadlines and latencies stay on the system clock (they bound and measure real work).
  Clock* clock = nullptr;
  // A lookup's time in the tiers (--tier_timeout): past it the rest is a miss.
  absl::Duration timeout = absl::Milliseconds(200);
  // Called with each store read and write and how long it took, for latency histograms.
  std::function<void(const std::string& medium, bool write, absl::Duration took)> on_latency;
};

// A store in the set: the store and whether it takes every full chunk (write-through) or
// only evicted ones.
struct TierEntry {
  std::unique_ptr<TierStore> store;
  bool write_through = false;
};

// A full chunk of a pool's chain on its way down: its identity, per layer the first page it
// holds, and the K/V of those pages (ChunkPayloadBytes), copied out of the arena.
struct ChunkWrite {
  ChunkIdentity id;
  std::vector<int32_t> first_page;
  std::string payload;
  uint64_t pool_id = 0;
  // Its targets: the write-through stores (a full, registered chunk), the write-back one
  // (an evicted chunk), or both (an evicted chunk no write-through store took yet).
  bool write_through = false;
  bool write_back = false;
  uint64_t last_node = 0;  // the pool's index node of its last block
  int attempts = 0;        // writes of it that failed before this one
  // Arena events (BlockRemoved of the eviction that sent it down) recorded only after the
  // tier's BlockStored, so a router never sees the prefix gone while it moves down.
  std::vector<PrefixEvent> after;
};

// A write-through chunk handed back to its pool (TierSet::TakeReturns): the index node of
// its last block, its key and how many writes of it failed.
struct TierReturn {
  uint64_t last_node = 0;
  ChunkKey key;
  int attempts = 0;
};
struct TierReturns {
  std::vector<TierReturn> failed;  // no store took it: clear its flag now
  std::vector<TierReturn> due;     // offer it again now (once the flag is clear)
};

// A chunk a lookup found: the value (kept alive) and its decoded view.
struct LoadedChunk {
  std::string value;
  DecodedChunk chunk;
  int tier = 0;  // index of the store it came from
};

class TierSet {
 public:
  // stores: top (first looked up) to bottom. events (may be null) gets the tiers'
  // KvEvents; it must outlive the set.
  TierSet(std::vector<TierEntry> stores, TierOptions options, PrefixEventLog* events = nullptr);
  // Stops the writer after the queue drains (bounded: writes still queued after a few
  // seconds are dropped).
  ~TierSet();
  TierSet(const TierSet&) = delete;
  TierSet& operator=(const TierSet&) = delete;

  const TierOptions& options() const { return options_; }
  // Where the tiers' KvEvents go (null: nowhere); the log must outlive its use, so the
  // store sets it when it starts and clears it (after Flush) before it goes.
  // No event is being recorded once it returns.
  void SetEvents(PrefixEventLog* events) ABSL_LOCKS_EXCLUDED(events_mu_);
  // Pages per chunk for a pool of this geometry.
  int32_t ChunkPagesFor(const PageLayout& layout, int num_layers) const;
  // Whether any store takes write-back chunks / write-through chunks.
  bool takes_evicted() const { return takes_evicted_; }
  bool takes_full() const { return takes_full_; }

  // What a queued write counts against write_queue_bytes beyond its payload, token ids and
  // first pages: the ChunkWrite itself (held in the deque), its entry in the pending map
  // and the allocator's headers of its heap buffers, 128 bytes for those two (issue 35
  // measured ~230 B of RSS per small queued chunk beyond its payload).
  static constexpr size_t kQueuedWriteOverhead = sizeof(ChunkWrite) + 128;
  // The bytes a write of that payload, token count and layer count counts in the queue.
  static size_t QueuedFootprint(size_t payload_bytes, size_t tokens, int num_layers) {
    return payload_bytes + tokens * sizeof(int32_t) + size_t(num_layers) * sizeof(int32_t) +
           kQueuedWriteOverhead;
  }
  static size_t QueuedFootprint(const ChunkWrite& w) {
    return QueuedFootprint(w.payload.size(), w.id.tokens.size(), int(w.first_page.size()));
  }

  // Reserves the queue's room for w once its payload of payload_bytes is copied (w
  // complete but for its payload). False, reserving nothing, when the queue lacks it:
  // counted as dropped by the stores it was for, and a write-through chunk is handed back
  // to its pool for later (TakeReturns). The caller copies the pages only on true.
  bool Reserve(const ChunkWrite& w, size_t payload_bytes);
  // Gives back a reservation Queue will not take (the copy failed).
  void Unreserve(size_t footprint);
  // Hands a chunk to the writer, on a reservation of QueuedFootprint(w). False when the
  // set is stopping (counted as dropped; w.after is recorded at once).
  bool Queue(ChunkWrite w);
  // The chunks of pool pool_id handed back (see above); cheap when there are none.
  TierReturns TakeReturns(uint64_t pool_id);
  bool HasReturns() const { return returns_.load(std::memory_order_relaxed) > 0; }
  // Records e after every write queued for `key` has finished (at once when none is).
  void RecordAfterWrite(const ChunkKey& key, PrefixEvent e);

  // Reads chunks ids[0], ids[1], ... from the stores, top first, until one is found in
  // none, the deadline passes or ids end. Every chunk returned passed DecodeChunk against
  // its identity.
  std::vector<std::shared_ptr<const LoadedChunk>> Lookup(absl::Span<const ChunkIdentity> ids,
                                                         absl::Time deadline);
  // Counts positions a cache took from a chunk of store `tier`.
  void CountLoaded(int tier, int64_t tokens);

  std::vector<TierStats> Stats() const;
  // Blocks until every write queued before the call has finished (tests, shutdown).
  void Flush();

  // Tests and the fuzzers: INTERNAL naming the first inconsistency of the write queue —
  // queued bytes against the payloads queued and the one being written, each key's
  // pending count against the writes of it in the queue, events waiting only on pending
  // keys, the totals against the queue. KvStore::TEST_CheckInvariants runs it.
  absl::Status TEST_Audit() const;
  // Breaks the queued-bytes count by delta, for the audit's own test.
  void TEST_SkewQueuedBytes(int64_t delta);

 private:
  struct Counters {
    std::atomic<uint64_t> lookups{0}, hit_chunks{0}, miss_chunks{0}, loaded_tokens{0},
        stored_chunks{0}, dropped_writes{0}, corrupt_chunks{0}, errors{0};
  };
  struct InFlight {
    absl::Notification done;
    std::shared_ptr<const LoadedChunk> result;
  };

  // A pool's chunks handed back: failed ones whose flag it has not cleared yet, the
  // queue's refusals (with their footprints; offered again while the queue has room) and
  // failed ones by the time they are offered again.
  struct PoolReturns {
    std::vector<TierReturn> failed;
    std::deque<std::pair<TierReturn, size_t>> refused;
    std::multimap<absl::Time, TierReturn> retry;
  };

  void WriterLoop();
  // Writes w to its targets; true when every write-through target holds it.
  bool Write(ChunkWrite& w);
  // The stores a chunk goes to: every write-through store for a full one, the first
  // write-back store for an evicted one.
  std::vector<size_t> Targets(bool write_through, bool write_back) const;
  // Puts value into store i, demoting what it evicts to the stores below; records events.
  // True when store i holds key after it.
  bool PutInto(size_t i, const ChunkKey& key, const std::string& value, uint64_t pool_id);
  // Hands w back to its pool: refused by the queue (footprint > 0), or failed by a store.
  void ReturnLocked(const ChunkWrite& w, size_t refused_footprint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One chunk from the stores (the first lookup of key does the reads; others wait).
  std::shared_ptr<const LoadedChunk> Read(const ChunkIdentity& id, absl::Time deadline);
  std::shared_ptr<const LoadedChunk> ReadStores(const ChunkIdentity& id, absl::Time deadline);
  void RecordChunkEvents(const std::string& value, uint64_t pool_id, const std::string& medium,
                         bool stored);
  void Observe(size_t i, bool write, absl::Time start);
  // Appends events (emptied) to the log, if any.
  void Record(std::vector<PrefixEvent>& events) ABSL_LOCKS_EXCLUDED(events_mu_);

  const std::vector<TierEntry> stores_;
  const TierOptions options_;
  // Where the tiers' events go; appended to only under events_mu_ (DESIGN.md's lock
  // order: after a pool's lock and mu_, before the log's own).
  mutable absl::Mutex events_mu_;
  PrefixEventLog* events_ ABSL_GUARDED_BY(events_mu_);
  const bool takes_evicted_;
  const bool takes_full_;
  std::vector<std::unique_ptr<Counters>> counters_;

  mutable absl::Mutex mu_;
  std::deque<ChunkWrite> queue_ ABSL_GUARDED_BY(mu_);
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Writes queued or being written, by key, and the events waiting for them.
  absl::flat_hash_map<ChunkKey, int> pending_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<ChunkKey, std::vector<PrefixEvent>> waiting_events_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_total_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t written_total_ ABSL_GUARDED_BY(mu_) = 0;
  // The write the writer took off the queue and has not finished: its key and bytes.
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  ChunkKey writing_key_ ABSL_GUARDED_BY(mu_);
  size_t writing_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Of queued_bytes_, what Reserve promised and Queue has not taken yet.
  size_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, PoolReturns> returns_by_pool_ ABSL_GUARDED_BY(mu_);
  // Chunks in returns_by_pool_ (each counted once: in `refused` or in `retry`).
  std::atomic<size_t> returns_{0};
  Clock* const clock_;

  absl::Mutex flight_mu_;
  absl::flat_hash_map<ChunkKey, std::shared_ptr<InFlight>> in_flight_ ABSL_GUARDED_BY(flight_mu_);

  std::thread writer_;
};

}  // namespace kvarena

#endif  // KVARENA_CORE_TIER_SET_H_
