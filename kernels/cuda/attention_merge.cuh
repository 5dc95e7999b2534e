// MergeSplitsKernel (internal to kernels/cuda): combines the split partials that
// PagedAttentionKernel leaves when a key range is split across CTAs (flash-decoding).
// Partial s of a row holds m_s (max base-2 score), l_s (sum of exp2(score - m_s)) and
// acc_s (sum of exp2(score - m_s) V); the row's output is
//   sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s,   M = max_s m_s.
// An empty split has m_s = -inf, l_s = 0 and weighs nothing.
#ifndef KVARENA_KERNELS_CUDA_ATTENTION_MERGE_CUH_
#define KVARENA_KERNELS_CUDA_ATTENTION_MERGE_CUH_

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_util.cuh"

namespace kvarena::gpu {

constexpr int kMergeThreads = 128;

// Dynamic shared memory of MergeSplitsKernel: weight [splits] then scratch [32] floats.
inline size_t MergeSmemBytes(int splits) { return (size_t(splits) + 32) * sizeof(float); }

// Reduces x over the CTA with op; every thread gets the result. scratch: [32] floats.
template <typename Op>
__device__ __forceinline__ float BlockReduce(float x, Op op, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = scratch[0];
  for (int w = 1; w < int(blockDim.x / 32); ++w) x = op(x, scratch[w]);
  return x;
}

// grid = (rows), rows = batch * num_q_heads * n; block = kMergeThreads;
// dynamic shared memory = MergeSmemBytes(splits).
template <typename T>
__global__ void __launch_bounds__(kMergeThreads)
    MergeSplitsKernel(const float2* part_ml,  // [rows][splits] {m, l}
                      const float* part_acc,  // [rows][splits][head_dim]
                      T* out,                 // [rows][head_dim]
                      int splits, int head_dim) {
  extern __shared__ float merge_smem[];
  float* weight = merge_smem;            // [splits]
  float* scratch = merge_smem + splits;  // [32]
  const int64_t row = blockIdx.x;
  const float2* ml = part_ml + row * splits;

  float mx = -INFINITY;
  for (int s = threadIdx.x; s < splits; s += blockDim.x) mx = fmaxf(mx, ml[s].x);
  mx = BlockReduce(
      mx, [](float x, float y) { return fmaxf(x, y); }, scratch);

  float sum = 0.0f;
  for (int s = threadIdx.x; s < splits; s += blockDim.x) {
    const float2 p = ml[s];
    const float w = p.x == -INFINITY ? 0.0f : exp2f(p.x - mx);
    weight[s] = w;
    sum += p.y * w;
  }
  sum = BlockReduce(
      sum, [](float x, float y) { return x + y; }, scratch);  // syncs: weight is visible

  const float inv = 1.0f / sum;
  const float* acc = part_acc + row * splits * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float val = 0.0f;
    for (int s = 0; s < splits; ++s) val = fmaf(acc[int64_t(s) * head_dim + d], weight[s], val);
    out[row * head_dim + d] = Storage<T>::FromFloat(val * inv);
  }
}

}  // namespace kvarena::gpu

#endif  // KVARENA_KERNELS_CUDA_ATTENTION_MERGE_CUH_
