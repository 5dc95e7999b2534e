#include "client/local_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvarena::client_internal {

void LocalTable::MarkEmpty() {
  for (LayerPages& l : layers_) l = LayerPages{};
  fresh_ = true;
}

void LocalTable::Load(const CacheDescription& d) {
  for (size_t i = 0; i < layers_.size() && i < d.layers.size(); ++i) {
    LayerPages& l = layers_[i];
    const int64_t pending = Pending(l);
    l.page_ids = d.layers[i].page_ids;
    l.first_pos = d.layers[i].first_pos;
    l.len = d.layers[i].len;
    l.written = l.len + pending;
  }
  fresh_ = d.layers.size() == layers_.size();
}

void LocalTable::DropPending() {
  for (LayerPages& l : layers_) l.written = l.len;
}

int64_t LocalTable::SeqLen() const {
  int64_t seq = 0;
  for (const LayerPages& l : layers_) seq = std::max(seq, l.len);
  return seq;
}

int64_t LocalTable::Capacity() const {
  int64_t cap = INT64_MAX;
  for (const LayerPages& l : layers_) cap = std::min(cap, l.end(page_size_));
  return layers_.empty() ? 0 : cap;
}

absl::Status LocalTable::MergeReserve(const ReserveResult& r) {
  if (r.layers.size() != layers_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "reserve: ", r.layers.size(), " layers in the reply, ", layers_.size(), " in the table"));
  }
  // Check every layer before changing any.
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerPages& l = layers_[i];
    const LayerPages& got = r.layers[i];
    const int64_t from = got.first_pos;  // the page holding the layer's length
    if (got.len != l.len || from % page_size_ != 0 || from < l.first_pos ||
        from > l.end(page_size_)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "reserve: layer ", i, " reply starts at ", from, " with len ", got.len,
          "; the table holds [", l.first_pos, ", ", l.end(page_size_), ") with len ", l.len));
    }
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    LayerPages& l = layers_[i];
    const LayerPages& got = r.layers[i];
    // The reply repeats the pages it covers that the table already has (the same ids);
    // the rest continue the table.
    size_t at = size_t((got.first_pos - l.first_pos) / page_size_);
    for (int32_t id : got.page_ids) {
      if (at < l.page_ids.size()) {
        l.page_ids[at] = id;
      } else {
        l.page_ids.push_back(id);
      }
      ++at;
    }
  }
  return absl::OkStatus();
}

void LocalTable::ApplyCommit(const CacheInfo& info, int64_t tokens) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    LayerPages& l = layers_[i];
    const int64_t pending = std::max<int64_t>(0, Pending(l) - tokens);
    if (i < info.layer_lens.size()) l.len = info.layer_lens[i];
    l.written = l.len + pending;
    if (i >= info.layer_first_pos.size()) continue;
    const int64_t drop = std::min<int64_t>(int64_t(l.page_ids.size()),
                                           (info.layer_first_pos[i] - l.first_pos) / page_size_);
    if (drop > 0) {
      l.page_ids.erase(l.page_ids.begin(), l.page_ids.begin() + drop);
      l.first_pos += drop * page_size_;
    }
  }
}

}  // namespace kvarena::client_internal
