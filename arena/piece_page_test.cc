#include "arena/piece_page.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvarena {
namespace {

// n pieces of generations 1..n, one per chunk, listed in a shuffled order (a region's
// allocation map is ordered by offset, not generation).
std::vector<PieceRef> Shuffled(size_t n, unsigned seed) {
  std::vector<PieceRef> refs;
  for (size_t i = 0; i < n; ++i) refs.push_back({i + 1, (n - 1 - i) * 4096, 4096});
  std::shuffle(refs.begin(), refs.end(), std::mt19937(seed));
  return refs;
}

std::vector<uint64_t> Generations(const std::vector<PieceRef>& refs) {
  std::vector<uint64_t> g;
  for (const PieceRef& r : refs) g.push_back(r.generation);
  return g;
}

std::vector<uint64_t> Range(uint64_t from, uint64_t to) {  // [from, to]
  std::vector<uint64_t> g;
  for (uint64_t i = from; i <= to; ++i) g.push_back(i);
  return g;
}

TEST(PageOfPiecesTest, PagesWalkTheGenerationsInOrder) {
  for (unsigned seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(::testing::Message() << "seed=" << seed);
    size_t total = 0;
    EXPECT_EQ(Generations(PageOfPieces(Shuffled(600, seed), 0, 0, 250, &total)), Range(1, 250));
    EXPECT_EQ(total, 600u);
    EXPECT_EQ(Generations(PageOfPieces(Shuffled(600, seed), 0, 250, 250, &total)), Range(251, 500));
    EXPECT_EQ(Generations(PageOfPieces(Shuffled(600, seed), 0, 500, 250, &total)), Range(501, 600));
    EXPECT_TRUE(PageOfPieces(Shuffled(600, seed), 0, 600, 250, &total).empty());
    EXPECT_TRUE(PageOfPieces(Shuffled(600, seed), 0, SIZE_MAX, 250, &total).empty());
    EXPECT_EQ(total, 600u);
  }
}

TEST(PageOfPiecesTest, AfterAGenerationCountsOnlyNewerPieces) {
  size_t total = 0;
  EXPECT_EQ(Generations(PageOfPieces(Shuffled(600, 7), 550, 0, 250, &total)), Range(551, 600));
  EXPECT_EQ(total, 50u);
  EXPECT_EQ(Generations(PageOfPieces(Shuffled(600, 7), 550, 10, 5, &total)), Range(561, 565));
  EXPECT_EQ(total, 50u);
  EXPECT_TRUE(PageOfPieces(Shuffled(600, 7), 600, 0, 250, &total).empty());
  EXPECT_EQ(total, 0u);
  EXPECT_EQ(PageOfPieces(Shuffled(3, 7), 0, 0, SIZE_MAX, nullptr).size(), 3u);
}

TEST(PageOfPiecesTest, OffsetOrdersPiecesOfOneGeneration) {
  const std::vector<PieceRef> page =
      PageOfPieces({{2, 8192, 1}, {2, 0, 1}, {1, 4096, 1}}, 0, 0, 9, nullptr);
  ASSERT_EQ(page.size(), 3u);
  EXPECT_EQ(page[0].offset, 4096u);
  EXPECT_EQ(page[1].offset, 0u);
  EXPECT_EQ(page[2].offset, 8192u);
}

}  // namespace
}  // namespace kvarena
