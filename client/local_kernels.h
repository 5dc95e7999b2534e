// LocalKernels: the kernels the local path (append_local, attention_local, get_kv_local)
// runs in this process over a mapped pool, picked by where the pool's pages live:
//   host memory  (kHostMemfd)            the CPU kernels (kernels/cpu);
//   CUDA device  (kCudaVmm, kCudaIpc)    the CUDA kernels on the device the pool is
//                mapped on (kernels/cuda NewCudaKvKernels), in a client built with CUDA.
// Each set is created on first use and lives as long as this object.
//
// The CUDA kernels take host tensors, as every local-path call does today: q/k/v and the
// block table are staged to the device and the output copied back, synchronously, per
// call. (A device-tensor API for workers whose activations already live on the GPU is
// future work.)
//
// SynchronizeAll waits for every kernel set created so far: the client runs it before any
// call that may free pages (kvarena/kv_cache_handle.h, "Page lifetime").
//
// Thread-safe.
#ifndef KVARENA_CLIENT_LOCAL_KERNELS_H_
#define KVARENA_CLIENT_LOCAL_KERNELS_H_

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "arena/region.h"
#include "kernels/kv_kernels.h"

namespace kvarena::client_internal {

class LocalKernels {
 public:
  // num_threads: the CPU kernels' threads (-1: one per core).
  explicit LocalKernels(int num_threads) : num_threads_(num_threads) {}
  LocalKernels(const LocalKernels&) = delete;
  LocalKernels& operator=(const LocalKernels&) = delete;

  // The kernels for a pool of region kind `kind` mapped on CUDA device `device` (ignored
  // for host memory). FAILED_PRECONDITION for a CUDA kind where this client has no CUDA
  // build or no usable device.
  absl::StatusOr<KvKernels*> For(RegionKind kind, int device);

  // KvKernels::Synchronize on every set created so far (none: OK at once); the first
  // failure, its code kept and the set named. Holds no lock while a set synchronizes.
  absl::Status SynchronizeAll();

  // Tests: every set created from now on is wrap(the real one).
  using Wrapper = std::function<std::unique_ptr<KvKernels>(std::unique_ptr<KvKernels>)>;
  void TEST_Wrap(Wrapper wrap);

 private:
  const int num_threads_;
  std::mutex mu_;
  Wrapper wrap_;                                    // guarded by mu_
  std::unique_ptr<KvKernels> cpu_;                  // guarded by mu_
  std::map<int, std::unique_ptr<KvKernels>> cuda_;  // by device; guarded by mu_
};

}  // namespace kvarena::client_internal

#endif  // KVARENA_CLIENT_LOCAL_KERNELS_H_
