// TierSet: the tiers below the arena (docs/tiers.md) — an ordered list of TierStores (host,
// then disk, then a Redis Cluster), the write queue that feeds them and the lookup that
// reads from them. The arena is tier 0; a pool hands the TierSet each full chunk of a
// prefix chain (core/tier_chunk.h) whose pages it evicts (write-back) or, for the stores
// that take every chunk (--tier_write_through; the cluster tier always), that became full
// and registered; a cache allocated with a prompt reads the chunks past its arena hit.
//
// Writes never block a caller: Queue copies nothing more than the pages it was given and
// returns; one writer thread encodes each chunk and puts it into its target stores (a
// value a store already has is not written again), hands what a store evicted down to
// the next store (host -> disk), and records the tier's KvEvents. A full queue (by bytes)
// drops the write and counts it.
//
// Reads are verified: every value is decoded against the identity the reader demands
// (DecodeChunk) before anything of it is used; a value that fails is a miss, counted as
// corrupt and erased from that store. A store error is a miss, counted. A lookup stops at
// the first chunk no store has, or at its deadline (--tier_timeout). Two lookups of one
// key at once share one read.
//
// Thread-safety: safe for concurrent use. Queue may be called under a pool's lock (it
// takes only the queue's own lock); no store is called under any lock of the arena.
#ifndef KVARENA_CORE_TIER_SET_H_
#define KVARENA_CORE_TIER_SET_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
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
#include "core/prefix_events.h"
#include "core/tier_chunk.h"
#include "core/tier_store.h"
#include "core/types.h"

namespace kvarena {

struct TierOptions {
  // Pages per chunk (--tier_chunk_pages); 0: DefaultChunkPages of each pool's geometry.
  int32_t chunk_pages = 0;
  // Bytes of chunks waiting for the writer; past it a write is dropped and counted.
  size_t write_queue_bytes = size_t{256} << 20;
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
  bool write_through = false;  // a full, registered chunk (else evicted: write-back)
  // Arena events (BlockRemoved of the eviction that sent it down) recorded only after the
  // tier's BlockStored, so a router never sees the prefix gone while it moves down.
  std::vector<PrefixEvent> after;
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

  // Hands a chunk to the writer. False (counted as dropped by the store it was for) when
  // the queue lacks room; then w.after is recorded at once.
  bool Queue(ChunkWrite w);
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

  void WriterLoop();
  void Write(ChunkWrite& w);
  // The stores a chunk goes to: every write-through store for a full one, the first
  // write-back store for an evicted one.
  std::vector<size_t> Targets(bool write_through) const;
  // Puts value into store i, demoting what it evicts to the stores below; records events.
  void PutInto(size_t i, const ChunkKey& key, const std::string& value, uint64_t pool_id);
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
  // Where the tiers' events go; appended to only under events_mu_ (taken after a pool's
  // lock and mu_, before the log's own).
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

  absl::Mutex flight_mu_;
  absl::flat_hash_map<ChunkKey, std::shared_ptr<InFlight>> in_flight_ ABSL_GUARDED_BY(flight_mu_);

  std::thread writer_;
};

}  // namespace kvarena

#endif  // KVARENA_CORE_TIER_SET_H_
