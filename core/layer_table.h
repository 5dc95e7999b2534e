// LayerTable: the page table of one layer of one cache. Absolute position t lives in
// block t / page_size; blocks below first_block() were evicted by a sliding window.
// Blocks past the ones covering len() may be held in reserve (Reserve ahead, or a reset
// that kept its pages) and are used by the next writes.
//
// Not thread-safe: the owning cache's lock guards it. Page ids are only recorded here;
// taking them from and returning them to the pool is the caller's job.
#ifndef KVARENA_CORE_LAYER_TABLE_H_
#define KVARENA_CORE_LAYER_TABLE_H_

#include <cstdint>
#include <vector>

#include "kernels/paged_kv.h"

namespace kvarena {

class LayerTable {
 public:
  int64_t len() const { return len_; }
  int64_t first_block() const { return first_block_; }
  int64_t first_pos(int page_size) const { return first_block_ * page_size; }
  int64_t num_blocks() const { return int64_t(pages_.size() - head_); }
  const int32_t* blocks() const { return pages_.data() + head_; }

  // The page of absolute block b (REQUIRES first_block() <= b < first_block() + num_blocks()).
  int32_t block(int64_t b) const { return blocks()[b - first_block_]; }
  // Replaces the page of absolute block b; returns the one it held.
  int32_t ReplaceBlock(int64_t b, int32_t id);
  // REQUIRES: an empty table (len 0, no blocks). Takes blocks [first_block, first_block +
  // n) as ids and len: a prefix adopted from other caches, or a fork's copy.
  void Adopt(int64_t first_block, const int32_t* ids, int64_t n, int64_t len);

  // Blocks still to be added so that positions [first_pos, end) are covered.
  int64_t BlocksMissing(int64_t end, int page_size) const;
  void AddBlocks(const int32_t* ids, int64_t n);
  void set_len(int64_t len) { len_ = len; }

  // Drops the blocks that lie wholly below absolute position `pos`; appends their ids.
  void EvictBelow(int64_t pos, int page_size, std::vector<int32_t>* freed);
  // Sets len to new_len (<= len) and drops the blocks past the one holding new_len - 1.
  void Truncate(int64_t new_len, int page_size, std::vector<int32_t>* freed);
  // Drops the last n blocks (REQUIRES: n <= num_blocks()); appends their ids.
  void DropLastBlocks(int64_t n, std::vector<int32_t>* freed);
  // len = 0, first block = 0. keep_pages keeps every held block for positions 0.. .
  void Clear(bool keep_pages, std::vector<int32_t>* freed);

  // The ids of blocks covering [from, to), from >= first_pos.
  std::vector<int32_t> BlocksCovering(int64_t from, int64_t to, int page_size) const;
  PagedKvView View(const PageLayout& layout, uint8_t* pool_base) const;

 private:
  std::vector<int32_t> pages_;  // live blocks are pages_[head_..]
  size_t head_ = 0;
  int64_t first_block_ = 0;
  int64_t len_ = 0;
};

}  // namespace kvarena

#endif  // KVARENA_CORE_LAYER_TABLE_H_
