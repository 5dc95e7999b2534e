// NewCudaKvKernels: core's KvKernels interface (kernels/kv_kernels.h) over the CUDA
// kernels, for pools whose pages live on a CUDA device (the CUDA arena backend).
//
// Each call stages the host tensors (k, v, q), the view's host block table and its static
// scales (fp8_e4m3) to the device on a stream of its own, runs the kernel, copies the
// outputs back and waits: synchronous like the CPU kernels, and thread-safe (concurrent
// calls use different streams and buffers). Takes K/V stored as the activation dtype,
// int8 or fp8_e4m3 (kv_kernels_cuda.h), head_dim 64, 128 or 256. view.pool_base must be
// a device address on `device`. Device errors come back as INTERNAL naming the call and
// the CUDA error.
//
// Plain C++ header: no CUDA headers, so core/ and daemon/ may include it.
#ifndef KVARENA_KERNELS_CUDA_CUDA_KV_KERNELS_H_
#define KVARENA_KERNELS_CUDA_CUDA_KV_KERNELS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/kv_kernels.h"

namespace kvarena {

// FAILED_PRECONDITION without a usable CUDA device; INVALID_ARGUMENT for an ordinal out
// of range. Sets the device's default memory pool to keep up to 256 MiB cached.
absl::StatusOr<std::unique_ptr<KvKernels>> NewCudaKvKernels(int device);

}  // namespace kvarena

#endif  // KVARENA_KERNELS_CUDA_CUDA_KV_KERNELS_H_
