#include "core/layer_table.h"

#include <algorithm>

namespace kvarena {

int64_t LayerTable::BlocksMissing(int64_t end, int page_size) const {
  return std::max<int64_t>(0, CeilDiv(end, page_size) - first_block_ - num_blocks());
}

int32_t LayerTable::ReplaceBlock(int64_t b, int32_t id) {
  int32_t& slot = pages_[head_ + size_t(b - first_block_)];
  const int32_t old = slot;
  slot = id;
  return old;
}

void LayerTable::Adopt(int64_t first_block, const int32_t* ids, int64_t n, int64_t len) {
  pages_.assign(ids, ids + n);
  head_ = 0;
  first_block_ = first_block;
  len_ = len;
}

void LayerTable::AddBlocks(const int32_t* ids, int64_t n) {
  pages_.insert(pages_.end(), ids, ids + n);
}

void LayerTable::EvictBelow(int64_t pos, int page_size, std::vector<int32_t>* freed) {
  const int64_t drop = std::min(pos / page_size - first_block_, num_blocks());
  if (drop <= 0) return;
  freed->insert(freed->end(), blocks(), blocks() + drop);
  head_ += size_t(drop);
  first_block_ += drop;
  // Compact once the dead prefix outweighs the live blocks: amortised O(1) per eviction.
  if (head_ > pages_.size() - head_) {
    pages_.erase(pages_.begin(), pages_.begin() + ptrdiff_t(head_));
    head_ = 0;
  }
}

void LayerTable::Truncate(int64_t new_len, int page_size, std::vector<int32_t>* freed) {
  const int64_t keep = std::max<int64_t>(0, CeilDiv(new_len, page_size) - first_block_);
  if (keep < num_blocks()) {
    freed->insert(freed->end(), blocks() + keep, blocks() + num_blocks());
    pages_.resize(head_ + size_t(keep));
  }
  len_ = new_len;
}

void LayerTable::DropLastBlocks(int64_t n, std::vector<int32_t>* freed) {
  freed->insert(freed->end(), blocks() + num_blocks() - n, blocks() + num_blocks());
  pages_.resize(pages_.size() - size_t(n));
}

void LayerTable::Clear(bool keep_pages, std::vector<int32_t>* freed) {
  if (!keep_pages) freed->insert(freed->end(), blocks(), blocks() + num_blocks());
  if (keep_pages) {
    pages_.erase(pages_.begin(), pages_.begin() + ptrdiff_t(head_));
  } else {
    pages_.clear();
  }
  head_ = 0;
  first_block_ = 0;
  len_ = 0;
}

std::vector<int32_t> LayerTable::BlocksCovering(int64_t from, int64_t to, int page_size) const {
  if (to <= from) return {};
  const int64_t b0 = from / page_size - first_block_;
  const int64_t b1 = CeilDiv(to, page_size) - first_block_;
  return std::vector<int32_t>(blocks() + b0, blocks() + b1);
}

PagedKvView LayerTable::View(const PageLayout& layout, uint8_t* pool_base) const {
  PagedKvView v;
  v.layout = layout;
  v.pool_base = pool_base;
  v.block_table = blocks();
  v.first_block = first_block_;
  v.num_blocks = num_blocks();
  v.len = len_;
  return v;
}

}  // namespace kvarena
