#include "core/tier_set.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvarena {

namespace {
// How long the destructor lets queued writes finish before it drops them.
constexpr absl::Duration kDrainTimeout = absl::Seconds(5);
}  // namespace

TierSet::TierSet(std::vector<TierEntry> stores, TierOptions options, PrefixEventLog* events)
    : stores_(std::move(stores)),
      options_(std::move(options)),
      events_(events),
      takes_evicted_(std::any_of(stores_.begin(), stores_.end(),
                                 [](const TierEntry& e) { return !e.write_through; })),
      takes_full_(std::any_of(stores_.begin(), stores_.end(),
                              [](const TierEntry& e) { return e.write_through; })),
      clock_(options_.clock != nullptr ? options_.clock : RealClock()) {
  for (size_t i = 0; i < stores_.size(); ++i) counters_.push_back(std::make_unique<Counters>());
  writer_ = std::thread([this] { WriterLoop(); });
}

TierSet::~TierSet() {
  {
    absl::MutexLock lock(&mu_);
    auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&drained), kDrainTimeout);
    for (ChunkWrite& w : queue_) {
      for (size_t i : Targets(w.write_through, w.write_back)) counters_[i]->dropped_writes += 1;
      queued_bytes_ -= QueuedFootprint(w);
      Record(w.after);
    }
    queue_.clear();
    stop_ = true;
  }
  writer_.join();
}

int32_t TierSet::ChunkPagesFor(const PageLayout& layout, int num_layers) const {
  if (options_.chunk_pages > 0) return options_.chunk_pages;
  return DefaultChunkPages(layout.PageBytes(), num_layers);
}

bool TierSet::Reserve(const ChunkWrite& w, size_t payload_bytes) {
  const size_t bytes = QueuedFootprint(payload_bytes, w.id.tokens.size(), int(w.first_page.size()));
  {
    absl::MutexLock lock(&mu_);
    if (!stop_ && queued_bytes_ + bytes <= options_.write_queue_bytes) {
      queued_bytes_ += bytes;
      reserved_bytes_ += bytes;
      return true;
    }
    if (!stop_ && w.write_through) ReturnLocked(w, bytes);
  }
  for (size_t i : Targets(w.write_through, w.write_back)) counters_[i]->dropped_writes += 1;
  return false;
}

void TierSet::Unreserve(size_t footprint) {
  absl::MutexLock lock(&mu_);
  queued_bytes_ -= footprint;
  reserved_bytes_ -= footprint;
}

bool TierSet::Queue(ChunkWrite w) {
  const ChunkKey key = w.id.key();
  const size_t bytes = QueuedFootprint(w);
  {
    absl::MutexLock lock(&mu_);
    reserved_bytes_ -= bytes;
    if (!stop_) {
      ++pending_[key];
      ++queued_total_;
      queue_.push_back(std::move(w));
      return true;
    }
    queued_bytes_ -= bytes;
  }
  for (size_t i : Targets(w.write_through, w.write_back)) counters_[i]->dropped_writes += 1;
  Record(w.after);
  return false;
}

