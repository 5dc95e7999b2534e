// QuantAppendKvKernel / QuantGatherKvKernel (internal to kernels/cuda): append and gather
// for the quantized formats (int8, fp8_e4m3), with the codes and scales of the CPU
// kernels bit for bit (kv_quant.cuh). One warp per (sequence, K or V, kv head, token)
// row: the lanes stride over head_dim; int8 finds the row's absmax (and its first NaN) with
// warp shuffles, and lane 0 writes the scale after the token's codes.
#ifndef KVARENA_KERNELS_CUDA_QUANT_APPEND_KERNEL_CUH_
#define KVARENA_KERNELS_CUDA_QUANT_APPEND_KERNEL_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/kernel_args.h"
#include "kernels/cuda/kv_quant.cuh"

namespace kvarena::gpu {

// This warp's row: *x = its head_dim activations ([batch][num_kv_heads][n][head_dim] in
// a.k or a.v), *row = its token's row in the pool, *kv / *h which of K, V and which head.
// False when the warp has no row (past n); uniform across the warp.
template <typename T>
__device__ __forceinline__ bool QuantRowEnds(const AppendArgs& a, T** x, uint8_t** row, int* kv,
                                             int* h) {
  const uint32_t t_rel = blockIdx.x * kQuantRowsPerCta + threadIdx.x / 32;
  if (t_rel >= a.n) return false;
  *kv = int(blockIdx.y) >= a.num_kv_heads ? 1 : 0;
  *h = int(blockIdx.y) - *kv * a.num_kv_heads;
  const int b = int(blockIdx.z);
  const PagedSeqDesc seq = a.seqs ? a.seqs[b] : a.one;
  uint32_t block, slot;
  a.page.DivMod(uint32_t(seq.pos) + t_rel, &block, &slot);
  const int64_t page_id = a.tables[seq.table_offset + int64_t(block) - seq.first_block];
  *x = reinterpret_cast<T*>(*kv ? a.v : a.k) +
       ((int64_t(b) * a.num_kv_heads + *h) * a.n + t_rel) * a.head_dim;
  *row = a.pool + page_id * a.page_bytes + (int64_t(*kv) * a.page.divisor + slot) * a.token_bytes;
  return true;
}

__device__ __forceinline__ float LoadScale(const uint8_t* p) {  // 4-byte aligned or not
  uint32_t u = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) u |= uint32_t(p[i]) << (8 * i);
  return BitsFloat(u);
}
__device__ __forceinline__ void StoreScale(uint8_t* p, float s) {
  const uint32_t u = FloatBits(s);
#pragma unroll
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(u >> (8 * i));
}

// x as float, a NaN keeping its sign and payload (quieted) as the CPU's conversion keeps
// them (dtype_convert.h): fp8 codes keep a NaN's sign, an int8 scale is the NaN itself,
// and a __half conversion may canonicalise NaNs.
template <typename T>
__device__ __forceinline__ float ExactFloat(const T& x) {
  const float f = Storage<T>::ToFloat(x);
  if constexpr (std::is_same_v<T, __half>) {
    if (IsNan(f)) {
      uint16_t h;
      memcpy(&h, &x, sizeof(h));
      return BitsFloat((uint32_t(h & 0x8000u) << 16) | 0x7fc00000u | (uint32_t(h & 0x3ffu) << 13));
    }
  }
  return f;
}

// The int8 scale of x[0, head_dim) (kv_quant.h's Int8Scale), in every lane.
template <typename T>
__device__ __forceinline__ float WarpInt8Scale(const T* x, int head_dim, int lane) {
  constexpr float kNone = 0x1p30f;  // above any index: no NaN seen
  float amax = 0.0f, nan_at = kNone;
  for (int d = lane; d < head_dim; d += 32) {
    const float f = ExactFloat(x[d]);
    amax = fmaxf(amax, fabsf(f));
    if (IsNan(f) && nan_at == kNone) nan_at = float(d);
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    nan_at = fminf(nan_at, __shfl_xor_sync(0xffffffffu, nan_at, o));
  }
  // The first NaN, as the CPU returns it (exact: indices < 2^24 are exact floats).
  return nan_at != kNone ? ExactFloat(x[int(nan_at)]) : amax / 127.0f;
}

// grid = (ceil(n / kQuantRowsPerCta), 2 * num_kv_heads, batch), block = kAppendThreads;
// blockIdx.y = kv * num_kv_heads + h. T: the activation dtype; KV: Int8Kv or Fp8Kv.
template <typename T, typename KV>
__global__ void __launch_bounds__(kAppendThreads) QuantAppendKvKernel(const AppendArgs a) {
  T* x;
  uint8_t* row;
  int kv, h;
  if (!QuantRowEnds(a, &x, &row, &kv, &h)) return;
  const int lane = threadIdx.x % 32;
  uint8_t* codes = row + int64_t(h) * a.head_dim;
  if constexpr (Storage<KV>::kTokenScales) {
    const float scale = WarpInt8Scale(x, a.head_dim, lane);
    for (int d = lane; d < a.head_dim; d += 32) {
      codes[d] = uint8_t(EncodeInt8(ExactFloat(x[d]), scale));
    }
    if (lane == 0) StoreScale(row + a.value_bytes + 4 * int64_t(h), scale);
  } else {
    const float scale = a.scales[kv] ? a.scales[kv][h] : 1.0f;
    for (int d = lane; d < a.head_dim; d += 32) {
      codes[d] = EncodeFp8(ExactFloat(x[d]) / scale);
    }
  }
}

// Same grid; dequantizes the rows into a.k / a.v in the activation dtype.
template <typename T, typename KV>
__global__ void __launch_bounds__(kAppendThreads) QuantGatherKvKernel(const AppendArgs a) {
  T* x;
  uint8_t* row;
  int kv, h;
  if (!QuantRowEnds(a, &x, &row, &kv, &h)) return;
  const int lane = threadIdx.x % 32;
  const uint8_t* codes = row + int64_t(h) * a.head_dim;
  if constexpr (Storage<KV>::kTokenScales) {
    const float scale = LoadScale(row + a.value_bytes + 4 * int64_t(h));
    for (int d = lane; d < a.head_dim; d += 32) {
      x[d] = Storage<T>::FromFloat(DecodeInt8(int8_t(codes[d]), scale));
    }
  } else {
    const float scale = a.scales[kv] ? a.scales[kv][h] : 1.0f;
    for (int d = lane; d < a.head_dim; d += 32) {
      x[d] = Storage<T>::FromFloat(DecodeFp8(codes[d]) * scale);
    }
  }
}

}  // namespace kvarena::gpu

#endif  // KVARENA_KERNELS_CUDA_QUANT_APPEND_KERNEL_CUH_
