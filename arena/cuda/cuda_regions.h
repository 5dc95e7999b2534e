// Internal to arena/cuda: the two region kinds behind NewCudaBackend (cuda_region.h).
#ifndef KVARENA_ARENA_CUDA_CUDA_REGIONS_H_
#define KVARENA_ARENA_CUDA_CUDA_REGIONS_H_

#include <cuda.h>

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "arena/cuda/cuda_driver.h"
#include "arena/region.h"

namespace kvarena::cuda_internal {

// What VMM needs to know about one device.
struct VmmDevice {
  const DriverApi* api = nullptr;
  CUdevice dev = 0;
  bool supported = false;  // VMM and POSIX-fd shareable handles both supported
  size_t granule = 0;      // minimum allocation granularity (when supported)
};

// REQUIRES: `device`'s primary context is current (ScopedDevice).
absl::StatusOr<VmmDevice> ProbeVmm(int device);

// A VMM region of at least `bytes` (rounded up to the granularity and kChunkGranularity),
// nothing committed. REQUIRES: vmm.supported; `device`'s context current.
absl::StatusOr<std::unique_ptr<Region>> NewVmmRegion(const VmmDevice& vmm, int device,
                                                     size_t bytes);

// A legacy region: `bytes` (rounded up to kChunkGranularity) cudaMalloc'ed at once.
// REQUIRES: `device`'s context current.
absl::StatusOr<std::unique_ptr<Region>> NewIpcRegion(int device, size_t bytes);

}  // namespace kvarena::cuda_internal

#endif  // KVARENA_ARENA_CUDA_CUDA_REGIONS_H_
