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
  const std::optional<RegionKind> parsed = ParseRegionKind(kind);
  if (!parsed.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("import: unknown region kind '", kind, "'"));
  }
  if (*parsed == RegionKind::kHostMemfd) return ImportHostRegion(size);
#if defined(KVARENA_ARENA_CUDA)
  return ImportCudaRegion(*parsed, size, ipc_handle);
#else
  return absl::FailedPreconditionError(absl::StrCat(
      "import: regions of kind '", kind, "' need the CUDA backend, not built into this client"));
#endif
}

}  // namespace kvarena
