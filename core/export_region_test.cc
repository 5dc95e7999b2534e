// KvStore::ExportRegion pages a region of many pieces (a large CUDA VMM pool) through
// Region::ExportPiecesAfter: a page creates fds for its own pieces only, and the total
// counts every piece after the generation asked about.
#include <unistd.h>

#include <atomic>
#include <memory>

#include "core/store_fixture.h"
#include "tests/support/fake_pieces_backend.h"

namespace kvarena {
namespace {

using Code = absl::StatusCode;
constexpr size_t kPieces = 600;
constexpr uint64_t kPoolRegion = 1;  // the first pool's region id

class ExportRegionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions o;
    o.arena_bytes = size_t{64} << 20;
    o.num_threads = 1;
    o.scratch_bytes = kChunkGranularity;
    auto store =
        KvStore::Create(o, std::make_unique<testing::FakePiecesBackend>(kPieces, &fds_created_));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    session_ = *store_->OpenSession("w");
    ASSERT_TRUE(store_->Allocate(session_, Spec(1, 2, 8), "a").ok());
  }
  // The generations of one page of the pool; closes its fds. *created: fds it made.
  std::vector<uint64_t> Page(uint64_t after, size_t first, size_t max_pieces, size_t* total,
                             int* created) {
    const int before = fds_created_.load();
    auto page = store_->ExportRegion(session_, kPoolRegion, after, first, max_pieces, total);
    EXPECT_TRUE(page.ok()) << page.status();
    *created = fds_created_.load() - before;
    std::vector<uint64_t> generations;
    for (const SharedPiece& p : page.ok() ? *page : std::vector<SharedPiece>{}) {
      EXPECT_EQ(close(p.fd), 0);
      generations.push_back(p.generation);
    }
    return generations;
  }
  static std::vector<uint64_t> Range(uint64_t from, uint64_t to) {  // [from, to]
    std::vector<uint64_t> g;
    for (uint64_t i = from; i <= to; ++i) g.push_back(i);
    return g;
  }

  std::atomic<int> fds_created_{0};
  std::unique_ptr<KvStore> store_;
  std::string session_;
};

TEST_F(ExportRegionTest, APageCreatesFdsForItsOwnPiecesOnly) {
  size_t total = 0;
  int created = 0;
  EXPECT_EQ(Page(0, 0, 250, &total, &created), Range(1, 250));
  EXPECT_EQ(created, 250);
  EXPECT_EQ(total, kPieces);
  EXPECT_EQ(Page(0, 250, 250, &total, &created), Range(251, 500));
  EXPECT_EQ(created, 250);
  EXPECT_EQ(Page(0, 500, 250, &total, &created), Range(501, 600));
  EXPECT_EQ(created, 100);
  EXPECT_EQ(total, kPieces);
  EXPECT_TRUE(Page(0, 600, 250, &total, &created).empty());
  EXPECT_EQ(created, 0);
}

TEST_F(ExportRegionTest, TotalCountsOnlyThePiecesAfterTheGeneration) {
  size_t total = 0;
  int created = 0;
  EXPECT_EQ(Page(550, 0, 250, &total, &created), Range(551, 600));
  EXPECT_EQ(created, 50);
  EXPECT_EQ(total, 50u);
  EXPECT_EQ(Page(550, 20, 10, &total, &created), Range(571, 580));
  EXPECT_EQ(created, 10);
  EXPECT_EQ(total, 50u);
  EXPECT_TRUE(Page(600, 0, 250, &total, &created).empty());
  EXPECT_EQ(total, 0u);
}

TEST_F(ExportRegionTest, RefusalsCreateNoFds) {
  const std::string other = *store_->OpenSession("w2");
  const uint64_t scratch = (*store_->SessionRegions(session_))[0].region_id;
  EXPECT_THAT(store_->ExportRegion(other, scratch, 0, 0, 250), StatusIs(Code::kPermissionDenied));
  EXPECT_THAT(store_->ExportRegion(session_, 9, 0, 0, 250), StatusIs(Code::kNotFound));
  EXPECT_THAT(store_->ExportRegion("", kPoolRegion, 0, 0, 250),
              StatusIs(Code::kFailedPrecondition));
  EXPECT_EQ(fds_created_.load(), 0);
}

}  // namespace
}  // namespace kvarena