void TierSet::ReturnLocked(const ChunkWrite& w, size_t refused_footprint) {
  PoolReturns& p = returns_by_pool_[w.pool_id];
  TierReturn r{w.last_node, w.id.key(), w.attempts};
  if (refused_footprint > 0) {
    // Never written: no flag to clear. Offered again once the queue has room for it.
    if (returns_.load(std::memory_order_relaxed) >= options_.max_returns) return;
    p.refused.emplace_back(r, refused_footprint);
    returns_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // Failed: its pool clears its flag (so its eviction offers it again), and, unless it
  // failed max_write_attempts times, offers it again after the backoff.
  r.attempts = w.attempts + 1;
  p.failed.push_back(r);
  returns_.fetch_add(1, std::memory_order_relaxed);
  if (r.attempts >= options_.max_write_attempts ||
      returns_.load(std::memory_order_relaxed) > options_.max_returns) {
    return;
  }
  const absl::Duration delay = options_.retry_delay * (int64_t{1} << std::min(r.attempts - 1, 20));
  p.retry.emplace(clock_->Now() + delay, r);
  returns_.fetch_add(1, std::memory_order_relaxed);
}

TierReturns TierSet::TakeReturns(uint64_t pool_id) {
  TierReturns out;
  if (!HasReturns()) return out;
  absl::MutexLock lock(&mu_);
  auto it = returns_by_pool_.find(pool_id);
  if (it == returns_by_pool_.end()) return out;
  PoolReturns& p = it->second;
  size_t taken = p.failed.size();
  out.failed = std::move(p.failed);
  p.failed.clear();
  const absl::Time now = clock_->Now();
  while (!p.retry.empty() && p.retry.begin()->first <= now) {
    out.due.push_back(p.retry.begin()->second);
    p.retry.erase(p.retry.begin());
    ++taken;
  }
  size_t room =
      options_.write_queue_bytes > queued_bytes_ ? options_.write_queue_bytes - queued_bytes_ : 0;
  while (!p.refused.empty() && p.refused.front().second <= room) {
    room -= p.refused.front().second;
    out.due.push_back(p.refused.front().first);
    p.refused.pop_front();
    ++taken;
  }
  if (p.failed.empty() && p.retry.empty() && p.refused.empty()) returns_by_pool_.erase(it);
  returns_.fetch_sub(taken, std::memory_order_relaxed);
  return out;
}

void TierSet::RecordAfterWrite(const ChunkKey& key, PrefixEvent e) {
  {
    absl::MutexLock lock(&mu_);
    if (pending_.contains(key)) {
      waiting_events_[key].push_back(std::move(e));
      return;
    }
  }
  std::vector<PrefixEvent> one;
  one.push_back(std::move(e));
  Record(one);
}

void TierSet::WriterLoop() {
  for (;;) {
    ChunkWrite w;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stop_
      w = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      writing_key_ = w.id.key();
      writing_bytes_ = QueuedFootprint(w);
    }
    const size_t bytes = QueuedFootprint(w);
    const ChunkKey key = w.id.key();
    const bool stored = Write(w);
    std::vector<PrefixEvent> waiting;
    {
      absl::MutexLock lock(&mu_);
      if (!stored) ReturnLocked(w, 0);
      queued_bytes_ -= bytes;
      ++written_total_;
      writing_ = false;
      writing_bytes_ = 0;
      if (--pending_[key] == 0) {
        pending_.erase(key);
        auto it = waiting_events_.find(key);
        if (it != waiting_events_.end()) {
          waiting = std::move(it->second);
          waiting_events_.erase(it);
        }
      }
    }
    Record(w.after);
    Record(waiting);
  }
}

bool TierSet::Write(ChunkWrite& w) {
  const ChunkKey key = w.id.key();
  const std::string value = EncodeChunk(w.id, w.first_page, w.payload);
  w.payload.clear();
  w.payload.shrink_to_fit();
  bool stored = true;
  for (size_t i : Targets(w.write_through, w.write_back)) {
    if (!PutInto(i, key, value, w.pool_id) && stores_[i].write_through) stored = false;
  }
  return stored;
}

std::vector<size_t> TierSet::Targets(bool write_through, bool write_back) const {
  // A full chunk goes to every write-through store; an evicted one to the first store
  // that keeps evicted chunks (the ones below get it when that store evicts it).
  std::vector<size_t> out;
  bool back = write_back;
  for (size_t i = 0; i < stores_.size(); ++i) {
    if (stores_[i].write_through ? write_through : back) out.push_back(i);
    if (!stores_[i].write_through && back) back = false;
  }
  return out;
}

bool TierSet::PutInto(size_t i, const ChunkKey& key, const std::string& value, uint64_t pool_id) {
  TierStore& store = *stores_[i].store;
  if (store.Contains(key)) return true;  // content-addressed: it has these bytes already
  std::vector<EvictedChunk> evicted;
  const absl::Time start = absl::Now();
  const absl::Status s = store.Put(key, value, &evicted);
  Observe(i, /*write=*/true, start);
  const bool stored = s.ok();
  if (s.ok()) {
    counters_[i]->stored_chunks += 1;
    RecordChunkEvents(value, pool_id, store.medium(), /*stored=*/true);
  } else if (absl::IsResourceExhausted(s)) {
    counters_[i]->dropped_writes += 1;
  } else {
    counters_[i]->errors += 1;
  }
  for (EvictedChunk& e : evicted) {
    // Demoted to the next store that keeps evicted chunks; gone from this one.
    for (size_t j = i + 1; j < stores_.size(); ++j) {
      if (stores_[j].write_through) continue;
      (void)PutInto(j, e.key, e.value, pool_id);
      break;
    }
    RecordChunkEvents(e.value, pool_id, store.medium(), /*stored=*/false);
  }
  return stored;
}

