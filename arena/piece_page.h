// One page of Region::ExportPiecesAfter, chosen before any fd is created: a region lists
// where its pieces are (PieceRef), this picks the page, and the region exports only those.
// Inline: the CUDA regions (a library kvarena_arena itself links) use it too.
//
// Thread-safety: a pure function of its arguments.
#ifndef KVARENA_ARENA_PIECE_PAGE_H_
#define KVARENA_ARENA_PIECE_PAGE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvarena {

// A piece of a region before export: SharedPiece without the fd.
struct PieceRef {
  uint64_t generation = 0;
  size_t offset = 0;
  size_t bytes = 0;
};

// The refs whose generation is greater than `after`, sorted by generation (oldest first;
// offset breaks ties), without the first `first` of them, at most `max_pieces`. *total
// (when given) is how many are greater than `after` in all.
inline std::vector<PieceRef> PageOfPieces(std::vector<PieceRef> refs, uint64_t after, size_t first,
                                          size_t max_pieces, size_t* total) {
  std::erase_if(refs, [after](const PieceRef& r) { return r.generation <= after; });
  if (total != nullptr) *total = refs.size();
  const size_t begin = std::min(first, refs.size());
  const size_t end = begin + std::min(max_pieces, refs.size() - begin);
  const auto older = [](const PieceRef& a, const PieceRef& b) {
    return a.generation != b.generation ? a.generation < b.generation : a.offset < b.offset;
  };
  std::partial_sort(refs.begin(), refs.begin() + end, refs.end(), older);
  return std::vector<PieceRef>(refs.begin() + begin, refs.begin() + end);
}

}  // namespace kvarena

#endif  // KVARENA_ARENA_PIECE_PAGE_H_
