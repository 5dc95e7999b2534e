#include "core/page_pool.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/refusal.h"
#include "kvarena/paged_kv.h"

namespace kvarena {
namespace {

// A backend's RESOURCE_EXHAUSTED (the device is out of memory) tagged as such.
absl::Status BackendRefusal(const absl::Status& s) {
  if (!absl::IsResourceExhausted(s) || RefusalOf(s) != Refusal::kOther) return s;
  return RefusedError(Refusal::kDeviceMemory, s.message());
}

}  // namespace

size_t ChunkBytesFor(size_t page_bytes) {
  const size_t lcm = std::lcm(page_bytes, kChunkGranularity);
  if (lcm <= 16 * kChunkGranularity) return lcm;
  return RoundUp(kChunkGranularity, page_bytes);
}

absl::StatusOr<std::unique_ptr<PagePool>> PagePool::Create(uint64_t id, const PageLayout& layout,
                                                           Backend* backend, ArenaBudget* budget,
                                                           int empty_chunks_kept,
                                                           PoolCounters* counters,
                                                           std::string owner) {
  const size_t page_bytes = layout.PageBytes();
  const size_t chunk_bytes = ChunkBytesFor(page_bytes);
  // Page ids are int32 (the block-table format of FlashInfer and vLLM): a pool of tiny
  // pages holds at most INT32_MAX of them, however large the budget.
  const size_t pages_per_chunk = chunk_bytes / page_bytes;
  const size_t max_chunks = std::min(budget->limit() / chunk_bytes,
                                     size_t{std::numeric_limits<int32_t>::max()} / pages_per_chunk);
  if (max_chunks == 0) {
    return RefusedError(
        Refusal::kArenaFull,
        absl::StrCat("pool: a chunk of ", chunk_bytes, " bytes (pages of ", page_bytes,
                     " bytes) does not fit arena_bytes=", budget->limit()));
  }
  auto region = backend->Reserve(max_chunks * chunk_bytes, absl::StrCat("kvarena-pool-", id));
  if (!region.ok()) return BackendRefusal(region.status());
  return std::unique_ptr<PagePool>(new PagePool(id, layout, *std::move(region), budget, chunk_bytes,
                                                empty_chunks_kept, counters, std::move(owner)));
}

PagePool::PagePool(uint64_t id, const PageLayout& layout, std::unique_ptr<Region> region,
                   ArenaBudget* budget, size_t chunk_bytes, int empty_chunks_kept,
                   PoolCounters* counters, std::string owner)
    : id_(id),
      layout_(layout),
      page_bytes_(layout.PageBytes()),
      chunk_bytes_(chunk_bytes),
      pages_per_chunk_(int32_t(chunk_bytes / layout.PageBytes())),
      empty_chunks_kept_(empty_chunks_kept),
      region_(std::move(region)),
      budget_(budget),
      counters_(counters),
      owner_(std::move(owner)),
      index_(counters != nullptr ? counters->metadata : nullptr,
             counters != nullptr ? &counters->cached_metadata : nullptr),
      cache_(NewLruPageCache([this](int32_t page)
                                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { EvictedLocked(page); },
                             counters != nullptr ? &counters->cache_clock : nullptr)) {
  const int32_t num_chunks = int32_t(
      std::min<size_t>(region_->size() / chunk_bytes_,
                       size_t{std::numeric_limits<int32_t>::max()} / size_t(pages_per_chunk_)));
  chunks_.resize(num_chunks);
  uncommitted_.resize(num_chunks);
  for (int32_t c = 0; c < num_chunks; ++c) uncommitted_[c] = num_chunks - 1 - c;
}

PagePool::~PagePool() {
  absl::MutexLock lock(&mu_);
  // The tiers keep what the pool cached (a restart on a disk tier serves it again).
  if (TiersFor(PrefixIndex::kTierEvicted) != nullptr) {
    for (int32_t page : cache_->EvictionOrder()) cache_->Evict(page);
  }
  if (index_.registered() > 0 && counters_ != nullptr && counters_->events != nullptr) {
    PrefixEvent e;
    e.kind = PrefixEvent::Kind::kAllCleared;
    e.pool_id = id_;
    counters_->events->Append(std::move(e));
  }
  // Punch the memory out even where a peer still maps the region: the budget gets it back.
  for (size_t c = 0; c < chunks_.size(); ++c) {
    if (chunks_[c].committed) (void)region_->Decommit(c * chunk_bytes_, chunk_bytes_);
  }
  AddEmptyLocked(-empty_committed_);
  budget_->Refund(size_t(chunks_committed_) * chunk_bytes_);
  if (ByteBudget* m = Metadata(); m != nullptr)
    m->Refund(size_t(chunks_committed_) * ChunkMetadataBytes());
}

int64_t PagePool::FreeCommittedLocked() const {
  return chunks_committed_ * pages_per_chunk_ - pages_used_;
}

void PagePool::OpenLocked(int32_t c) {
  chunks_[c].open_index = int32_t(open_chunks_.size());
  open_chunks_.push_back(c);
}

void PagePool::CloseLocked(int32_t c) {
  const int32_t i = chunks_[c].open_index;
  const int32_t last = open_chunks_.back();
  open_chunks_[i] = last;
  chunks_[last].open_index = i;
  open_chunks_.pop_back();
  chunks_[c].open_index = -1;
}

absl::Status PagePool::CommitChunksLocked(int64_t count, std::vector<int32_t>* out) {
  if (count > int64_t(uncommitted_.size()) || !budget_->TryCharge(size_t(count) * chunk_bytes_)) {
    return RefusedError(Refusal::kArenaFull,
                        absl::StrCat("arena full: needs ", count, " more chunk(s) of ",
                                     chunk_bytes_, " bytes but ", budget_->available(),
                                     " of arena_bytes=", budget_->limit(), " are uncommitted"));
  }
  if (ByteBudget* m = Metadata();
      m != nullptr && !m->TryCharge(size_t(count) * ChunkMetadataBytes())) {
    budget_->Refund(size_t(count) * chunk_bytes_);
    return RefusedError(
        Refusal::kMetadataBytes,
        absl::StrCat("metadata full: ", count, " more chunk(s) of ", pages_per_chunk_,
                     " pages need ", size_t(count) * ChunkMetadataBytes(),
                     " bytes of page bookkeeping but ", m->Describe()));
  }
  std::vector<int32_t> committed;
  for (int64_t i = 0; i < count; ++i) {
    const int32_t c = uncommitted_.back();
    if (absl::Status s = region_->Commit(size_t(c) * chunk_bytes_, chunk_bytes_); !s.ok()) {
      // All or nothing: the chunks this call committed go back (each refunds its budget),
      // newest first so the uncommitted list keeps its order, and the rest is refunded.
      budget_->Refund(size_t(count - i) * chunk_bytes_);
      if (ByteBudget* m = Metadata(); m != nullptr)
        m->Refund(size_t(count - i) * ChunkMetadataBytes());
      for (auto it = committed.rbegin(); it != committed.rend(); ++it) DecommitChunkLocked(*it);
      return BackendRefusal(s);
    }
    // Faulted in now, in one call, rather than page by page by the copy that fills it.
    if (counters_ != nullptr && counters_->prefault)
      (void)region_->Prefault(size_t(c) * chunk_bytes_, chunk_bytes_);
    committed.push_back(c);
    uncommitted_.pop_back();
    Chunk& chunk = chunks_[c];
    chunk.committed = true;
    chunk.used = 0;
    chunk.free.resize(pages_per_chunk_);
    chunk.taken.assign(size_t(pages_per_chunk_), false);
    chunk.refs.assign(size_t(pages_per_chunk_), 0);
    chunk.cached = 0;
    const int32_t first = c * pages_per_chunk_;
    for (int32_t p = 0; p < pages_per_chunk_; ++p) chunk.free[p] = first + pages_per_chunk_ - 1 - p;
    OpenLocked(c);
    ++chunks_committed_;
    AddEmptyLocked(1);
  }
  if (out != nullptr) out->insert(out->end(), committed.begin(), committed.end());
  return absl::OkStatus();
}

void PagePool::DecommitChunkLocked(int32_t c) {
  Chunk& chunk = chunks_[c];
  if (chunk.open_index >= 0) CloseLocked(c);
  chunk.committed = false;
  chunk.free.clear();
  chunk.free.shrink_to_fit();
  chunk.taken.clear();
  chunk.taken.shrink_to_fit();
  chunk.refs.clear();
  chunk.refs.shrink_to_fit();
  // A failed punch leaves the memory resident but the chunk reusable; nothing to undo.
  (void)region_->Decommit(size_t(c) * chunk_bytes_, chunk_bytes_);
  uncommitted_.push_back(c);
  --chunks_committed_;
  AddEmptyLocked(-1);
  budget_->Refund(chunk_bytes_);
  if (ByteBudget* m = Metadata(); m != nullptr) m->Refund(ChunkMetadataBytes());
}

void PagePool::TakeFreeLocked(int64_t n, std::vector<int32_t>* out) {
  out->reserve(out->size() + size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t c = open_chunks_.back();
    Chunk& chunk = chunks_[c];
    if (chunk.used == 0) AddEmptyLocked(-1);
    const int32_t id = chunk.free.back();
    out->push_back(id);
    chunk.free.pop_back();
    chunk.taken[size_t(id - c * pages_per_chunk_)] = true;
    chunk.refs[size_t(id - c * pages_per_chunk_)] = 1;
    ++chunk.used;
    if (chunk.free.empty()) CloseLocked(c);
  }
  pages_used_ += n;
}

absl::Status PagePool::Allocate(int64_t n, std::vector<int32_t>* out,
                                std::vector<int32_t>* committed, int64_t max_new_chunks) {
  if (n <= 0) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  int64_t reclaim = 0;
  const int64_t missing = n - FreeCommittedLocked();
  if (missing > 0) {
    const int64_t chunks = CeilDiv(missing, pages_per_chunk_);
    absl::Status s =
        chunks <= max_new_chunks
            ? CommitChunksLocked(chunks, committed)
            : RefusedError(
                  Refusal::kArenaFull,
                  absl::StrCat("arena full: needs ", chunks, " more chunk(s) of ", chunk_bytes_,
                               " bytes where this call has room for ", max_new_chunks));
    if (!s.ok()) {
      // The budget falls short: commit the chunks it still covers, reclaim cached pages
      // for the rest — or, when they are too few, refuse having changed nothing.
      const int64_t cached = absl::IsResourceExhausted(s) ? cache_->size() : 0;
      int64_t can = std::min<int64_t>({chunks - 1, max_new_chunks, int64_t(uncommitted_.size()),
                                       int64_t(budget_->available() / chunk_bytes_)});
      if (can > 0 && missing - can * pages_per_chunk_ <= cached &&
          !CommitChunksLocked(can, committed).ok()) {
        can = 0;  // the budget went elsewhere meanwhile
      }
      reclaim = std::max<int64_t>(0, missing - can * pages_per_chunk_);
      if (reclaim > cached) {
        absl::Status refused(
            s.code(),
            absl::StrCat("allocate ", n, " page(s) of ", page_bytes_, " bytes: ", s.message(),
                         cached > 0
                             ? absl::StrCat(" and only ", cached, " cached page(s) are reclaimable")
                             : ""));
        // Keeps the refusal's tag (core/refusal.h).
        s.ForEachPayload(
            [&](absl::string_view url, const absl::Cord& tag) { refused.SetPayload(url, tag); });
        return refused;
      }
      reclaim = std::max<int64_t>(0, n - FreeCommittedLocked());
    }
  }
  TakeFreeLocked(n - reclaim, out);
  for (int64_t i = 0; i < reclaim; ++i) out->push_back(ReclaimLocked());
  if (reclaim > 0 && counters_ != nullptr) counters_->pages_reclaimed += uint64_t(reclaim);
  return absl::OkStatus();
}

void PagePool::Free(absl::Span<const int32_t> ids) {
  absl::MutexLock lock(&mu_);
  std::vector<int32_t> unused;
  for (const int32_t id : ids) {
    int32_t& refs = RefsLocked(id);
    if (--refs == 1) --pages_shared_;
    if (refs > 0) continue;
    if (index_.IsRegistered(id)) {
      ParkLocked(id);
    } else {
      unused.push_back(id);
    }
  }
  FreeLocked(unused);
}

void PagePool::Ref(absl::Span<const int32_t> ids) {
  absl::MutexLock lock(&mu_);
  for (const int32_t id : ids) {
    if (++RefsLocked(id) == 2) ++pages_shared_;
  }
}

bool PagePool::Writable(int32_t id) const {
  absl::MutexLock lock(&mu_);
  return RefsLocked(id) == 1 && !index_.IsRegistered(id);
}

void PagePool::FreeLocked(absl::Span<const int32_t> ids, bool force_decommit) {
  for (const int32_t id : ids) {
    const int32_t c = id / pages_per_chunk_;
    Chunk& chunk = chunks_[c];
    if (chunk.free.empty()) OpenLocked(c);
    chunk.free.push_back(id);
    chunk.taken[size_t(id - c * pages_per_chunk_)] = false;
    chunk.refs[size_t(id - c * pages_per_chunk_)] = 0;
    if (--chunk.used == 0) {
      AddEmptyLocked(1);
      if (force_decommit || !KeepWarmLocked()) DecommitChunkLocked(c);
    }
  }
  pages_used_ -= int64_t(ids.size());
}

void PagePool::Unallocate(absl::Span<const int32_t> ids, absl::Span<const int32_t> committed) {
  absl::MutexLock lock(&mu_);
  FreeLocked(ids);
  // Newest first, as CommitChunksLocked undoes; a chunk another call took pages from
  // meanwhile stays.
  for (auto it = committed.rbegin(); it != committed.rend(); ++it) {
    if (chunks_[*it].committed && chunks_[*it].used == 0) DecommitChunkLocked(*it);
  }
}

size_t PagePool::BudgetShortfall(int64_t n) const {
  absl::MutexLock lock(&mu_);
  const int64_t missing = n - FreeCommittedLocked() - cache_->size();
  if (missing <= 0) return 0;
  const size_t need = size_t(CeilDiv(missing, pages_per_chunk_)) * chunk_bytes_;
  const size_t available = budget_->available();
  return need > available ? need - available : 0;
}

bool PagePool::CanAllocate(int64_t n) const {
  absl::MutexLock lock(&mu_);
  const int64_t budget_chunks =
      std::min<int64_t>(int64_t(budget_->available() / chunk_bytes_), int64_t(uncommitted_.size()));
  return n <= FreeCommittedLocked() + budget_chunks * pages_per_chunk_ + cache_->size();
}

PagePool::Supply PagePool::supply() const {
  absl::MutexLock lock(&mu_);
  return Supply{FreeCommittedLocked(), int64_t(cache_->size()), int64_t(uncommitted_.size()),
                pages_per_chunk_, chunk_bytes_};
}

int64_t PagePool::pages_used() const {
  absl::MutexLock lock(&mu_);
  return pages_used_ - cache_->size();
}

int64_t PagePool::pages_cached() const {
  absl::MutexLock lock(&mu_);
  return cache_->size();
}

PoolStats PagePool::Stats() const {
  PoolStats s;
  s.pool_id = id_;
  s.layout = layout_;
  s.page_bytes = page_bytes_;
  s.chunk_bytes = chunk_bytes_;
  absl::MutexLock lock(&mu_);
  const int64_t budget_chunks =
      std::min<int64_t>(int64_t(budget_->available() / chunk_bytes_), int64_t(uncommitted_.size()));
  s.pages_cached = cache_->size();
  s.pages_shared = pages_shared_;
  s.pages_used = pages_used_ - s.pages_cached;
  s.pages_free = FreeCommittedLocked() + budget_chunks * pages_per_chunk_ + s.pages_cached;
  s.num_pages = s.pages_used + s.pages_free;
  s.chunks_committed = chunks_committed_;
  s.bytes_committed = uint64_t(chunks_committed_) * chunk_bytes_;
  return s;
}

}  // namespace kvarena
