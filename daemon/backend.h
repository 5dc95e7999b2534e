// The memory backend kvarenad serves from, chosen by --backend, with the kernels that
// run on its pages: host memory with the CPU kernels, or CUDA device 0 (VMM regions,
// legacy IPC fallback) with the CUDA kernels.
//
//   host  the host backend.
//   cuda  the CUDA backend; FAILED_PRECONDITION naming why when this build has no CUDA
//         or no CUDA device is usable (no driver, no GPU). Never falls back silently.
//   auto  cuda when this build has it and a device is usable, else host.
//
// Probing never aborts where no CUDA driver is installed: the CUDA runtime is loaded
// without libcuda, and the driver is reached only through its entry points.
#ifndef KVARENA_DAEMON_BACKEND_H_
#define KVARENA_DAEMON_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "arena/region.h"
#include "kernels/kv_kernels.h"

namespace kvarena {

struct ServingBackend {
  std::unique_ptr<Backend> backend;
  std::shared_ptr<KvKernels> kernels;  // null: the CPU kernels (StoreOptions default)
};

// INVALID_ARGUMENT for a name other than auto, host, cuda.
absl::StatusOr<ServingBackend> MakeServingBackend(const std::string& name);

}  // namespace kvarena

#endif  // KVARENA_DAEMON_BACKEND_H_
