// Internal to kernels/cuda: the per-(dtype, KV storage, head_dim) attention entry points
// the launcher dispatches to, instantiated in attention_{f32,f16,bf16}.cu (K/V stored as
// the dtype) and attention_{int8,fp8}_{f32,f16,bf16}.cu so the units compile in parallel.
#ifndef KVARENA_KERNELS_CUDA_ATTENTION_LAUNCH_CUH_
#define KVARENA_KERNELS_CUDA_ATTENTION_LAUNCH_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention_plan.h"
#include "kernels/cuda/kernel_args.h"
#include "kernels/cuda/kv_quant.cuh"

namespace kvarena::gpu {

// CTAs of PagedAttentionKernel<T, KV, D> the current device runs at once.
template <typename T, typename KV, int D>
cudaError_t AttentionCtaSlots(int64_t* slots);

// Launches the attention kernel (grid from `a`) and, when a.splits > 1, the merge.
template <typename T, typename KV, int D>
cudaError_t LaunchAttention(const AttentionArgs& a, int batch, cudaStream_t stream);

#define KVARENA_ATTENTION_DECLARE(T, KV, D, EXTERN)                  \
  EXTERN template cudaError_t AttentionCtaSlots<T, KV, D>(int64_t*); \
  EXTERN template cudaError_t LaunchAttention<T, KV, D>(const AttentionArgs&, int, cudaStream_t);

#define KVARENA_ATTENTION_FOR_HEAD_DIMS(T, KV, EXTERN) \
  KVARENA_ATTENTION_DECLARE(T, KV, 64, EXTERN)         \
  KVARENA_ATTENTION_DECLARE(T, KV, 128, EXTERN)        \
  KVARENA_ATTENTION_DECLARE(T, KV, 256, EXTERN)

KVARENA_ATTENTION_FOR_HEAD_DIMS(float, float, extern)
KVARENA_ATTENTION_FOR_HEAD_DIMS(__half, __half, extern)
KVARENA_ATTENTION_FOR_HEAD_DIMS(__nv_bfloat16, __nv_bfloat16, extern)
KVARENA_ATTENTION_FOR_HEAD_DIMS(float, Int8Kv, extern)
KVARENA_ATTENTION_FOR_HEAD_DIMS(__half, Int8Kv, extern)
KVARENA_ATTENTION_FOR_HEAD_DIMS(__nv_bfloat16, Int8Kv, extern)
KVARENA_ATTENTION_FOR_HEAD_DIMS(float, Fp8Kv, extern)
KVARENA_ATTENTION_FOR_HEAD_DIMS(__half, Fp8Kv, extern)
KVARENA_ATTENTION_FOR_HEAD_DIMS(__nv_bfloat16, Fp8Kv, extern)

}  // namespace kvarena::gpu

#endif  // KVARENA_KERNELS_CUDA_ATTENTION_LAUNCH_CUH_
