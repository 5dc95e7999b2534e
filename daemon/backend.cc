// --backend (contract: backend.h). The CUDA pieces are compiled in only where CMake
// found the toolkit (KVARENA_DAEMON_CUDA); elsewhere cuda is refused by name.
#include "daemon/backend.h"

#include <utility>

#include "absl/strings/str_cat.h"
#if defined(KVARENA_DAEMON_CUDA)
#include "arena/cuda/cuda_region.h"
#include "kernels/cuda/cuda_kv_kernels.h"
#endif

namespace kvarena {
namespace {

#if defined(KVARENA_DAEMON_CUDA)
constexpr int kCudaDevice = 0;
#endif

absl::Status CudaRefused(absl::string_view why) {
  return absl::FailedPreconditionError(
      absl::StrCat("--backend=cuda: ", why, "; use --backend=host (or auto)"));
}

#if defined(KVARENA_DAEMON_CUDA)
absl::StatusOr<ServingBackend> MakeCudaBackend() {
  // Without a driver or a GPU: "cuda backend: no usable CUDA device (cudaGetDeviceCount: ...)".
  absl::StatusOr<std::unique_ptr<Backend>> backend = NewCudaBackend(kCudaDevice);
  if (!backend.ok()) return CudaRefused(backend.status().message());
  absl::StatusOr<std::unique_ptr<KvKernels>> kernels = NewCudaKvKernels(kCudaDevice);
  if (!kernels.ok()) return CudaRefused(kernels.status().message());
  return ServingBackend{*std::move(backend), std::shared_ptr<KvKernels>(*std::move(kernels))};
}
bool CudaUsable() { return CudaDevicePresent(); }
#else
absl::StatusOr<ServingBackend> MakeCudaBackend() {
  return CudaRefused(
      "this kvarenad was built without CUDA (no nvcc at build time, or -DKVARENA_CUDA=OFF)");
}
bool CudaUsable() { return false; }
#endif

}  // namespace

absl::StatusOr<ServingBackend> MakeServingBackend(const std::string& name) {
  if (name == "host") return ServingBackend{NewHostBackend(), nullptr};
  if (name == "cuda") return MakeCudaBackend();
  if (name == "auto") {
    if (CudaUsable()) return MakeCudaBackend();
    return ServingBackend{NewHostBackend(), nullptr};
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--backend=", name, ": must be one of auto, host, cuda"));
}

}  // namespace kvarena
