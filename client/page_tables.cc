// Kernel-ready metadata: GenericKvCacheHandle::local_table / pool_view and the batch
// builders of kvarena/page_tables.h (device copies: page_tables_device.cc). Everything
// here reads the handles' own tables (client/local_table.h): no RPC unless a table must
// be reloaded.
#include "kvarena/page_tables.h"

#include <algorithm>
#include <climits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "client/cache_state.h"
#include "client/transport.h"
#include "core/refusal.h"
#include "kvarena/kv_cache_handle.h"

namespace kvarena {

absl::StatusOr<LocalLayerTable> GenericKvCacheHandle::local_table(int layer) const {
  const char* op = "local_table";
  KVARENA_RETURN_IF_ERROR(CheckUsable(op));
  KVARENA_RETURN_IF_ERROR(CheckLayer(op, layer));
  KVARENA_RETURN_IF_ERROR(EnsureTable(op));  // a Describe only when the table is stale
  LocalLayerTable t;
  {
    absl::MutexLock lock(&state_->mu);
    t = state_->table.layer(layer);
  }
  const int64_t ps = page_size();
  if (limit_ >= 0) {  // a with_sequence_length view sees its n tokens and their pages only
    const int64_t bound = std::max(limit_, t.first_pos);
    t.len = std::min(t.len, bound);
    t.written = std::min(t.written, bound);
    const size_t blocks = size_t(PagesCovering(t.first_pos, bound, ps));
    if (t.page_ids.size() > blocks) t.page_ids.resize(blocks);
  }
  return t;
}

absl::StatusOr<KvPoolView> GenericKvCacheHandle::pool_view() const {
  const char* op = "pool_view";
  KVARENA_RETURN_IF_ERROR(CheckUsable(op));
  auto pool = transport_->MapPool(info_.pool_id);
  if (!pool.ok()) {
    return Annotated(pool.status(), absl::StrCat(op, ": "));
  }
  KvPoolView v;
  v.base = pool->base;
  v.layout = layout();
  v.device = pool->kind == RegionKind::kHostMemfd ? -1 : pool->device;
  return v;
}

namespace client_internal {

// One sequence of a batch, as the builders need it: the layer's table and the end of the
// positions the arrays cover.
struct SeqSpan {
  LocalLayerTable table;
  int64_t written = 0;  // the first new position
  int64_t end = 0;      // written + n
  int64_t blocks = 0;   // pages covering [table.first_pos, end)
};

struct PageTableAccess {
  static bool SameClient(const GenericKvCacheHandle& a, const GenericKvCacheHandle& b) {
    return a.transport_ == b.transport_;
  }
  // Sequence b's span, checked. REQUIRES: h is not null.
  static absl::StatusOr<SeqSpan> Span(const char* op, size_t b, const GenericKvCacheHandle& h,
                                      int layer, int64_t n) {
    if (n < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": sequence ", b, " (cache ", h.cache_id(), ") tokens=", n, " < 0"));
    }
    if (n > 0) KVARENA_RETURN_IF_ERROR(h.CheckLocal(op));  // a view may not write
    auto t = h.local_table(layer);
    if (!t.ok()) {
      return Annotated(t.status(), absl::StrCat(op, ": sequence ", b, ": "));
    }
    if (t->written < t->first_pos) {  // windows evict only below a layer's length
      return absl::InternalError(absl::StrCat(op, ": sequence ", b, " layer ", layer, " starts at ",
                                              t->first_pos, " past its end ", t->written));
    }
    // Written this way round so that a huge n cannot wrap.
    const int64_t reserved_until = t->end(h.page_size());
    if (n > reserved_until - t->written) {
      return absl::FailedPreconditionError(
          absl::StrCat(op, ": sequence ", b, " (cache ", h.cache_id(), ") layer ", layer, ": ", n,
                       " new tokens past position ", t->written, " but pages only up to ",
                       reserved_until, "; reserve them first"));
    }
    SeqSpan s;
    s.written = t->written;
    s.end = t->written + n;
    const int64_t keys = s.end - t->first_pos;
    if (keys > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": sequence ", b, " covers ", keys, " tokens; the arrays hold int32"));
    }
    s.blocks = CeilDiv(keys, int64_t(h.page_size()));
    s.table = *std::move(t);
    return s;
  }
};

}  // namespace client_internal

