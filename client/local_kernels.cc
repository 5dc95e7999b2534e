// LocalKernels (contract: local_kernels.h). The CUDA kernels are compiled in only where
// CMake found the toolkit (KVARENA_CLIENT_CUDA); cuda_kv_kernels.h is a plain C++ header.
#include "client/local_kernels.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/refusal.h"
#if defined(KVARENA_CLIENT_CUDA)
#include "kernels/cuda/cuda_kv_kernels.h"
#endif

namespace kvarena::client_internal {
namespace {

absl::StatusOr<std::unique_ptr<KvKernels>> NewDeviceKernels(int device) {
#if defined(KVARENA_CLIENT_CUDA)
  return NewCudaKvKernels(device);
#else
  return absl::FailedPreconditionError(
      absl::StrCat("the pool lives on CUDA device ", device,
                   " but this client was built without CUDA: run attention through the daemon "
                   "(attention()) or rebuild with the CUDA toolkit"));
#endif
}

}  // namespace

absl::StatusOr<KvKernels*> LocalKernels::For(RegionKind kind, int device) {
  std::lock_guard<std::mutex> lock(mu_);
  if (kind == RegionKind::kHostMemfd) {
    if (cpu_ == nullptr) {
      cpu_ = NewCpuKvKernels(num_threads_);
      if (wrap_) cpu_ = wrap_(std::move(cpu_));
    }
    return cpu_.get();
  }
  std::unique_ptr<KvKernels>& k = cuda_[device];
  if (k == nullptr) {
    absl::StatusOr<std::unique_ptr<KvKernels>> made = NewDeviceKernels(device);
    if (!made.ok()) {
      cuda_.erase(device);
      return Annotated(made.status(),
                       absl::StrCat("local kernels for a ", RegionKindName(kind), " pool: "));
    }
    k = *std::move(made);
    if (wrap_) k = wrap_(std::move(k));
  }
  return k.get();
}

absl::Status LocalKernels::SynchronizeAll() {
  std::vector<KvKernels*> sets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cpu_ != nullptr) sets.push_back(cpu_.get());
    for (const auto& [device, k] : cuda_) sets.push_back(k.get());
  }
  for (KvKernels* k : sets) {  // a set lives as long as this object once created
    if (absl::Status s = k->Synchronize(); !s.ok()) {
      return Annotated(s, absl::StrCat("synchronizing the ", k->name(), " local kernels: "));
    }
  }
  return absl::OkStatus();
}

void LocalKernels::TEST_Wrap(Wrapper wrap) {
  std::lock_guard<std::mutex> lock(mu_);
  wrap_ = std::move(wrap);
}

}  // namespace kvarena::client_internal
