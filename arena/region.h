// Memory regions that hold KV pools, behind one small interface with a host (memfd) and,
// later, a CUDA (VMM / legacy IPC) implementation.
//
// A Region is one contiguous virtual range reserved up front; physical memory is
// committed chunk by chunk as pages are used and decommitted (given back to the system)
// when chunks empty, so the range's address — and therefore every page id — never moves.
//
// Thread-safety: a Region's methods may be called concurrently for disjoint ranges; a
// Backend is safe for concurrent use.
#ifndef KVARENA_ARENA_REGION_H_
#define KVARENA_ARENA_REGION_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace kvarena {

// How a peer maps a region. The wire spells it as a string (RegionKindName: "host_memfd",
// "cuda_vmm", "cuda_ipc"; Region::share_kind(), RegionInfo.kind); code compares this.
enum class RegionKind : uint8_t { kHostMemfd, kCudaVmm, kCudaIpc };

inline const char* RegionKindName(RegionKind kind) {
  switch (kind) {
    case RegionKind::kHostMemfd:
      return "host_memfd";
    case RegionKind::kCudaVmm:
      return "cuda_vmm";
    case RegionKind::kCudaIpc:
      return "cuda_ipc";
  }
  return "unknown";
}

// The kind `name` spells; nullopt for a name no backend exports.
inline std::optional<RegionKind> ParseRegionKind(std::string_view name) {
  for (RegionKind k : {RegionKind::kHostMemfd, RegionKind::kCudaVmm, RegionKind::kCudaIpc}) {
    if (name == RegionKindName(k)) return k;
  }
  return std::nullopt;
}

// Where the pages of the backend named `backend` (Backend::name()) live, as events and
// handles name it: "cpu" for "host", "cuda:0" for "cuda", any other name as it is.
inline std::string BackendDevice(std::string_view backend) {
  if (backend == "host") return "cpu";
  if (backend == "cuda") return "cuda:0";
  return std::string(backend);
}

// Granularity of commit/decommit: CUDA VMM's minimum on current GPUs, used by every backend
// so chunk sizes agree.
inline constexpr size_t kChunkGranularity = size_t{2} << 20;

// One piece of a shared region: bytes [offset, offset + bytes) reachable through fd.
// generation names the memory behind it: a region gives every piece it maps a larger
// number than any before, so a peer that mapped a piece of the same offset with a smaller
// one holds stale memory (the owner decommitted and recommitted there). Starts at 1.
struct SharedPiece {
  size_t offset = 0;
  size_t bytes = 0;
  int fd = -1;
  uint64_t generation = 1;
};

// OUT_OF_RANGE unless [offset, offset + bytes) lies inside a region of `size` bytes
// (overflow-safe); `what` names the operation. Every Region checks its ranges with this.
// Inline: the CUDA regions (a library kvarena_arena itself links) use it too.
inline absl::Status CheckRegionRange(const char* what, size_t offset, size_t bytes, size_t size) {
  if (offset > size || bytes > size - offset) {
    return absl::OutOfRangeError(absl::StrCat(what, ": [", offset, ", +", bytes,
                                              ") lies outside a region of ", size, " bytes"));
  }
  return absl::OkStatus();
}

class Region {
 public:
  virtual ~Region() = default;

  // Base of the reserved range; valid for the region's lifetime.
  virtual uint8_t* base() const = 0;
  virtual size_t size() const = 0;

  // Makes [offset, offset + bytes) usable. REQUIRES: inside the range.
  virtual absl::Status Commit(size_t offset, size_t bytes) = 0;
  // Gives [offset, offset + bytes) back to the system; later reads see zeros or garbage.
  virtual absl::Status Decommit(size_t offset, size_t bytes) = 0;
  // Faults in committed [offset, offset + bytes) ahead of the first write, leaving its
  // bytes as they are (safe while others write the range). A no-op where commit is
  // already physical (CUDA). REQUIRES: inside the range, committed.
  virtual absl::Status Prefault(size_t offset, size_t bytes) {
    return CheckRegionRange("prefault", offset, bytes, size());
  }

  // Bytes of physical memory the region holds now, as the system reports it.
  virtual absl::StatusOr<size_t> ResidentBytes() const = 0;

  // For sharing with another process: the host backend's memfd, -1 where not shareable.
  virtual int fd() const { return -1; }

  // How a peer maps this region: a RegionKindName ("host_memfd", "cuda_vmm", "cuda_ipc").
  virtual std::string share_kind() const = 0;
  // The pieces a peer maps to see [0, size()), each with a new fd the caller owns (host:
  // one piece, the memfd; CUDA VMM: one per committed allocation). Empty for cuda_ipc.
  absl::StatusOr<std::vector<SharedPiece>> ExportPieces() const {
    return ExportPiecesAfter(0, 0, SIZE_MAX, nullptr);
  }
  // One page of the pieces whose generation is greater than `generation` (what a peer
  // that has mapped everything up to it lacks: memory committed since), sorted by
  // generation, oldest first: without the first `first` of them, at most `max_pieces`.
  // *total (when given) is how many pieces are after `generation` in all. Creates fds
  // (each owned by the caller) for the returned pieces only (arena/piece_page.h).
  virtual absl::StatusOr<std::vector<SharedPiece>> ExportPiecesAfter(uint64_t generation,
                                                                     size_t first,
                                                                     size_t max_pieces,
                                                                     size_t* total) const = 0;
  // cuda_ipc only: the cudaIpcMemHandle_t bytes.
  virtual std::string ipc_handle() const { return ""; }
};

// A region as another process sees it: the same size, so an offset (a page id times the
// page bytes) means the same place. Not thread-safe; owned by one client.
class MappedRegion {
 public:
  virtual ~MappedRegion() = default;
  virtual uint8_t* base() const = 0;
  virtual size_t size() const = 0;
  // The CUDA device (runtime ordinal) base() is an address on; -1 for host memory.
  virtual int device() const { return -1; }
  // Maps pieces received from the owner (they may arrive over time, as the owner grows).
  // Takes ownership of each piece's fd.
  virtual absl::Status MapPieces(std::vector<SharedPiece> pieces) = 0;
};

// Maps a region exported by another process. kind is Region::share_kind() there.
absl::StatusOr<std::unique_ptr<MappedRegion>> ImportRegion(const std::string& kind, size_t size,
                                                           const std::string& ipc_handle);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "host", "cuda"
  // Reserves a range of `bytes` (rounded up to kChunkGranularity) with nothing committed.
  virtual absl::StatusOr<std::unique_ptr<Region>> Reserve(size_t bytes,
                                                          const std::string& label) = 0;
  // Whether the system backs this backend's regions with huge pages (host: shared-memory
  // transparent huge pages allowed for MADV_HUGEPAGE); false where it does not say.
  virtual bool huge_pages() const { return false; }
};

// The host backend: memfd + MAP_NORESERVE, decommit by FALLOC_FL_PUNCH_HOLE.
std::unique_ptr<Backend> NewHostBackend();

// Whether the mode selected in a /sys/kernel/mm/transparent_hugepage/shmem_enabled text
// ("always within_size [advise] never deny force") gives a MADV_HUGEPAGE mapping huge
// pages: always, within_size, advise or force.
bool ShmemHugePagesAllowed(std::string_view shmem_enabled);

}  // namespace kvarena

#endif  // KVARENA_ARENA_REGION_H_