void TierSet::RecordChunkEvents(const std::string& value, uint64_t pool_id,
                                const std::string& medium, bool stored) {
  ChunkIdentity id;
  std::vector<int32_t> first_page;
  if (!PeekChunk(value, &id, &first_page).ok()) return;
  const int page = id.layout.page_size;
  // The chained hash of each block of the chunk, from its parent's.
  std::vector<Hash128> hashes(size_t(id.chunk_pages));
  Hash128 parent = id.parent_hash;
  for (int b = 0; b < id.chunk_pages; ++b) {
    hashes[size_t(b)] = PrefixPageHash(parent, id.tokens.data() + size_t(b) * size_t(page), page);
    parent = hashes[size_t(b)];
  }
  std::vector<PrefixEvent> events;
  for (int l = 0; l < id.num_layers; ++l) {
    for (int b = first_page[size_t(l)]; b < id.chunk_pages; ++b) {
      PrefixEvent e;
      e.kind = stored ? PrefixEvent::Kind::kStored : PrefixEvent::Kind::kRemoved;
      e.pool_id = pool_id;
      e.layer = l;
      e.hash = hashes[size_t(b)];
      e.medium = medium;
      if (stored) {
        e.parent_hash = b == 0 ? id.parent_hash : hashes[size_t(b - 1)];
        e.token_ids.assign(id.tokens.begin() + size_t(b) * size_t(page),
                           id.tokens.begin() + size_t(b + 1) * size_t(page));
        e.prefix_namespace = id.prefix_namespace;
      }
      events.push_back(std::move(e));
    }
  }
  Record(events);
}

void TierSet::SetEvents(PrefixEventLog* events) {
  absl::MutexLock lock(&events_mu_);
  events_ = events;
}

void TierSet::Record(std::vector<PrefixEvent>& events) {
  // Under events_mu_ for the whole append: once SetEvents(nullptr) returns, no thread is
  // still writing into the log the store is about to destroy.
  absl::MutexLock lock(&events_mu_);
  if (events_ != nullptr) {
    for (PrefixEvent& e : events) events_->Append(std::move(e));
  }
  events.clear();
}

// A lookup's deadline is the system clock's, never clock_: it bounds real waits (the stores'
// socket I/O, another lookup's read), which a fake clock cannot shorten.
std::vector<std::shared_ptr<const LoadedChunk>> TierSet::Lookup(absl::Span<const ChunkIdentity> ids,
                                                                absl::Time deadline) {
  std::vector<std::shared_ptr<const LoadedChunk>> found;
  for (const ChunkIdentity& id : ids) {
    if (absl::Now() >= deadline) break;
    std::shared_ptr<const LoadedChunk> c = Read(id, deadline);
    if (c == nullptr) break;
    found.push_back(std::move(c));
  }
  return found;
}

std::shared_ptr<const LoadedChunk> TierSet::Read(const ChunkIdentity& id, absl::Time deadline) {
  const ChunkKey key = id.key();
  std::shared_ptr<InFlight> flight;
  bool leader = false;
  {
    absl::MutexLock lock(&flight_mu_);
    auto [it, inserted] = in_flight_.try_emplace(key);
    if (inserted) it->second = std::make_shared<InFlight>();
    flight = it->second;
    leader = inserted;
  }
  if (!leader) {
    // Another lookup reads this chunk: wait for its answer. What it read was verified
    // against its identity, which names the same bytes only when it equals ours.
    if (!flight->done.WaitForNotificationWithDeadline(deadline)) return nullptr;
    const std::shared_ptr<const LoadedChunk>& r = flight->result;
    if (r == nullptr) return nullptr;
    DecodedChunk again;
    if (!DecodeChunk(r->value, id, &again).ok()) return ReadStores(id, deadline);
    return r;
  }
  flight->result = ReadStores(id, deadline);
  {
    absl::MutexLock lock(&flight_mu_);
    in_flight_.erase(key);
  }
  flight->done.Notify();
  return flight->result;
}

