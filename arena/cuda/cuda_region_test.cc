// The CUDA backend on a real device: VMM reserve / commit / decommit, resident bytes,
// export to a second process (cuda_region_peer, started by posix_spawn) and back, and the
// legacy cudaMalloc + IPC path. Every test skips without a usable device, except the one
// that checks the backend fails cleanly where there is none.
#include "arena/cuda/cuda_region.h"

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "arena/region.h"
#include "gtest/gtest.h"

extern char** environ;

namespace kvarena {
namespace {

constexpr size_t kChunk = kChunkGranularity;
constexpr size_t kAll = SIZE_MAX;  // ExportPiecesAfter: no page bound

#define SKIP_WITHOUT_GPU() \
  if (!CudaDevicePresent()) GTEST_SKIP() << "no CUDA device"

class CudaRegionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaDevicePresent()) return;
    auto b = NewCudaBackend(0, options_);
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = *std::move(b);
  }
  // Skips the VMM tests on a device without VMM or POSIX-fd handles.
  bool Vmm() const { return backend_ && CudaBackendUsesVmm(*backend_); }
  std::unique_ptr<Region> Reserve(size_t bytes) {
    auto r = backend_->Reserve(bytes, "cuda-region-test");
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : nullptr;
  }
  static size_t Resident(const Region& r) { return *r.ResidentBytes(); }
  static void Fill(uint8_t* p, int byte, size_t bytes) {
    ASSERT_EQ(cudaMemset(p, byte, bytes), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  static bool AllEqual(const uint8_t* p, int byte, size_t bytes) {
    std::vector<uint8_t> host(bytes);
    EXPECT_EQ(cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    for (uint8_t b : host) {
      if (b != byte) return false;
    }
    return true;
  }
  // Runs cuda_region_peer; returns its exit status (0: it saw 0x5a and wrote 0xa5).
  static int RunPeer(const std::string& kind, size_t size, const std::string& handle,
                     const std::vector<SharedPiece>& ranges) {
    std::string hex;
    for (unsigned char c : handle) {
      char buf[3];
      std::snprintf(buf, sizeof(buf), "%02x", c);
      hex += buf;
    }
    std::vector<std::string> args = {CUDA_REGION_PEER_PATH,   kind, std::to_string(size),
                                     hex.empty() ? "-" : hex, "90", "165"};
    for (const SharedPiece& r : ranges) {
      if (r.fd >= 0) fcntl(r.fd, F_SETFD, 0);  // inherited by the peer
      args.push_back(std::to_string(r.offset) + ":" + std::to_string(r.bytes) + ":" +
                     std::to_string(r.fd));
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  CudaBackendOptions options_;
  std::unique_ptr<Backend> backend_;
};

TEST(CudaBackendTest, WithoutDeviceEverythingFailsCleanly) {
  if (CudaDevicePresent()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(NewCudaBackend(0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ImportRegion("cuda_vmm", kChunk, "").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ImportRegion("cuda_ipc", kChunk, std::string(64, '\0')).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CudaRegionTest, RejectsDeviceOutOfRange) {
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(NewCudaBackend(-1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NewCudaBackend(1 << 20).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaRegionTest, ReservesWithoutCommitting) {
  SKIP_WITHOUT_GPU();
  if (!Vmm()) GTEST_SKIP() << "device without VMM + POSIX fd handles";
  auto r = Reserve(size_t{64} << 30);  // address space only
  ASSERT_TRUE(r);
  EXPECT_EQ(r->size(), size_t{64} << 30);
  EXPECT_EQ(r->share_kind(), "cuda_vmm");
  EXPECT_EQ(Resident(*r), 0u);
  EXPECT_EQ(Reserve(1)->size(), kChunk);
  EXPECT_EQ(backend_->name(), "cuda");
}

TEST_F(CudaRegionTest, CommitMapsAndDecommitReleases) {
  SKIP_WITHOUT_GPU();
  if (!Vmm()) GTEST_SKIP() << "device without VMM + POSIX fd handles";
  auto r = Reserve(16 * kChunk);
  ASSERT_TRUE(r->Commit(2 * kChunk, 3 * kChunk).ok());
  EXPECT_EQ(Resident(*r), 3 * kChunk);
  Fill(r->base() + 2 * kChunk, 0x11, 3 * kChunk);
  EXPECT_TRUE(AllEqual(r->base() + 2 * kChunk, 0x11, 3 * kChunk));
  ASSERT_TRUE(r->Commit(8 * kChunk, kChunk).ok());
  EXPECT_EQ(Resident(*r), 4 * kChunk);
  ASSERT_TRUE(r->Decommit(2 * kChunk, 3 * kChunk).ok());
  EXPECT_EQ(Resident(*r), kChunk);
  ASSERT_TRUE(r->Decommit(8 * kChunk, kChunk).ok());
  EXPECT_EQ(Resident(*r), 0u);
  ASSERT_TRUE(r->Decommit(0, kChunk).ok());  // never committed: nothing to do
}

TEST_F(CudaRegionTest, UnalignedCommitsShareGranules) {
  SKIP_WITHOUT_GPU();
  if (!Vmm()) GTEST_SKIP() << "device without VMM + POSIX fd handles";
  auto r = Reserve(4 * kChunk);
  const size_t third = kChunk * 3 / 2;        // chunks of 1.5 granules: [0, 1.5) and [1.5, 3)
  ASSERT_TRUE(r->Commit(0, third).ok());      // maps granules 0-1
  ASSERT_TRUE(r->Commit(third, third).ok());  // granule 1 is shared: maps granule 2
  EXPECT_EQ(Resident(*r), 3 * kChunk);
  Fill(r->base(), 0x22, 2 * third);
  ASSERT_TRUE(r->Decommit(0, third).ok());
  EXPECT_EQ(Resident(*r), 3 * kChunk);  // granule 1 still serves the second chunk
  EXPECT_TRUE(AllEqual(r->base() + third, 0x22, third));
  ASSERT_TRUE(r->Decommit(third, third).ok());
  EXPECT_EQ(Resident(*r), 0u);
}

TEST_F(CudaRegionTest, RejectsRangesPastTheEnd) {
  SKIP_WITHOUT_GPU();
  auto r = Reserve(2 * kChunk);
  EXPECT_EQ(r->Commit(kChunk, 2 * kChunk).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(r->Decommit(3 * kChunk, 1).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(r->Commit(~size_t{0}, 2).code(), absl::StatusCode::kOutOfRange);
}

TEST_F(CudaRegionTest, CommitsFromAnyThread) {
  SKIP_WITHOUT_GPU();
  auto r = Reserve(4 * kChunk);
  absl::Status s;
  std::thread t([&] { s = r->Commit(kChunk, kChunk); });
  t.join();
  EXPECT_TRUE(s.ok()) << s;
  Fill(r->base() + kChunk, 0x33, kChunk);
  std::thread u([&] { s = r->Decommit(kChunk, kChunk); });
  u.join();
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(CudaRegionTest, ExportsOnePiecePerAllocationToAPeerProcess) {
  SKIP_WITHOUT_GPU();
  if (!Vmm()) GTEST_SKIP() << "device without VMM + POSIX fd handles";
  auto r = Reserve(8 * kChunk);
  ASSERT_TRUE(r->Commit(0, 2 * kChunk).ok());
  ASSERT_TRUE(r->Commit(5 * kChunk, kChunk).ok());
  Fill(r->base(), 0x5a, 2 * kChunk);
  Fill(r->base() + 5 * kChunk, 0x5a, kChunk);
  auto pieces = r->ExportPieces();
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  ASSERT_EQ(pieces->size(), 2u);
  EXPECT_EQ((*pieces)[0].offset, 0u);
  EXPECT_EQ((*pieces)[0].bytes, 2 * kChunk);
  EXPECT_EQ((*pieces)[1].offset, 5 * kChunk);
  EXPECT_EQ((*pieces)[1].bytes, kChunk);
  EXPECT_EQ(RunPeer("cuda_vmm", r->size(), "", *pieces), 0);
  for (const SharedPiece& p : *pieces) close(p.fd);
  EXPECT_TRUE(AllEqual(r->base(), 0xa5, 2 * kChunk));
  EXPECT_TRUE(AllEqual(r->base() + 5 * kChunk, 0xa5, kChunk));
}

// A peer that mapped everything up to generation g asks for the pieces after g: only
// memory committed since, and a recommit in a decommitted place comes as a newer piece.
TEST_F(CudaRegionTest, ExportPiecesAfterGivesOnlyNewerAllocations) {
  SKIP_WITHOUT_GPU();
  if (!Vmm()) GTEST_SKIP() << "device without VMM + POSIX fd handles";
  auto r = Reserve(8 * kChunk);
  ASSERT_TRUE(r->Commit(0, kChunk).ok());
  auto first = r->ExportPiecesAfter(0, 0, kAll, nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->size(), 1u);
  const uint64_t g0 = (*first)[0].generation;
  auto m = ImportRegion("cuda_vmm", r->size(), "");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->device(), 0);
  ASSERT_TRUE((*m)->MapPieces(*std::move(first)).ok());

  ASSERT_TRUE(r->Commit(3 * kChunk, kChunk).ok());
  auto grown = r->ExportPiecesAfter(g0, 0, kAll, nullptr);
  ASSERT_TRUE(grown.ok());
  ASSERT_EQ(grown->size(), 1u);
  EXPECT_EQ((*grown)[0].offset, 3 * kChunk);
  const uint64_t g1 = (*grown)[0].generation;
  EXPECT_GT(g1, g0);
  ASSERT_TRUE((*m)->MapPieces(*std::move(grown)).ok());

  ASSERT_TRUE(r->Decommit(0, kChunk).ok());
  ASSERT_TRUE(r->Commit(0, kChunk).ok());
  auto again = r->ExportPiecesAfter(g1, 0, kAll, nullptr);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->size(), 1u);
  EXPECT_EQ((*again)[0].offset, 0u);
  EXPECT_GT((*again)[0].generation, g1);
  const uint64_t g2 = (*again)[0].generation;
  ASSERT_TRUE((*m)->MapPieces(*std::move(again)).ok());  // replaces the stale mapping
  Fill(r->base(), 0x11, kChunk);
  Fill(r->base() + 3 * kChunk, 0x22, kChunk);
  EXPECT_TRUE(AllEqual((*m)->base(), 0x11, kChunk));  // the mapping sees the new memory
  EXPECT_TRUE(AllEqual((*m)->base() + 3 * kChunk, 0x22, kChunk));
  auto none = r->ExportPiecesAfter(g2, 0, kAll, nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

// A page holds the pieces after `first` in generation order, not offset order, and only
// they are exported; the total counts every piece after the generation.
TEST_F(CudaRegionTest, ExportPiecesAfterPagesInGenerationOrder) {
  SKIP_WITHOUT_GPU();
  if (!Vmm()) GTEST_SKIP() << "device without VMM + POSIX fd handles";
  auto r = Reserve(8 * kChunk);
  for (size_t chunk : {6, 2, 4, 0}) ASSERT_TRUE(r->Commit(chunk * kChunk, kChunk).ok());
  size_t total = 0;
  auto page = r->ExportPiecesAfter(0, 1, 2, &total);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(total, 4u);
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0].offset, 2 * kChunk);
  EXPECT_EQ((*page)[1].offset, 4 * kChunk);
  EXPECT_LT((*page)[0].generation, (*page)[1].generation);
  for (const SharedPiece& p : *page) close(p.fd);
  auto newest = r->ExportPiecesAfter((*page)[1].generation, 0, kAll, &total);
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(total, 1u);
  ASSERT_EQ(newest->size(), 1u);
  EXPECT_EQ((*newest)[0].offset, 0u);
  close((*newest)[0].fd);
}

TEST_F(CudaRegionTest, ImportRejectsPiecesOffTheGranularity) {
  SKIP_WITHOUT_GPU();
  if (!Vmm()) GTEST_SKIP() << "device without VMM + POSIX fd handles";
  auto m = ImportRegion("cuda_vmm", 4 * kChunk, "");
  ASSERT_TRUE(m.ok()) << m.status();
  const int fd = dup(0);
  EXPECT_EQ((*m)->MapPieces({{4096, kChunk, fd}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fcntl(fd, F_GETFD), -1);  // MapPieces took the fd and closed it
  EXPECT_EQ((*m)->MapPieces({{3 * kChunk, 2 * kChunk, dup(0)}}).code(),
            absl::StatusCode::kInvalidArgument);
}

class CudaLegacyRegionTest : public CudaRegionTest {
 protected:
  CudaLegacyRegionTest() { options_.force_legacy_ipc = true; }
};

TEST_F(CudaLegacyRegionTest, IsOneAllocationSharedByIpcHandle) {
  SKIP_WITHOUT_GPU();
  EXPECT_FALSE(CudaBackendUsesVmm(*backend_));
  auto r = Reserve(3 * kChunk);
  EXPECT_EQ(r->share_kind(), "cuda_ipc");
  EXPECT_EQ(Resident(*r), 3 * kChunk);
  EXPECT_TRUE(r->Commit(0, kChunk).ok());
  EXPECT_TRUE(r->Decommit(0, kChunk).ok());
  EXPECT_EQ(Resident(*r), 3 * kChunk);
  EXPECT_EQ(r->Commit(kChunk, 3 * kChunk).code(), absl::StatusCode::kOutOfRange);
  auto pieces = r->ExportPieces();
  ASSERT_TRUE(pieces.ok());
  EXPECT_TRUE(pieces->empty());
  EXPECT_EQ(r->ipc_handle().size(), sizeof(cudaIpcMemHandle_t));

  Fill(r->base(), 0x5a, r->size());
  EXPECT_EQ(RunPeer("cuda_ipc", r->size(), r->ipc_handle(), {{0, r->size(), -1}}), 0);
  EXPECT_TRUE(AllEqual(r->base(), 0xa5, r->size()));
}

}  // namespace
}  // namespace kvarena
