#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <memory>

#include "arena/region.h"
#include "gtest/gtest.h"

namespace kvarena {
namespace {

class HostRegionTest : public ::testing::Test {
 protected:
  std::unique_ptr<Region> Reserve(size_t bytes) {
    auto r = backend_->Reserve(bytes, "host-region-test");
    EXPECT_TRUE(r.ok()) << r.status();
    return *std::move(r);
  }
  static size_t Resident(const Region& r) { return *r.ResidentBytes(); }

  std::unique_ptr<Backend> backend_ = NewHostBackend();
};

TEST_F(HostRegionTest, ReservesWithoutCommitting) {
  auto r = Reserve(size_t{1} << 30);
  EXPECT_EQ(r->size(), size_t{1} << 30);
  EXPECT_GE(r->fd(), 0);
  EXPECT_EQ(Resident(*r), 0u);
}

TEST_F(HostRegionTest, RoundsUpToChunkGranularity) {
  auto r = Reserve(1);
  EXPECT_EQ(r->size(), kChunkGranularity);
}

TEST_F(HostRegionTest, TouchCommitsAndDecommitReturnsMemory) {
  const size_t chunk = kChunkGranularity;
  auto r = Reserve(16 * chunk);
  ASSERT_TRUE(r->Commit(0, 8 * chunk).ok());
  std::memset(r->base(), 0x5a, 8 * chunk);
  EXPECT_GE(Resident(*r), 8 * chunk);
  ASSERT_TRUE(r->Decommit(0, 8 * chunk).ok());
  EXPECT_EQ(Resident(*r), 0u);
  EXPECT_EQ(r->base()[0], 0);  // punched memory reads back as zeros
}

// Minor faults this thread took so far.
long ThreadMinorFaults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

TEST_F(HostRegionTest, PrefaultMakesARangeResidentKeepingItsBytes) {
  const size_t chunk = kChunkGranularity;
  auto r = Reserve(4 * chunk);
  ASSERT_TRUE(r->Commit(0, 2 * chunk).ok());
  r->base()[chunk + 5] = 7;  // someone's bytes: a prefault leaves them
  ASSERT_TRUE(r->Prefault(chunk, chunk).ok());
  EXPECT_GE(Resident(*r), chunk);
  EXPECT_EQ(r->base()[chunk + 5], 7);
  EXPECT_EQ(r->base()[chunk + 6], 0);
  // Writing the prefaulted range takes (nearly) no fault: it is mapped already.
  const long before = ThreadMinorFaults();
  std::memset(r->base() + chunk, 0x33, chunk);
  EXPECT_LT(ThreadMinorFaults() - before, long(chunk / 4096 / 8));
  EXPECT_EQ(r->Prefault(4 * chunk, 1).code(), absl::StatusCode::kOutOfRange);
}

TEST(HugePagesTest, ReadsTheSelectedShmemMode) {
  EXPECT_FALSE(ShmemHugePagesAllowed("always within_size advise [never] deny force\n"));
  EXPECT_FALSE(ShmemHugePagesAllowed("always within_size advise never [deny] force"));
  EXPECT_TRUE(ShmemHugePagesAllowed("always within_size [advise] never deny force\n"));
  EXPECT_TRUE(ShmemHugePagesAllowed("[always] within_size advise never deny force"));
  EXPECT_TRUE(ShmemHugePagesAllowed("always [within_size] advise never deny force"));
  EXPECT_FALSE(ShmemHugePagesAllowed(""));  // no THP in the kernel: no file
}

TEST_F(HostRegionTest, UnalignedDecommitKeepsNeighbourBytes) {
  auto r = Reserve(kChunkGranularity);
  std::memset(r->base(), 0x11, 3 * 4096);
  // [100, 8292) covers only block 1 wholly; blocks 0 and 2 hold live neighbour bytes.
  ASSERT_TRUE(r->Decommit(100, 8192).ok());
  EXPECT_EQ(r->base()[99], 0x11);
  EXPECT_EQ(r->base()[100], 0x11);
  EXPECT_EQ(r->base()[4095], 0x11);
  EXPECT_EQ(r->base()[4096], 0);
  EXPECT_EQ(r->base()[8192], 0x11);
}

TEST_F(HostRegionTest, RejectsRangesPastTheEnd) {
  auto r = Reserve(kChunkGranularity);
  EXPECT_EQ(r->Commit(kChunkGranularity, 1).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(r->Decommit(1, kChunkGranularity).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(r->Commit(1, SIZE_MAX).code(), absl::StatusCode::kOutOfRange);  // offset + bytes wraps
}

TEST_F(HostRegionTest, FdReadsTheMappedBytes) {
  auto r = Reserve(kChunkGranularity);
  r->base()[12345] = 42;
  char buf[1];
  ASSERT_EQ(pread(r->fd(), buf, 1, 12345), 1);
  EXPECT_EQ(buf[0], 42);
}

TEST_F(HostRegionTest, ImportedMappingSharesBytesBothWays) {
  auto r = Reserve(4 * kChunkGranularity);
  EXPECT_EQ(r->share_kind(), "host_memfd");
  auto pieces = r->ExportPieces();
  ASSERT_TRUE(pieces.ok());
  ASSERT_EQ(pieces->size(), 1u);
  auto m = ImportRegion("host_memfd", r->size(), "");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE((*m)->MapPieces(*std::move(pieces)).ok());
  EXPECT_NE((*m)->base(), r->base());
  r->base()[3 * kChunkGranularity + 7] = 9;
  EXPECT_EQ((*m)->base()[3 * kChunkGranularity + 7], 9);
  (*m)->base()[100] = 5;
  EXPECT_EQ(r->base()[100], 5);
}

TEST_F(HostRegionTest, IsOnePieceOfOneGenerationOnTheHost) {
  auto r = Reserve(2 * kChunkGranularity);
  ASSERT_TRUE(r->Commit(kChunkGranularity, kChunkGranularity).ok());
  size_t total = 0;
  auto all = r->ExportPiecesAfter(0, 0, 250, &total);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ(total, 1u);
  EXPECT_EQ((*all)[0].generation, 1u);
  close((*all)[0].fd);
  auto past = r->ExportPiecesAfter(0, 1, 250, &total);  // a second page holds nothing
  ASSERT_TRUE(past.ok());
  EXPECT_TRUE(past->empty());
  EXPECT_EQ(total, 1u);
  auto newer =
      r->ExportPiecesAfter(1, 0, 250, &total);  // the memfd grows by itself: nothing to add
  ASSERT_TRUE(newer.ok());
  EXPECT_TRUE(newer->empty());
  EXPECT_EQ(total, 0u);
  auto m = ImportRegion("host_memfd", r->size(), "");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)->device(), -1);
}

TEST_F(HostRegionTest, ImportRejectsUnknownKindsAndBadPieces) {
  EXPECT_EQ(ImportRegion("rdma_window", kChunkGranularity, "").status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto m = ImportRegion("host_memfd", kChunkGranularity, "");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)->MapPieces({{kChunkGranularity, 4096, dup(0)}}).code(),
            absl::StatusCode::kInvalidArgument);
}

// The wire spells region kinds and devices exactly as before the enum: peers of other
// versions read them.
TEST(RegionKindTest, WireNamesRoundTripAndNothingElseParses) {
  for (RegionKind k : {RegionKind::kHostMemfd, RegionKind::kCudaVmm, RegionKind::kCudaIpc}) {
    EXPECT_EQ(ParseRegionKind(RegionKindName(k)), k) << RegionKindName(k);
  }
  EXPECT_STREQ(RegionKindName(RegionKind::kHostMemfd), "host_memfd");
  EXPECT_STREQ(RegionKindName(RegionKind::kCudaVmm), "cuda_vmm");
  EXPECT_STREQ(RegionKindName(RegionKind::kCudaIpc), "cuda_ipc");
  EXPECT_EQ(ParseRegionKind("rdma_window"), std::nullopt);
  EXPECT_EQ(ParseRegionKind(""), std::nullopt);
}

TEST(RegionKindTest, BackendDeviceNamesWherePagesLive) {
  EXPECT_EQ(BackendDevice("host"), "cpu");
  EXPECT_EQ(BackendDevice("cuda"), "cuda:0");
  EXPECT_EQ(BackendDevice("fake_pieces"), "fake_pieces");
  EXPECT_EQ(BackendDevice(NewHostBackend()->name()), "cpu");
}

}  // namespace
}  // namespace kvarena
