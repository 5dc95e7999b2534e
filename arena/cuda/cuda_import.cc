// ImportCudaRegion (contract: cuda_region.h): a peer's view of a region exported by
// another process. cuda_vmm: a reserved range of the same size; each piece's fd is
// imported and mapped at its offset (a piece arriving for an offset already mapped
// replaces the stale mapping: the owner decommitted and recommitted there). cuda_ipc:
// cudaIpcOpenMemHandle once; there are no pieces.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "arena/cuda/cuda_driver.h"
#include "arena/cuda/cuda_region.h"
#include "arena/cuda/cuda_regions.h"
#include "base/status_macros.h"

namespace kvarena {
namespace cuda_internal {
namespace {

class CudaVmmMapping final : public MappedRegion {
 public:
  CudaVmmMapping(const VmmDevice& vmm, int device, CUdeviceptr base, size_t size)
      : vmm_(vmm), device_(device), base_(base), size_(size) {}
  ~CudaVmmMapping() override {
    ScopedDevice scope(device_);
    for (const auto& [offset, bytes] : mapped_) vmm_.api->MemUnmap(base_ + offset, bytes);
    vmm_.api->MemAddressFree(base_, size_);
  }
  CudaVmmMapping(const CudaVmmMapping&) = delete;
  CudaVmmMapping& operator=(const CudaVmmMapping&) = delete;

  uint8_t* base() const override { return reinterpret_cast<uint8_t*>(base_); }
  size_t size() const override { return size_; }
  int device() const override { return device_; }

  absl::Status MapPieces(std::vector<SharedPiece> pieces) override {
    ScopedDevice scope(device_);
    absl::Status status = scope.status();
    for (const SharedPiece& p : pieces) {
      if (status.ok()) status = MapPiece(p);
      if (p.fd >= 0) close(p.fd);
    }
    return status;
  }

 private:
  absl::Status MapPiece(const SharedPiece& p) {
    if (p.fd < 0 || p.bytes == 0 || p.offset > size_ || p.bytes > size_ - p.offset ||
        p.offset % vmm_.granule != 0 || p.bytes % vmm_.granule != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "piece [", p.offset, ", +", p.bytes, ") with fd ", p.fd, " does not fit a region of ",
          size_, " bytes in granules of ", vmm_.granule));
    }
    // Stale mappings under the new piece go first.
    for (auto it = mapped_.begin(); it != mapped_.end();) {
      if (it->first < p.offset + p.bytes && p.offset < it->first + it->second) {
        if (CUresult r = vmm_.api->MemUnmap(base_ + it->first, it->second); r != CUDA_SUCCESS) {
          return DriverStatus("cuMemUnmap", r);
        }
        it = mapped_.erase(it);
      } else {
        ++it;
      }
    }
    CUmemGenericAllocationHandle handle = 0;
    if (CUresult r = vmm_.api->MemImportFromShareableHandle(
            &handle, reinterpret_cast<void*>(static_cast<uintptr_t>(p.fd)),
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        r != CUDA_SUCCESS) {
      return DriverStatus("cuMemImportFromShareableHandle", r);
    }
    const CUdeviceptr at = base_ + p.offset;
    CUresult r = vmm_.api->MemMap(at, p.bytes, 0, handle, 0);
    vmm_.api->MemRelease(handle);  // the mapping holds the allocation from here on
    if (r != CUDA_SUCCESS) return DriverStatus("cuMemMap", r);
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = vmm_.dev;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (r = vmm_.api->MemSetAccess(at, p.bytes, &access, 1); r != CUDA_SUCCESS) {
      vmm_.api->MemUnmap(at, p.bytes);
      return DriverStatus("cuMemSetAccess", r);
    }
    mapped_[p.offset] = p.bytes;
    return absl::OkStatus();
  }

  const VmmDevice vmm_;
  const int device_;
  const CUdeviceptr base_;
  const size_t size_;
  std::map<size_t, size_t> mapped_;  // offset -> bytes
};

class CudaIpcMapping final : public MappedRegion {
 public:
  CudaIpcMapping(int device, void* base, size_t size)
      : device_(device), base_(static_cast<uint8_t*>(base)), size_(size) {}
  ~CudaIpcMapping() override {
    ScopedDevice scope(device_);
    cudaIpcCloseMemHandle(base_);
  }
  CudaIpcMapping(const CudaIpcMapping&) = delete;
  CudaIpcMapping& operator=(const CudaIpcMapping&) = delete;

  uint8_t* base() const override { return base_; }
  size_t size() const override { return size_; }
  int device() const override { return device_; }
  absl::Status MapPieces(std::vector<SharedPiece> pieces) override {
    for (const SharedPiece& p : pieces) {
      if (p.fd >= 0) close(p.fd);
    }
    if (!pieces.empty())
      return absl::InvalidArgumentError("cuda_ipc regions are mapped whole: no pieces");
    return absl::OkStatus();
  }

 private:
  const int device_;
  uint8_t* const base_;
  const size_t size_;
};

}  // namespace
}  // namespace cuda_internal

absl::StatusOr<std::unique_ptr<MappedRegion>> ImportCudaRegion(RegionKind kind, size_t size,
                                                               const std::string& ipc_handle) {
  using namespace cuda_internal;
  if (kind != RegionKind::kCudaVmm && kind != RegionKind::kCudaIpc) {
    return absl::InvalidArgumentError(
        absl::StrCat("import: '", RegionKindName(kind), "' is not a CUDA region kind"));
  }
  if (!CudaDevicePresent()) {
    return absl::FailedPreconditionError(absl::StrCat("import: regions of kind '",
                                                      RegionKindName(kind),
                                                      "' need a CUDA device; none is usable here"));
  }
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
    return RuntimeStatus("cudaGetDevice", e);
  ScopedDevice scope(device);
  KVARENA_RETURN_IF_ERROR(scope.status());

  if (kind == RegionKind::kCudaIpc) {
    cudaIpcMemHandle_t handle;
    if (ipc_handle.size() != sizeof(handle)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "import: cuda_ipc handle of ", ipc_handle.size(), " bytes; want ", sizeof(handle)));
    }
    std::memcpy(&handle, ipc_handle.data(), sizeof(handle));
    void* base = nullptr;
    if (cudaError_t e = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess);
        e != cudaSuccess) {
      cudaGetLastError();
      return RuntimeStatus("cudaIpcOpenMemHandle", e);
    }
    return std::make_unique<CudaIpcMapping>(device, base, size);
  }

  KVARENA_ASSIGN_OR_RETURN(const VmmDevice vmm, ProbeVmm(device));
  if (!vmm.supported) {
    return absl::FailedPreconditionError(absl::StrCat(
        "import: device ", device, " has no VMM with POSIX fd handles for a cuda_vmm region"));
  }
  if (size % vmm.granule != 0) {
    return absl::InvalidArgumentError(absl::StrCat("import: cuda_vmm region of ", size,
                                                   " bytes is not a multiple of the granularity ",
                                                   vmm.granule));
  }
  CUdeviceptr base = 0;
  if (CUresult r = vmm.api->MemAddressReserve(&base, size, vmm.granule, 0, 0); r != CUDA_SUCCESS) {
    return DriverStatus("cuMemAddressReserve", r);
  }
  return std::make_unique<CudaVmmMapping>(vmm, device, base, size);
}

}  // namespace kvarena
