// The CUDA backend (contract: cuda_region.h): device presence, the legacy cudaMalloc +
// cudaIpc region, and the backend that picks VMM or legacy per device.
#include "arena/cuda/cuda_region.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "arena/cuda/cuda_driver.h"
#include "arena/cuda/cuda_regions.h"
#include "base/status_macros.h"
#include "kvarena/paged_kv.h"

namespace kvarena {

bool CudaDevicePresent() {
  int count = 0;
  const bool present = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();  // clear the error a driverless machine leaves behind
  return present;
}

namespace cuda_internal {
namespace {

class CudaIpcRegion final : public Region {
 public:
  CudaIpcRegion(int device, void* base, size_t size, std::string handle)
      : device_(device),
        base_(static_cast<uint8_t*>(base)),
        size_(size),
        handle_(std::move(handle)) {}
  ~CudaIpcRegion() override {
    ScopedDevice scope(device_);
    cudaFree(base_);
  }
  CudaIpcRegion(const CudaIpcRegion&) = delete;
  CudaIpcRegion& operator=(const CudaIpcRegion&) = delete;

  uint8_t* base() const override { return base_; }
  size_t size() const override { return size_; }
  // The whole reservation was allocated at Reserve: nothing to map or give back.
  absl::Status Commit(size_t offset, size_t bytes) override {
    return CheckRange("commit", offset, bytes);
  }
  absl::Status Decommit(size_t offset, size_t bytes) override {
    return CheckRange("decommit", offset, bytes);
  }
  absl::StatusOr<size_t> ResidentBytes() const override { return size_; }
  std::string share_kind() const override { return RegionKindName(RegionKind::kCudaIpc); }
  // Mapped whole through ipc_handle(): no pieces.
  absl::StatusOr<std::vector<SharedPiece>> ExportPiecesAfter(uint64_t, size_t, size_t,
                                                             size_t* total) const override {
    if (total != nullptr) *total = 0;
    return std::vector<SharedPiece>{};
  }
  std::string ipc_handle() const override { return handle_; }

 private:
  absl::Status CheckRange(const char* what, size_t offset, size_t bytes) const {
    return CheckRegionRange(what, offset, bytes, size_);
  }

  const int device_;
  uint8_t* const base_;
  const size_t size_;
  const std::string handle_;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, VmmDevice vmm, bool use_vmm)
      : device_(device), vmm_(vmm), use_vmm_(use_vmm) {}

  std::string name() const override { return "cuda"; }
  bool uses_vmm() const { return use_vmm_; }

  absl::StatusOr<std::unique_ptr<Region>> Reserve(size_t bytes, const std::string& label) override {
    (void)label;  // device allocations carry no name
    if (bytes == 0) return absl::InvalidArgumentError("reserve: bytes=0");
    ScopedDevice scope(device_);
    KVARENA_RETURN_IF_ERROR(scope.status());
    return use_vmm_ ? NewVmmRegion(vmm_, device_, bytes) : NewIpcRegion(device_, bytes);
  }

 private:
  const int device_;
  const VmmDevice vmm_;
  const bool use_vmm_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Region>> NewIpcRegion(int device, size_t bytes) {
  const size_t size = RoundUp(bytes, kChunkGranularity);
  void* base = nullptr;
  if (cudaError_t e = cudaMalloc(&base, size); e != cudaSuccess) {
    cudaGetLastError();
    return RuntimeStatus("cudaMalloc", e);
  }
  cudaIpcMemHandle_t handle;
  if (cudaError_t e = cudaIpcGetMemHandle(&handle, base); e != cudaSuccess) {
    cudaFree(base);
    return RuntimeStatus("cudaIpcGetMemHandle", e);
  }
  return std::make_unique<CudaIpcRegion>(
      device, base, size, std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)));
}

}  // namespace cuda_internal

absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device) {
  return NewCudaBackend(device, CudaBackendOptions{});
}

absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device,
                                                        const CudaBackendOptions& options) {
  using namespace cuda_internal;
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("cuda backend: no usable CUDA device (cudaGetDeviceCount: ",
                     e == cudaSuccess ? "0 devices" : cudaGetErrorString(e), ")"));
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: device ", device, " out of range; this machine has ", count));
  }
  ScopedDevice scope(device);
  KVARENA_RETURN_IF_ERROR(scope.status());
  VmmDevice vmm;
  if (!options.force_legacy_ipc) {
    absl::StatusOr<VmmDevice> probed = ProbeVmm(device);
    if (probed.ok()) {
      vmm = *probed;
    } else if (!absl::IsFailedPrecondition(probed.status())) {
      return probed.status();
    }  // else a driver without the VMM entry points: legacy
  }
  return std::make_unique<CudaBackend>(device, vmm, vmm.supported);
}

bool CudaBackendUsesVmm(const Backend& backend) {
  const auto* cuda = dynamic_cast<const cuda_internal::CudaBackend*>(&backend);
  return cuda != nullptr && cuda->uses_vmm();
}

}  // namespace kvarena