std::shared_ptr<const LoadedChunk> TierSet::ReadStores(const ChunkIdentity& id,
                                                       absl::Time deadline) {
  const ChunkKey key = id.key();
  for (size_t i = 0; i < stores_.size(); ++i) {
    if (absl::Now() >= deadline) return nullptr;
    Counters& c = *counters_[i];
    c.lookups += 1;
    const absl::Time start = absl::Now();
    absl::StatusOr<std::string> value = stores_[i].store->Get(key, deadline);
    Observe(i, /*write=*/false, start);
    if (!value.ok()) {
      if (absl::IsNotFound(value.status())) {
        c.miss_chunks += 1;
      } else if (absl::IsDataLoss(value.status())) {  // what the key holds is no chunk
        c.corrupt_chunks += 1;
        c.miss_chunks += 1;
        stores_[i].store->Erase(key);
      } else {
        c.errors += 1;
        c.miss_chunks += 1;
      }
      continue;
    }
    auto loaded = std::make_shared<LoadedChunk>();
    loaded->value = *std::move(value);
    loaded->tier = int(i);
    if (!DecodeChunk(loaded->value, id, &loaded->chunk).ok()) {
      c.corrupt_chunks += 1;
      c.miss_chunks += 1;
      stores_[i].store->Erase(key);
      continue;
    }
    c.hit_chunks += 1;
    return loaded;
  }
  return nullptr;
}

void TierSet::CountLoaded(int tier, int64_t tokens) {
  if (tier >= 0 && size_t(tier) < counters_.size())
    counters_[size_t(tier)]->loaded_tokens += uint64_t(tokens);
}

// Latency is of real work: measured on the system clock, as the start was.
void TierSet::Observe(size_t i, bool write, absl::Time start) {
  if (options_.on_latency)
    options_.on_latency(stores_[i].store->medium(), write, absl::Now() - start);
}

std::vector<TierStats> TierSet::Stats() const {
  std::vector<TierStats> out;
  for (size_t i = 0; i < stores_.size(); ++i) {
    const Counters& c = *counters_[i];
    TierStats s;
    const TierUsage usage = stores_[i].store->Usage();
    s.medium = stores_[i].store->medium();
    s.bytes_used = usage.bytes_used;
    s.bytes_limit = usage.bytes_limit;
    s.chunks = usage.chunks;
    s.up = usage.up;
    s.lookups = c.lookups;
    s.hit_chunks = c.hit_chunks;
    s.miss_chunks = c.miss_chunks;
    s.loaded_tokens = c.loaded_tokens;
    s.stored_chunks = c.stored_chunks;
    s.dropped_writes = c.dropped_writes;
    s.corrupt_chunks = c.corrupt_chunks;
    s.errors = c.errors;
    out.push_back(std::move(s));
  }
  return out;
}

void TierSet::Flush() {
  absl::MutexLock lock(&mu_);
  const uint64_t target = queued_total_;
  auto done = [this, target]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return written_total_ >= target; };
  mu_.Await(absl::Condition(&done));
}

absl::Status TierSet::TEST_Audit() const {
  absl::MutexLock lock(&mu_);
  size_t bytes = (writing_ ? writing_bytes_ : 0) + reserved_bytes_;
  absl::flat_hash_map<ChunkKey, int> writes;
  if (writing_) ++writes[writing_key_];
  for (const ChunkWrite& w : queue_) {
    bytes += QueuedFootprint(w);
    ++writes[w.id.key()];
  }
  if (bytes != queued_bytes_) {
    return absl::InternalError(absl::StrCat("tier write queue counts ", queued_bytes_,
                                            " bytes but holds ", bytes, " in ", queue_.size(),
                                            " queued writes", writing_ ? " and one writing" : "",
                                            " (footprints) and ", reserved_bytes_, " reserved"));
  }
  if (queued_bytes_ > options_.write_queue_bytes) {
    return absl::InternalError(absl::StrCat("tier write queue holds ", queued_bytes_,
                                            " bytes, past its ", options_.write_queue_bytes));
  }
  if (writes != pending_) {
    return absl::InternalError(absl::StrCat("tier write queue counts ", pending_.size(),
                                            " pending keys but holds ", writes.size(),
                                            " (or their counts differ)"));
  }
  for (const auto& [key, events] : waiting_events_) {
    if (!pending_.contains(key)) {
      return absl::InternalError(absl::StrCat(events.size(), " events wait on chunk ", key.Hex(),
                                              " that no queued write holds"));
    }
  }
  const uint64_t in_queue = queue_.size() + (writing_ ? 1 : 0);
  if (written_total_ > queued_total_ || queued_total_ - written_total_ != in_queue) {
    return absl::InternalError(absl::StrCat("tier write queue counts ", queued_total_,
                                            " writes queued and ", written_total_,
                                            " written but holds ", in_queue));
  }
  return absl::OkStatus();
}

void TierSet::TEST_SkewQueuedBytes(int64_t delta) {
  absl::MutexLock lock(&mu_);
  queued_bytes_ = size_t(int64_t(queued_bytes_) + delta);
}

}  // namespace kvarena
