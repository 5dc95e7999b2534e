// The few CUDA driver functions the CUDA backend needs (VMM: reserve, create, map, share),
// looked up at run time through cudaGetDriverEntryPointByVersion so nothing links
// -lcuda: binaries start, and run the host backend, where no driver is installed.
// Also the one place where CUDA errors become absl::Status (function name + error text),
// and ScopedDevice, which makes a device's primary context current on the calling
// thread. Internal to arena/cuda. The table is immutable once loaded: thread-safe.
#ifndef KVARENA_ARENA_CUDA_CUDA_DRIVER_H_
#define KVARENA_ARENA_CUDA_CUDA_DRIVER_H_

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvarena::cuda_internal {

struct DriverApi {
  PFN_cuGetErrorString_v6000 GetErrorString;
  PFN_cuDeviceGet_v2000 DeviceGet;
  PFN_cuDeviceGetAttribute_v2000 DeviceGetAttribute;
  PFN_cuMemGetAllocationGranularity_v10020 MemGetAllocationGranularity;
  PFN_cuMemAddressReserve_v10020 MemAddressReserve;
  PFN_cuMemAddressFree_v10020 MemAddressFree;
  PFN_cuMemCreate_v10020 MemCreate;
  PFN_cuMemRelease_v10020 MemRelease;
  PFN_cuMemMap_v10020 MemMap;
  PFN_cuMemUnmap_v10020 MemUnmap;
  PFN_cuMemSetAccess_v10020 MemSetAccess;
  PFN_cuMemExportToShareableHandle_v10020 MemExportToShareableHandle;
  PFN_cuMemImportFromShareableHandle_v10020 MemImportFromShareableHandle;
};

// The table, loaded on first use; an error names the entry point the driver lacks.
absl::StatusOr<const DriverApi*> Driver();

// `fn: <error name>: <error string>`. Out of memory maps to RESOURCE_EXHAUSTED, missing
// support to FAILED_PRECONDITION, everything else to INTERNAL. OK for cudaSuccess.
absl::Status RuntimeStatus(const char* fn, cudaError_t err);
absl::Status DriverStatus(const char* fn, CUresult err);

// Makes `device`'s primary context current on this thread for the scope (cudaSetDevice
// initialises it), and restores the previous device after. Check status() first.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  int device_ = -1;
  absl::Status status_;
};

}  // namespace kvarena::cuda_internal

#endif  // KVARENA_ARENA_CUDA_CUDA_DRIVER_H_
