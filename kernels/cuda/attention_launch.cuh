// Internal to kernels/cuda: the per-(dtype, head_dim) attention entry points the
// launcher dispatches to, instantiated in attention_{f32,f16,bf16}.cu so the three dtypes
// compile in parallel.
#ifndef KVARENA_KERNELS_CUDA_ATTENTION_LAUNCH_CUH_
#define KVARENA_KERNELS_CUDA_ATTENTION_LAUNCH_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention_plan.h"
#include "kernels/cuda/kernel_args.h"

namespace kvarena::gpu {

// CTAs of PagedAttentionKernel<T, D> the current device runs at once.
template <typename T, int D>
cudaError_t AttentionCtaSlots(int64_t* slots);

// Launches the attention kernel (grid from `a`) and, when a.splits > 1, the merge.
template <typename T, int D>
cudaError_t LaunchAttention(const AttentionArgs& a, int batch, cudaStream_t stream);

#define KVARENA_ATTENTION_DECLARE(T, D, EXTERN)                  \
  EXTERN template cudaError_t AttentionCtaSlots<T, D>(int64_t*); \
  EXTERN template cudaError_t LaunchAttention<T, D>(const AttentionArgs&, int, cudaStream_t);

#define KVARENA_ATTENTION_FOR_HEAD_DIMS(T, EXTERN) \
  KVARENA_ATTENTION_DECLARE(T, 64, EXTERN)         \
  KVARENA_ATTENTION_DECLARE(T, 128, EXTERN)        \
  KVARENA_ATTENTION_DECLARE(T, 256, EXTERN)

KVARENA_ATTENTION_FOR_HEAD_DIMS(float, extern)
KVARENA_ATTENTION_FOR_HEAD_DIMS(__half, extern)
KVARENA_ATTENTION_FOR_HEAD_DIMS(__nv_bfloat16, extern)

}  // namespace kvarena::gpu

#endif  // KVARENA_KERNELS_CUDA_ATTENTION_LAUNCH_CUH_
