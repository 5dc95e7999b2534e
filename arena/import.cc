// ImportRegion: picks the mapping for a region kind exported by another process.
#include "absl/strings/str_cat.h"
#include "arena/region.h"
#if defined(KVARENA_ARENA_CUDA)  // set by arena/cuda/CMakeLists.txt when the backend is built
#include "arena/cuda/cuda_region.h"
#endif

namespace kvarena {

absl::StatusOr<std::unique_ptr<MappedRegion>> ImportHostRegion(size_t size);

absl::StatusOr<std::unique_ptr<MappedRegion>> ImportRegion(const std::string& kind, size_t size,
                                                           const std::string& ipc_handle) {
  (void)ipc_handle;
  if (size == 0) return absl::InvalidArgumentError("import: region size 0");
  if (kind == "host_memfd") return ImportHostRegion(size);
#if defined(KVARENA_ARENA_CUDA)
  if (kind == "cuda_vmm" || kind == "cuda_ipc") return ImportCudaRegion(kind, size, ipc_handle);
#endif
  if (kind == "cuda_vmm" || kind == "cuda_ipc") {
    return absl::FailedPreconditionError(absl::StrCat(
        "import: regions of kind '", kind, "' need the CUDA backend, not built into this client"));
  }
  return absl::FailedPreconditionError(absl::StrCat("import: unknown region kind '", kind, "'"));
}

}  // namespace kvarena
