// LocalTable: a handle's own copy of its cache's per-layer block tables, for the local path
// (Reserve / write through the mapping / Commit). It is kept up to date from the replies
// the path already gets — Reserve's page ids, Commit's lengths and first positions — so a
// decode step needs no Describe; Describe (after popn, reset, or served-path writes)
// reloads it whole.
//
// Per layer: page_ids[i] holds absolute positions [first_pos + i * page_size, +page_size);
// `len` tokens are committed; `pending` more were written locally and await Commit; pages
// past them are reserved. A table is `fresh` when it matches the arena (as far as this
// process can tell); anything that changes the cache behind it marks it stale.
//
// Not thread-safe: CacheState's mutex guards it.
#ifndef KVARENA_CLIENT_LOCAL_TABLE_H_
#define KVARENA_CLIENT_LOCAL_TABLE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/types.h"

namespace kvarena::client_internal {

// Tokens written locally past a layer's len, not yet committed.
inline int64_t Pending(const LayerPages& l) { return l.written - l.len; }

class LocalTable {
 public:
  LocalTable(int num_layers, int page_size) : page_size_(page_size), layers_(size_t(num_layers)) {}

  bool fresh() const { return fresh_; }
  void MarkStale() { fresh_ = false; }
  // An empty cache (just allocated): every layer at 0 with no pages.
  void MarkEmpty();
  // From Describe: every layer's pages (reserved ones included) and length. Pending local
  // writes are kept: the arena does not know them.
  void Load(const CacheDescription& d);
  // Drops every pending local write (popn / reset discard them).
  void DropPending();

  int page_size() const { return page_size_; }
  int num_layers() const { return int(layers_.size()); }
  const LayerPages& layer(int i) const { return layers_[size_t(i)]; }
  LayerPages& layer(int i) { return layers_[size_t(i)]; }
  // The committed length (the most any layer holds, as the arena counts seq_len).
  int64_t SeqLen() const;
  // Positions below this have a page on every layer.
  int64_t Capacity() const;

  // Adds the pages a Reserve returned. FAILED_PRECONDITION when they do not continue this
  // table (the cache changed behind it): the caller reloads it with Describe.
  absl::Status MergeReserve(const ReserveResult& r);
  // After Commit: each layer's new length; pages below its first position were evicted by
  // a sliding window and leave the table. `tokens` pending writes become committed.
  void ApplyCommit(const CacheInfo& info, int64_t tokens);

 private:
  const int page_size_;
  std::vector<LayerPages> layers_;
  bool fresh_ = false;
};

}  // namespace kvarena::client_internal

#endif  // KVARENA_CLIENT_LOCAL_TABLE_H_
