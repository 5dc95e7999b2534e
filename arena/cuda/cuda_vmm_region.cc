// VMM regions: a reserved device virtual range; Commit maps shareable physical
// allocations into it, Decommit unmaps and releases them (contract: cuda_region.h).
//
// Bookkeeping: refs_[g] counts the Commits covering granule g; allocs_ maps the first
// granule of each live allocation to its handle and length. A Commit creates one
// allocation per run of unmapped granules it covers; an allocation is unmapped and
// released once every granule in it has dropped to zero (cuMemUnmap takes whole
// mappings only).
#include <unistd.h>

#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "arena/cuda/cuda_driver.h"
#include "arena/cuda/cuda_regions.h"
#include "arena/piece_page.h"
#include "base/status_macros.h"
#include "kvarena/paged_kv.h"

namespace kvarena::cuda_internal {
namespace {

struct Alloc {
  size_t granules = 0;
  CUmemGenericAllocationHandle handle = 0;
  uint64_t generation = 0;  // SharedPiece::generation: larger for every new allocation
};

class CudaVmmRegion final : public Region {
 public:
  CudaVmmRegion(const DriverApi* api, int device, CUdevice dev, CUdeviceptr base, size_t size,
                size_t granule)
      : api_(api),
        device_(device),
        dev_(dev),
        base_(base),
        size_(size),
        granule_(granule),
        refs_(size / granule, 0) {}

  ~CudaVmmRegion() override {
    ScopedDevice scope(device_);
    for (const auto& [first, alloc] : allocs_) Unmap(first, alloc).IgnoreError();  // nobody to tell
    api_->MemAddressFree(base_, size_);
  }
  CudaVmmRegion(const CudaVmmRegion&) = delete;
  CudaVmmRegion& operator=(const CudaVmmRegion&) = delete;

  uint8_t* base() const override { return reinterpret_cast<uint8_t*>(base_); }
  size_t size() const override { return size_; }
  std::string share_kind() const override { return RegionKindName(RegionKind::kCudaVmm); }

  absl::Status Commit(size_t offset, size_t bytes) override {
    if (absl::Status s = CheckRange("commit", offset, bytes); !s.ok() || bytes == 0) return s;
    ScopedDevice scope(device_);
    KVARENA_RETURN_IF_ERROR(scope.status());
    const size_t begin = offset / granule_, end = CeilDiv(offset + bytes, granule_);
    absl::MutexLock lock(&mu_);
    std::vector<size_t> created;  // first granules of this call's allocations
    for (size_t g = begin; g < end;) {
      if (refs_[g] > 0) {
        ++g;
        continue;
      }
      size_t run = 1;
      while (g + run < end && refs_[g + run] == 0) ++run;
      absl::StatusOr<Alloc> alloc = MapNew(g, run);
      if (!alloc.ok()) {  // undo this call: nothing stays mapped
        for (size_t first : created) {
          Unmap(first, allocs_[first]).IgnoreError();  // the Commit error is the news
          mapped_ -= allocs_[first].granules * granule_;
          allocs_.erase(first);
        }
        return alloc.status();
      }
      allocs_[g] = *alloc;
      ++next_generation_;
      mapped_ += run * granule_;
      created.push_back(g);
      g += run;
    }
    for (size_t g = begin; g < end; ++g) ++refs_[g];
    return absl::OkStatus();
  }

  absl::Status Decommit(size_t offset, size_t bytes) override {
    if (absl::Status s = CheckRange("decommit", offset, bytes); !s.ok() || bytes == 0) return s;
    ScopedDevice scope(device_);
    KVARENA_RETURN_IF_ERROR(scope.status());
    const size_t begin = offset / granule_, end = CeilDiv(offset + bytes, granule_);
    absl::MutexLock lock(&mu_);
    for (size_t g = begin; g < end; ++g) {
      if (refs_[g] > 0) --refs_[g];
    }
    // Allocations overlapping [begin, end) whose granules are all free go.
    auto it = allocs_.upper_bound(begin);
    if (it != allocs_.begin()) --it;
    absl::Status status;
    while (it != allocs_.end() && it->first < end) {
      const size_t first = it->first, count = it->second.granules;
      bool free = true;
      for (size_t g = first; g < first + count && free; ++g) free = refs_[g] == 0;
      if (!free) {
        ++it;
        continue;
      }
      if (absl::Status s = Unmap(first, it->second); !s.ok() && status.ok()) status = s;
      mapped_ -= count * granule_;
      it = allocs_.erase(it);
    }
    return status;
  }

  absl::StatusOr<size_t> ResidentBytes() const override {
    absl::MutexLock lock(&mu_);
    return mapped_;
  }