namespace {

using client_internal::SeqSpan;

// Every sequence's span, after checking the batch as a whole: one pool, int32 totals.
absl::StatusOr<std::vector<SeqSpan>> Spans(const char* op, const CacheTokenList& batch, int layer,
                                           int* page_size) {
  if (batch.empty()) return absl::InvalidArgumentError(absl::StrCat(op, ": empty batch"));
  std::vector<SeqSpan> spans;
  spans.reserve(batch.size());
  const GenericKvCacheHandle* first = batch.front().first.get();
  int64_t blocks = 0, tokens = 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    const auto& [h, n] = batch[b];
    if (h == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": sequence ", b, " has no handle"));
    }
    if (!client_internal::PageTableAccess::SameClient(*h, *first)) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": sequence ", b, " (cache ", h->cache_id(),
          ") comes from another Client than sequence 0: page ids index one mapped pool"));
    }
    if (h->pool_id() != first->pool_id()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": sequence ", b, " (cache ", h->cache_id(), ") lives in pool ",
                       h->pool_id(), ", sequence 0 (cache ", first->cache_id(), ") in pool ",
                       first->pool_id(), "; page ids index one pool"));
    }
    KVARENA_ASSIGN_OR_RETURN(auto s, client_internal::PageTableAccess::Span(op, b, *h, layer, n));
    blocks += s.blocks;  // each below 2^31, so the sums cannot wrap int64
    tokens += s.end - s.written;
    if (blocks > INT32_MAX || tokens > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": the batch up to sequence ", b,
                                                     " holds ", blocks, " pages and ", tokens,
                                                     " new tokens; the arrays hold int32"));
    }
    spans.push_back(std::move(s));
  }
  *page_size = first->page_size();
  return spans;
}

}  // namespace

absl::StatusOr<FlashInferPageTable> BuildFlashInferPageTable(const CacheTokenList& batch,
                                                             int layer) {
  int ps = 0;
  KVARENA_ASSIGN_OR_RETURN(auto spans, Spans("BuildFlashInferPageTable", batch, layer, &ps));
  FlashInferPageTable t;
  t.indptr.reserve(spans.size() + 1);
  t.indptr.push_back(0);
  for (const SeqSpan& s : spans) {
    const std::vector<int32_t>& ids = s.table.page_ids;
    t.indices.insert(t.indices.end(), ids.begin(), ids.begin() + s.blocks);
    t.indptr.push_back(int32_t(t.indices.size()));
    const int64_t keys = s.end - s.table.first_pos;
    t.last_page_len.push_back(s.blocks == 0 ? 0 : int32_t(keys - (s.blocks - 1) * ps));
    t.first_pos.push_back(s.table.first_pos);
  }
  return t;
}

absl::StatusOr<VllmBlockTables> BuildVllmBlockTables(const CacheTokenList& batch, int layer,
                                                     int64_t max_blocks, int32_t pad) {
  const char* op = "BuildVllmBlockTables";
  if (max_blocks < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": max_blocks=", max_blocks, " < 0"));
  }
  int ps = 0;
  KVARENA_ASSIGN_OR_RETURN(auto spans, Spans(op, batch, layer, &ps));
  int64_t width = max_blocks;
  for (size_t b = 0; b < spans.size(); ++b) {
    const SeqSpan& s = (spans)[b];
    if (max_blocks == 0) {
      width = std::max(width, s.blocks);
    } else if (s.blocks > max_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": max_blocks=", max_blocks, " but sequence ", b, " (cache ",
                       batch[b].first->cache_id(), ") needs ", s.blocks, " blocks"));
    }
  }
  const int64_t batch_size = int64_t(spans.size());
  if (width > INT32_MAX / batch_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", batch_size, " rows of ", width, " blocks exceed the int32 arrays"));
  }
  VllmBlockTables t;
  t.max_blocks = width;
  t.block_tables.assign(size_t(batch_size * width), pad);
  t.query_start_loc.push_back(0);
  for (size_t b = 0; b < spans.size(); ++b) {
    const SeqSpan& s = (spans)[b];
    const LocalLayerTable& tab = s.table;
    std::copy_n(tab.page_ids.begin(), s.blocks, t.block_tables.begin() + int64_t(b) * width);
    t.seq_lens.push_back(int32_t(s.end - tab.first_pos));
    t.first_pos.push_back(tab.first_pos);
    for (int64_t pos = s.written; pos < s.end; ++pos) {
      const int32_t page = tab.page_ids[size_t((pos - tab.first_pos) / ps)];
      t.slot_mapping.push_back(int64_t(page) * ps + pos % ps);
    }
    t.query_start_loc.push_back(int32_t(t.slot_mapping.size()));
  }
  return t;
}

}  // namespace kvarena
