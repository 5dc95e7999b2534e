// Definitions of the per-(dtype, KV storage, head_dim) attention entry points declared in
// attention_launch.cuh. Included only by the attention_*.cu units, each of which
// instantiates one (dtype, KV storage) pair for every head_dim.
#ifndef KVARENA_KERNELS_CUDA_ATTENTION_IMPL_CUH_
#define KVARENA_KERNELS_CUDA_ATTENTION_IMPL_CUH_

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/cuda/attention_kernel.cuh"
#include "kernels/cuda/attention_launch.cuh"
#include "kernels/cuda/attention_merge.cuh"
#include "kernels/cuda/kv_quant.cuh"

namespace kvarena::gpu {

template <typename T, typename KV, int D>
cudaError_t AttentionCtaSlots(int64_t* slots) {
  using C = AttentionConfig<KV, D>;
  constexpr int kCachedDevices = 64;
  static std::atomic<int64_t> cache[kCachedDevices];  // 0: not computed yet
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  if (dev < kCachedDevices && (*slots = cache[dev].load(std::memory_order_relaxed)) > 0) {
    return cudaSuccess;
  }
  int sms = 0, per_sm = 0;
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
      e != cudaSuccess) {
    return e;
  }
  if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &per_sm, PagedAttentionKernel<T, KV, D>, C::kThreads, C::kSmemBytes);
      e != cudaSuccess) {
    return e;
  }
  *slots = int64_t(sms) * (per_sm > 0 ? per_sm : 1);
  if (dev < kCachedDevices) cache[dev].store(*slots, std::memory_order_relaxed);
  return cudaSuccess;
}

template <typename T, typename KV, int D>
cudaError_t LaunchAttention(const AttentionArgs& a, int batch, cudaStream_t stream) {
  using C = AttentionConfig<KV, D>;
  PagedAttentionKernel<T, KV, D>
      <<<AttentionGrid(a, batch), C::kThreads, C::kSmemBytes, stream>>>(a);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess || a.splits == 1) return e;
  const int64_t rows = int64_t(batch) * a.num_q_heads * a.n;
  MergeSplitsKernel<T><<<unsigned(rows), kMergeThreads, MergeSmemBytes(a.splits), stream>>>(
      a.part_ml, a.part_acc, static_cast<T*>(a.out), a.splits, D);
  return cudaGetLastError();
}

}  // namespace kvarena::gpu

#endif  // KVARENA_KERNELS_CUDA_ATTENTION_IMPL_CUH_
