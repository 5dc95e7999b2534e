// HandleFdRequest (daemon/fd_requests.h), the fd socket's request logic without a socket:
// refusals, bytes that are no request, and export pages over a region of 600 pieces
// (a large CUDA VMM pool, faked) that honour first_piece and after_generation exactly
// and create fds for the reply's pieces only.
#include "daemon/fd_requests.h"

#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "arena/fd_passing.h"
#include "core/kv_store.h"
#include "gtest/gtest.h"
#include "kvarena/v1/kvarena.pb.h"
#include "tests/support/fake_pieces_backend.h"

namespace kvarena {
namespace {

constexpr size_t kPieces = 600;
constexpr uint64_t kPoolRegion = 1;  // the first pool's region id

class FdRequestsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions o;
    o.arena_bytes = size_t{64} << 20;
    o.num_threads = 0;
    o.scratch_bytes = kChunkGranularity;
    auto store =
        KvStore::Create(o, std::make_unique<testing::FakePiecesBackend>(kPieces, &fds_created_));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    session_ = *store_->OpenSession("w");
    ASSERT_TRUE(
        store_->Allocate(session_, CacheSpec{1, 2, 8, DType::kFloat32, 4, {}, 0, ""}, "a").ok());
  }
  // Handles `bytes`; checks that the reply's pieces and pieces_out agree, closes the fds.
  v1::FdReply Handle(const std::string& bytes, const absl::Status& access = absl::OkStatus()) {
    std::vector<SharedPiece> pieces;
    v1::FdReply reply = HandleFdRequest(*store_, bytes, access, &pieces);
    EXPECT_EQ(pieces.size(), size_t(reply.pieces_size()));
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (i < size_t(reply.pieces_size())) {
        EXPECT_EQ(pieces[i].generation, reply.pieces(int(i)).generation());
        EXPECT_EQ(pieces[i].offset, reply.pieces(int(i)).offset());
      }
      EXPECT_EQ(close(pieces[i].fd), 0);
    }
    return reply;
  }
  v1::FdReply Export(uint32_t first_piece, uint64_t after_generation) {
    v1::FdRequest req;
    req.set_session_id(session_);
    req.mutable_export_region()->set_region_id(kPoolRegion);
    req.mutable_export_region()->set_first_piece(first_piece);
    req.mutable_export_region()->set_after_generation(after_generation);
    return Handle(req.SerializeAsString());
  }
  static uint64_t FirstGeneration(const v1::FdReply& r) { return r.pieces(0).generation(); }
  static uint64_t LastGeneration(const v1::FdReply& r) {
    return r.pieces(r.pieces_size() - 1).generation();
  }

  std::atomic<int> fds_created_{0};
  std::unique_ptr<KvStore> store_;
  std::string session_;
};

TEST_F(FdRequestsTest, FirstPiecePagesThroughEveryPiece) {
  v1::FdReply page = Export(0, 0);
  ASSERT_EQ(page.code(), 0) << page.message();
  EXPECT_EQ(size_t(page.pieces_size()), kMaxFdsPerMessage);
  EXPECT_EQ(page.total_pieces(), kPieces);
  EXPECT_EQ(FirstGeneration(page), 1u);
  EXPECT_EQ(LastGeneration(page), 250u);
  EXPECT_EQ(fds_created_.load(), 250);

  page = Export(250, 0);
  ASSERT_EQ(page.pieces_size(), 250);
  EXPECT_EQ(FirstGeneration(page), 251u);
  page = Export(500, 0);
  ASSERT_EQ(page.pieces_size(), 100);
  EXPECT_EQ(FirstGeneration(page), 501u);
  EXPECT_EQ(LastGeneration(page), 600u);
  EXPECT_EQ(page.total_pieces(), kPieces);
  EXPECT_EQ(Export(600, 0).pieces_size(), 0);
  EXPECT_EQ(Export(UINT32_MAX, 0).pieces_size(), 0);
  EXPECT_EQ(fds_created_.load(), 600);  // each piece exported once over the three pages
}

TEST_F(FdRequestsTest, AfterGenerationPagesOnlyTheNewerPieces) {
  v1::FdReply page = Export(0, 300);
  ASSERT_EQ(page.pieces_size(), 250);
  EXPECT_EQ(page.total_pieces(), 300u);
  EXPECT_EQ(FirstGeneration(page), 301u);
  // Both ways of asking for the next page agree: first_piece, or after the newest received.
  const v1::FdReply by_index = Export(250, 300);
  const v1::FdReply by_generation = Export(0, LastGeneration(page));
  ASSERT_EQ(by_index.pieces_size(), 50);
  ASSERT_EQ(by_generation.pieces_size(), 50);
  EXPECT_EQ(FirstGeneration(by_index), 551u);
  EXPECT_EQ(FirstGeneration(by_generation), 551u);
  EXPECT_EQ(by_generation.total_pieces(), 50u);
  EXPECT_EQ(Export(0, 600).total_pieces(), 0u);
}

TEST_F(FdRequestsTest, ListsTheSessionsRegions) {
  v1::FdRequest req;
  req.set_session_id(session_);
  req.mutable_list_regions();
  const v1::FdReply reply = Handle(req.SerializeAsString());
  ASSERT_EQ(reply.code(), 0) << reply.message();
  ASSERT_EQ(reply.regions_size(), 2);  // the scratch region and the pool
  EXPECT_TRUE(reply.regions(0).scratch());
  EXPECT_EQ(reply.regions(1).region_id(), kPoolRegion);
  EXPECT_EQ(reply.pieces_size(), 0);
}

TEST_F(FdRequestsTest, RefusesPeersOfAnotherUserBeforeReadingTheRequest) {
  v1::FdRequest req;
  req.set_session_id(session_);
  req.mutable_export_region()->set_region_id(kPoolRegion);
  const v1::FdReply reply =
      Handle(req.SerializeAsString(), absl::PermissionDeniedError("fd socket: peer uid 7 refused"));
  EXPECT_EQ(reply.code(), int(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(reply.message(), "fd socket: peer uid 7 refused");
  EXPECT_EQ(fds_created_.load(), 0);
}

TEST_F(FdRequestsTest, RejectsBytesThatAreNoRequest) {
  EXPECT_EQ(Handle(std::string("\xff\xff\xff\xff", 4)).code(),
            int(absl::StatusCode::kInvalidArgument));
  v1::FdRequest none;
  none.set_session_id(session_);
  EXPECT_EQ(Handle(none.SerializeAsString()).code(), int(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(Handle("").code(), int(absl::StatusCode::kInvalidArgument));  // no operation either
}

TEST_F(FdRequestsTest, StoreRefusalsTravelInTheReply) {
  v1::FdRequest req;
  req.set_session_id(session_);
  req.mutable_export_region()->set_region_id(77);
  EXPECT_EQ(Handle(req.SerializeAsString()).code(), int(absl::StatusCode::kNotFound));
  req.set_session_id("feed");
  EXPECT_EQ(Handle(req.SerializeAsString()).code(), int(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(fds_created_.load(), 0);
}

}  // namespace
}  // namespace kvarena
