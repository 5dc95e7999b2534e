// Host backend: each region is a memfd sized to the reservation and mapped shared with
// MAP_NORESERVE, so nothing is committed until touched. Decommit punches the range out of
// the memfd, which returns the memory to the system (st_blocks falls).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "arena/piece_page.h"
#include "arena/region.h"
#include "base/status_macros.h"
#include "kvarena/paged_kv.h"

// Linux 5.14; older headers lack the name.
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace kvarena {
namespace {

absl::Status ErrnoStatus(const char* what, int err) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(err)));
}

class HostRegion final : public Region {
 public:
  HostRegion(int fd, uint8_t* base, size_t size) : fd_(fd), base_(base), size_(size) {}
  ~HostRegion() override {
    munmap(base_, size_);
    close(fd_);
  }
  HostRegion(const HostRegion&) = delete;
  HostRegion& operator=(const HostRegion&) = delete;

  uint8_t* base() const override { return base_; }
  size_t size() const override { return size_; }
  int fd() const override { return fd_; }

  // Pages of a memfd are allocated on first touch; there is nothing to do up front.
  absl::Status Commit(size_t offset, size_t bytes) override {
    return CheckRegionRange("commit", offset, bytes, size_);
  }

  // MADV_POPULATE_WRITE allocates and maps every page of the range in one call; a kernel
  // without it (EINVAL) gets one atomic no-op write per page instead (an add of 0: the
  // bytes stay what they are even while a cache writes them).
  absl::Status Prefault(size_t offset, size_t bytes) override {
    KVARENA_RETURN_IF_ERROR(CheckRegionRange("prefault", offset, bytes, size_));
    if (bytes == 0) return absl::OkStatus();
    if (madvise(base_ + offset, bytes, MADV_POPULATE_WRITE) == 0) return absl::OkStatus();
    if (errno != EINVAL) return ErrnoStatus("madvise(MADV_POPULATE_WRITE)", errno);
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    for (size_t o = offset / page * page; o < offset + bytes; o += page)
      __atomic_fetch_add(base_ + o, uint8_t{0}, __ATOMIC_RELAXED);
    return absl::OkStatus();
  }

  absl::Status Decommit(size_t offset, size_t bytes) override {
    KVARENA_RETURN_IF_ERROR(CheckRegionRange("decommit", offset, bytes, size_));
    // Punch whole file-system blocks only: a partial block at either end may hold the
    // neighbouring range's live bytes, which a punch would zero.
    const size_t begin = RoundUp(offset, kBlock);
    const size_t end = (offset + bytes) / kBlock * kBlock;
    if (end <= begin) return absl::OkStatus();
    if (fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(begin),
                  off_t(end - begin)) != 0) {
      return ErrnoStatus("fallocate(PUNCH_HOLE)", errno);
    }
    return absl::OkStatus();
  }

  std::string share_kind() const override { return RegionKindName(RegionKind::kHostMemfd); }

  // One piece, the whole memfd, of generation 1 for the region's life.
  absl::StatusOr<std::vector<SharedPiece>> ExportPiecesAfter(uint64_t generation, size_t first,
                                                             size_t max_pieces,
                                                             size_t* total) const override {
    std::vector<SharedPiece> out;
    for (const PieceRef& r : PageOfPieces({{1, 0, size_}}, generation, first, max_pieces, total)) {
      const int fd = fcntl(fd_, F_DUPFD_CLOEXEC, 0);
      if (fd < 0) return ErrnoStatus("dup(memfd)", errno);
      out.push_back({r.offset, r.bytes, fd, r.generation});
    }
    return out;
  }

  absl::StatusOr<size_t> ResidentBytes() const override {
    struct stat st;
    if (fstat(fd_, &st) != 0) return ErrnoStatus("fstat", errno);
    return size_t(st.st_blocks) * 512;
  }

 private:
  static constexpr size_t kBlock = 4096;
  const int fd_;
  uint8_t* const base_;
  const size_t size_;
};

class HostBackend final : public Backend {
 public:
  HostBackend() {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
    std::stringstream text;
    text << f.rdbuf();
    huge_pages_ = ShmemHugePagesAllowed(text.str());
  }
  std::string name() const override { return "host"; }
  bool huge_pages() const override { return huge_pages_; }

  absl::StatusOr<std::unique_ptr<Region>> Reserve(size_t bytes, const std::string& label) override {
    if (bytes == 0) return absl::InvalidArgumentError("reserve: bytes=0");
    bytes = RoundUp(bytes, kChunkGranularity);
    const int fd = memfd_create(label.c_str(), MFD_CLOEXEC);
    if (fd < 0) return ErrnoStatus("memfd_create", errno);
    if (ftruncate(fd, off_t(bytes)) != 0) {
      const int err = errno;
      close(fd);
      return ErrnoStatus("ftruncate", err);
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      close(fd);
      return ErrnoStatus("mmap", err);
    }
    // Huge pages where shmem THP allows them ("advise" or better): the attention walk over
    // shuffled pages pays TLB misses on 4 KiB pages. A no-op where it is "never".
    madvise(p, bytes, MADV_HUGEPAGE);
    return std::make_unique<HostRegion>(fd, static_cast<uint8_t*>(p), bytes);
  }

 private:
  bool huge_pages_ = false;
};

// A peer's view of a host region: the range is reserved PROT_NONE up front so pieces map
// at fixed offsets inside it.
class HostMapping final : public MappedRegion {
 public:
  HostMapping(uint8_t* base, size_t size) : base_(base), size_(size) {}
  ~HostMapping() override { munmap(base_, size_); }
  HostMapping(const HostMapping&) = delete;
  HostMapping& operator=(const HostMapping&) = delete;

  uint8_t* base() const override { return base_; }
  size_t size() const override { return size_; }

  absl::Status MapPieces(std::vector<SharedPiece> pieces) override {
    absl::Status status;
    for (const SharedPiece& p : pieces) {
      if (status.ok() && (p.offset + p.bytes > size_ || p.fd < 0)) {
        status = absl::InvalidArgumentError(absl::StrCat(
            "piece [", p.offset, ", +", p.bytes, ") lies outside a region of ", size_, " bytes"));
      }
      if (status.ok() &&
          mmap(base_ + p.offset, p.bytes, PROT_READ | PROT_WRITE,
               MAP_SHARED | MAP_FIXED | MAP_NORESERVE, p.fd, off_t(p.offset)) == MAP_FAILED) {
        status = ErrnoStatus("mmap(piece)", errno);
      }
      if (p.fd >= 0) close(p.fd);
    }
    return status;
  }

 private:
  uint8_t* const base_;
  const size_t size_;
};

}  // namespace

std::unique_ptr<Backend> NewHostBackend() { return std::make_unique<HostBackend>(); }

bool ShmemHugePagesAllowed(std::string_view shmem_enabled) {
  const size_t open = shmem_enabled.find('[');
  const size_t close = shmem_enabled.find(']', open);
  if (open == std::string_view::npos || close == std::string_view::npos) return false;
  const std::string_view mode = shmem_enabled.substr(open + 1, close - open - 1);
  return mode == "always" || mode == "within_size" || mode == "advise" || mode == "force";
}

absl::StatusOr<std::unique_ptr<MappedRegion>> ImportHostRegion(size_t size) {
  void* p = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return ErrnoStatus("mmap(reserve)", errno);
  return std::make_unique<HostMapping>(static_cast<uint8_t*>(p), size);
}

}  // namespace kvarena
