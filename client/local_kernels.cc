// LocalKernels (contract: local_kernels.h). The CUDA kernels are compiled in only where
// CMake found the toolkit (KVARENA_CLIENT_CUDA); cuda_kv_kernels.h is a plain C++ header.
#include "client/local_kernels.h"

#include "absl/strings/str_cat.h"
#if defined(KVARENA_CLIENT_CUDA)
#include "kernels/cuda/cuda_kv_kernels.h"
#endif

namespace kvarena::client_internal {
namespace {

absl::StatusOr<std::unique_ptr<KvKernels>> NewDeviceKernels(int device) {
#if defined(KVARENA_CLIENT_CUDA)
  return NewCudaKvKernels(device);
#else
  return absl::FailedPreconditionError(absl::StrCat(
      "the pool lives on CUDA device ", device,
      " but this client was built without CUDA: run attention through the daemon "
      "(attention()) or rebuild with the CUDA toolkit"));
#endif
}

}  // namespace

absl::StatusOr<KvKernels*> LocalKernels::For(const std::string& kind, int device) {
  std::lock_guard<std::mutex> lock(mu_);
  if (kind == "host_memfd") {
    if (cpu_ == nullptr) cpu_ = NewCpuKvKernels(num_threads_);
    return cpu_.get();
  }
  if (kind != "cuda_vmm" && kind != "cuda_ipc") {
    return absl::InvalidArgumentError(absl::StrCat("local kernels: unknown pool kind '", kind, "'"));
  }
  std::unique_ptr<KvKernels>& k = cuda_[device];
  if (k == nullptr) {
    absl::StatusOr<std::unique_ptr<KvKernels>> made = NewDeviceKernels(device);
    if (!made.ok()) {
      cuda_.erase(device);
      return absl::Status(made.status().code(),
                          absl::StrCat("local kernels for a ", kind, " pool: ", made.status().message()));
    }
    k = *std::move(made);
  }
  return k.get();
}

}  // namespace kvarena::client_internal
