// AppendKvKernel / GatherKvKernel (internal to kernels/cuda): scatter new K/V rows into
// their pages, or gather them back out. Pure copies: each thread moves one vector V (16
// bytes when rows, pool and tensors allow, else 2 bytes) of one head_dim row; the
// contiguous side runs along [head][token][dim], the paged side along the row.
#ifndef KVARENA_KERNELS_CUDA_APPEND_KERNEL_CUH_
#define KVARENA_KERNELS_CUDA_APPEND_KERNEL_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/kernel_args.h"

namespace kvarena::gpu {

// The two ends of this thread's vector: *tensor (k or v) and *paged (in the pool).
// False when the thread has nothing to move.
template <typename V>
__device__ __forceinline__ bool KvCopyEnds(const AppendArgs& a, V** tensor, V** paged) {
  const uint32_t idx = blockIdx.x * kAppendThreads + threadIdx.x;
  if (idx >= a.head_units) return false;
  const int kv = int(blockIdx.y) >= a.num_kv_heads ? 1 : 0;
  const int h = int(blockIdx.y) - kv * a.num_kv_heads;
  const int b = int(blockIdx.z);
  const PagedSeqDesc seq = a.seqs ? a.seqs[b] : a.one;

  uint32_t t_rel, c;
  a.row.DivMod(idx, &t_rel, &c);
  uint32_t block, slot;
  a.page.DivMod(uint32_t(seq.pos) + t_rel, &block, &slot);
  const int64_t page_id = a.tables[seq.table_offset + int64_t(block) - seq.first_block];

  *tensor =
      reinterpret_cast<V*>(kv ? a.v : a.k) + (int64_t(b) * a.num_kv_heads + h) * a.head_units + idx;
  *paged = reinterpret_cast<V*>(a.pool) + page_id * a.page_units +
           (int64_t(kv) * a.page.divisor + slot) * a.token_units + int64_t(h) * a.row.divisor + c;
  return true;
}

// grid = (ceil(n * row / kAppendThreads), 2 * num_kv_heads, batch), block = kAppendThreads;
// blockIdx.y = kv * num_kv_heads + h (kv 0: K, 1: V). Pointers: see AppendArgs.
template <typename V>
__global__ void __launch_bounds__(kAppendThreads) AppendKvKernel(const AppendArgs a) {
  V *tensor, *paged;
  if (KvCopyEnds(a, &tensor, &paged)) *paged = *tensor;
}

// Same grid; copies the pages' rows out into a.k / a.v.
template <typename V>
__global__ void __launch_bounds__(kAppendThreads) GatherKvKernel(const AppendArgs a) {
  V *tensor, *paged;
  if (KvCopyEnds(a, &tensor, &paged)) *tensor = *paged;
}

}  // namespace kvarena::gpu

#endif  // KVARENA_KERNELS_CUDA_APPEND_KERNEL_CUH_