  // Lists every allocation, picks the page, and exports only the page's allocations.
  absl::StatusOr<std::vector<SharedPiece>> ExportPiecesAfter(uint64_t generation, size_t first,
                                                             size_t max_pieces,
                                                             size_t* total) const override {
    ScopedDevice scope(device_);
    KVARENA_RETURN_IF_ERROR(scope.status());
    absl::MutexLock lock(&mu_);
    std::vector<PieceRef> refs;
    refs.reserve(allocs_.size());
    for (const auto& [first_granule, alloc] : allocs_) {
      refs.push_back({alloc.generation, first_granule * granule_, alloc.granules * granule_});
    }
    std::vector<SharedPiece> pieces;
    for (const PieceRef& r : PageOfPieces(std::move(refs), generation, first, max_pieces, total)) {
      int fd = -1;
      const CUresult e = api_->MemExportToShareableHandle(
          &fd, allocs_.at(r.offset / granule_).handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      if (e != CUDA_SUCCESS) {
        for (const SharedPiece& p : pieces) close(p.fd);
        return DriverStatus("cuMemExportToShareableHandle", e);
      }
      pieces.push_back(SharedPiece{r.offset, r.bytes, fd, r.generation});
    }
    return pieces;
  }

 private:
  absl::Status CheckRange(const char* what, size_t offset, size_t bytes) const {
    return CheckRegionRange(what, offset, bytes, size_);
  }

  // Creates, maps and opens `count` granules at granule `first`.
  absl::StatusOr<Alloc> MapNew(size_t first, size_t count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev_;
    Alloc alloc{count, 0, next_generation_};
    const size_t bytes = count * granule_;
    const CUdeviceptr at = base_ + first * granule_;
    if (CUresult r = api_->MemCreate(&alloc.handle, bytes, &prop, 0); r != CUDA_SUCCESS) {
      return DriverStatus("cuMemCreate", r);
    }
    if (CUresult r = api_->MemMap(at, bytes, 0, alloc.handle, 0); r != CUDA_SUCCESS) {
      api_->MemRelease(alloc.handle);
      return DriverStatus("cuMemMap", r);
    }
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = dev_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (CUresult r = api_->MemSetAccess(at, bytes, &access, 1); r != CUDA_SUCCESS) {
      api_->MemUnmap(at, bytes);
      api_->MemRelease(alloc.handle);
      return DriverStatus("cuMemSetAccess", r);
    }
    return alloc;
  }

  absl::Status Unmap(size_t first, const Alloc& alloc) const {
    absl::Status s = DriverStatus(
        "cuMemUnmap", api_->MemUnmap(base_ + first * granule_, alloc.granules * granule_));
    absl::Status r = DriverStatus("cuMemRelease", api_->MemRelease(alloc.handle));
    return s.ok() ? r : s;
  }

  const DriverApi* const api_;
  const int device_;
  const CUdevice dev_;
  const CUdeviceptr base_;
  const size_t size_;
  const size_t granule_;
  mutable absl::Mutex mu_;
  std::vector<uint32_t> refs_ ABSL_GUARDED_BY(mu_);
  std::map<size_t, Alloc> allocs_ ABSL_GUARDED_BY(mu_);
  size_t mapped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace

absl::StatusOr<VmmDevice> ProbeVmm(int device) {
  KVARENA_ASSIGN_OR_RETURN(const DriverApi* api, Driver());
  VmmDevice out;
  out.api = api;
  if (CUresult r = out.api->DeviceGet(&out.dev, device); r != CUDA_SUCCESS) {
    return DriverStatus("cuDeviceGet", r);
  }
  int vmm = 0, posix_fd = 0;
  if (CUresult r = out.api->DeviceGetAttribute(
          &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, out.dev);
      r != CUDA_SUCCESS) {
    return DriverStatus("cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)", r);
  }
  if (CUresult r = out.api->DeviceGetAttribute(
          &posix_fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, out.dev);
      r != CUDA_SUCCESS) {
    return DriverStatus("cuDeviceGetAttribute(HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)", r);
  }
  out.supported = vmm != 0 && posix_fd != 0;
  if (!out.supported) return out;
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = out.dev;
  if (CUresult r = out.api->MemGetAllocationGranularity(&out.granule, &prop,
                                                        CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      r != CUDA_SUCCESS) {
    return DriverStatus("cuMemGetAllocationGranularity", r);
  }
  if (out.granule == 0 || std::lcm(out.granule, kChunkGranularity) > 16 * kChunkGranularity) {
    return absl::FailedPreconditionError(absl::StrCat("cuda: VMM granularity ", out.granule,
                                                      " does not fit chunks of ", kChunkGranularity,
                                                      " bytes"));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Region>> NewVmmRegion(const VmmDevice& vmm, int device,
                                                     size_t bytes) {
  const size_t unit = std::lcm(vmm.granule, kChunkGranularity);
  const size_t size = RoundUp(bytes, unit);
  CUdeviceptr base = 0;
  if (CUresult r = vmm.api->MemAddressReserve(&base, size, vmm.granule, 0, 0); r != CUDA_SUCCESS) {
    return DriverStatus("cuMemAddressReserve", r);
  }
  return std::make_unique<CudaVmmRegion>(vmm.api, device, vmm.dev, base, size, vmm.granule);
}

}  // namespace kvarena::cuda_internal
