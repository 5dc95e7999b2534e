// The CUDA backend: regions of device memory behind the Region interface (arena/region.h).
//
// VMM (the default): a region is a reserved device virtual range (cuMemAddressReserve);
// Commit maps physical memory into it (cuMemCreate + cuMemMap + cuMemSetAccess), created
// shareable as POSIX fds; Decommit unmaps and releases it. share_kind "cuda_vmm";
// ExportPieces gives one fd per mapped allocation, at its offset.
//   Commit rounds [offset, offset + bytes) outward to the device granularity (2 MiB on
//   current GPUs, kChunkGranularity) and counts commits per granule, so two chunks that
//   share a granule (chunks whose page size does not divide 2 MiB) keep it mapped until
//   both are decommitted. Commit / Decommit pair like a reference count: each Decommit
//   undoes one earlier Commit of the same range; decommitting an uncommitted range does
//   nothing. A failed Commit maps nothing. Decommit REQUIRES no kernel still using the
//   range (core frees chunks only once their pages are free). A peer that mapped an
//   allocation keeps its memory alive until it unmaps it too.
// Legacy (no VMM or no POSIX-fd handles on the device, or forced): one cudaMalloc of the
// whole reservation at Reserve; Commit / Decommit only check the range; ResidentBytes is
// the whole size; share_kind "cuda_ipc", ipc_handle() the cudaIpcMemHandle_t bytes, no
// pieces.
//
// Every call makes the device's primary context current on the calling thread first, so
// any daemon thread may use a region. CUDA errors become absl::Status here, naming the
// CUDA function and its error. Regions and the backend are thread-safe.
//
// Plain C++ header: no CUDA headers, so core/ and daemon/ may include it.
#ifndef KVARENA_ARENA_CUDA_CUDA_REGION_H_
#define KVARENA_ARENA_CUDA_CUDA_REGION_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "arena/region.h"

namespace kvarena {

// Whether a CUDA driver and at least one device are usable. Never crashes or prints;
// false where there is no driver (cudaGetDeviceCount fails) or no device.
bool CudaDevicePresent();

struct CudaBackendOptions {
  bool force_legacy_ipc = false;  // use the cudaMalloc + cudaIpc path even where VMM works
};

// A backend on CUDA device `device` (runtime ordinal). FAILED_PRECONDITION without a
// usable device, INVALID_ARGUMENT for an ordinal out of range.
absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device);
absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device,
                                                        const CudaBackendOptions& options);

// Whether `backend` (from NewCudaBackend) hands out VMM regions ("cuda_vmm") rather than
// legacy ones ("cuda_ipc").
bool CudaBackendUsesVmm(const Backend& backend);

// Maps a region another process exported with share_kind `kind` (kCudaVmm or kCudaIpc)
// on the calling thread's current CUDA device (cudaSetDevice first).
// FAILED_PRECONDITION without a usable device. ImportRegion (arena/import.cc) calls this.
absl::StatusOr<std::unique_ptr<MappedRegion>> ImportCudaRegion(RegionKind kind, size_t size,
                                                               const std::string& ipc_handle);

}  // namespace kvarena

#endif  // KVARENA_ARENA_CUDA_CUDA_REGION_H_
