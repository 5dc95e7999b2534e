// Test-only, shared by every layer's tests. FakePiecesBackend: regions with real host memory
// (so pools work on them) that export like a large CUDA VMM region — `num_pieces` pieces
// of generations 1..num_pieces — and count every fd they create, so a test can show that
// an export page creates fds for its own pieces only. The pieces are for counting, not for
// mapping: each fd is a dup of the region's memfd.
//
// Thread-safety: as the host backend; the counter is atomic.
#ifndef KVARENA_TESTS_SUPPORT_FAKE_PIECES_BACKEND_H_
#define KVARENA_TESTS_SUPPORT_FAKE_PIECES_BACKEND_H_

#include <fcntl.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "arena/piece_page.h"
#include "arena/region.h"
#include "base/status_macros.h"

namespace kvarena::testing {

class FakePiecesRegion final : public Region {
 public:
  FakePiecesRegion(std::unique_ptr<Region> memory, size_t num_pieces, std::atomic<int>* fds_created)
      : memory_(std::move(memory)), num_pieces_(num_pieces), fds_created_(fds_created) {}

  uint8_t* base() const override { return memory_->base(); }
  size_t size() const override { return memory_->size(); }
  absl::Status Commit(size_t offset, size_t bytes) override {
    return memory_->Commit(offset, bytes);
  }
  absl::Status Decommit(size_t offset, size_t bytes) override {
    return memory_->Decommit(offset, bytes);
  }
  absl::StatusOr<size_t> ResidentBytes() const override { return memory_->ResidentBytes(); }
  std::string share_kind() const override { return "fake_pieces"; }

  absl::StatusOr<std::vector<SharedPiece>> ExportPiecesAfter(uint64_t generation, size_t first,
                                                             size_t max_pieces,
                                                             size_t* total) const override {
    std::vector<PieceRef> refs;
    for (size_t i = 0; i < num_pieces_; ++i) {
      refs.push_back({i + 1, i * kChunkGranularity, kChunkGranularity});
    }
    std::vector<SharedPiece> out;
    for (const PieceRef& r : PageOfPieces(std::move(refs), generation, first, max_pieces, total)) {
      const int fd = fcntl(memory_->fd(), F_DUPFD_CLOEXEC, 0);
      if (fd < 0) return absl::InternalError(absl::StrCat("dup: ", std::strerror(errno)));
      fds_created_->fetch_add(1);
      out.push_back({r.offset, r.bytes, fd, r.generation});
    }
    return out;
  }

 private:
  const std::unique_ptr<Region> memory_;
  const size_t num_pieces_;
  std::atomic<int>* const fds_created_;
};

class FakePiecesBackend final : public Backend {
 public:
  // fds_created: counts every fd an export creates; must outlive the regions.
  FakePiecesBackend(size_t num_pieces, std::atomic<int>* fds_created)
      : num_pieces_(num_pieces), fds_created_(fds_created) {}

  std::string name() const override { return "fake_pieces"; }
  absl::StatusOr<std::unique_ptr<Region>> Reserve(size_t bytes, const std::string& label) override {
    KVARENA_ASSIGN_OR_RETURN(std::unique_ptr<Region> memory, host_->Reserve(bytes, label));
    return std::make_unique<FakePiecesRegion>(std::move(memory), num_pieces_, fds_created_);
  }

 private:
  const std::unique_ptr<Backend> host_ = NewHostBackend();
  const size_t num_pieces_;
  std::atomic<int>* const fds_created_;
};

}  // namespace kvarena::testing

#endif  // KVARENA_TESTS_SUPPORT_FAKE_PIECES_BACKEND_H_
