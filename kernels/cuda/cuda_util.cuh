// Device helpers shared by the kernels (internal to kernels/cuda): storage-type traits
// and 16-byte pack/unpack, cp.async wrappers, and the launchers' dispatch switches that
// turn run-time dtype / head_dim into template parameters. Stateless.
#ifndef KVARENA_KERNELS_CUDA_CUDA_UTIL_CUH_
#define KVARENA_KERNELS_CUDA_CUDA_UTIL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/paged_kv.h"

namespace kvarena::gpu {

// ---- Storage types ----------------------------------------------------------------------

// 16 bytes of storage <-> kVec floats (round to nearest even on the way out). A lane of
// the attention kernel moves kChunkBytes of a key row at a time (16 here; the 1-byte
// formats of kv_quant.cuh use 8); kTokenScales: rows carry per-token scales (none here).
template <typename T>
struct Storage;

template <>
struct Storage<float> {
  static constexpr int kVec = 4;
  static constexpr int kChunkBytes = 16;
  static constexpr bool kTokenScales = false;
  __device__ __forceinline__ static void Unpack(const uint4& raw, float* f) {
    const float4 x = *reinterpret_cast<const float4*>(&raw);
    f[0] = x.x;
    f[1] = x.y;
    f[2] = x.z;
    f[3] = x.w;
  }
  __device__ __forceinline__ static float ToFloat(float x) { return x; }
  __device__ __forceinline__ static float FromFloat(float x) { return x; }
};

template <>
struct Storage<__half> {
  static constexpr int kVec = 8;
  static constexpr int kChunkBytes = 16;
  static constexpr bool kTokenScales = false;
  __device__ __forceinline__ static void Unpack(const uint4& raw, float* f) {
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 t = __half22float2(h[i]);
      f[2 * i] = t.x;
      f[2 * i + 1] = t.y;
    }
  }
  __device__ __forceinline__ static float ToFloat(__half x) { return __half2float(x); }
  __device__ __forceinline__ static __half FromFloat(float x) { return __float2half_rn(x); }
};

template <>
struct Storage<__nv_bfloat16> {
  static constexpr int kVec = 8;
  static constexpr int kChunkBytes = 16;
  static constexpr bool kTokenScales = false;
  __device__ __forceinline__ static void Unpack(const uint4& raw, float* f) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 t = __bfloat1622float2(h[i]);
      f[2 * i] = t.x;
      f[2 * i + 1] = t.y;
    }
  }
  __device__ __forceinline__ static float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ __forceinline__ static __nv_bfloat16 FromFloat(float x) {
    return __float2bfloat16_rn(x);
  }
};

// ---- cp.async (global -> shared, 16 bytes, bypassing L1) --------------------------------
// Compiled as host C++ (the kernel emulator, emulator_test.cc) or for GPUs older than
// sm_80 the copies happen at once.

// Copies 16 bytes from gmem, or writes 16 zero bytes when !valid (gmem is then not read
// but must still be a valid address).
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800  // no cp.async before Ampere: copy now
  *static_cast<uint4*>(smem) =
      valid ? __ldg(static_cast<const uint4*>(gmem)) : make_uint4(0, 0, 0, 0);
#elif defined(__CUDA_ARCH__)
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes)
               : "memory");
#else
  if ((reinterpret_cast<uintptr_t>(smem) | reinterpret_cast<uintptr_t>(gmem)) % 16 != 0) {
    std::fprintf(stderr, "CpAsync16: misaligned %p <- %p\n", smem, gmem);  // a GPU would fault
    std::abort();
  }
  if (valid) {
    std::memcpy(smem, gmem, 16);
  } else {
    std::memset(smem, 0, 16);
  }
#endif
}
// Copies 4 or 8 bytes (kBytes) from gmem, or zeroes them when !valid: the narrow rows of
// the 1-byte formats (an int8 row is 4-byte aligned only when its trailing scales are).
template <int kBytes>
__device__ __forceinline__ void CpAsyncSmall(void* smem, const void* gmem, bool valid) {
  static_assert(kBytes == 4 || kBytes == 8, "cp.async.ca copies 4, 8 or 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  if (kBytes == 4) {
    *static_cast<uint32_t*>(smem) = valid ? __ldg(static_cast<const unsigned*>(gmem)) : 0u;
  } else {
    *static_cast<uint2*>(smem) = valid ? __ldg(static_cast<const uint2*>(gmem)) : make_uint2(0, 0);
  }
#elif defined(__CUDA_ARCH__)
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? kBytes : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(s), "l"(gmem), "n"(kBytes),
               "r"(src_bytes)
               : "memory");
#else
  if ((reinterpret_cast<uintptr_t>(smem) | reinterpret_cast<uintptr_t>(gmem)) % kBytes != 0) {
    std::fprintf(stderr, "CpAsyncSmall: misaligned %p <- %p\n", smem, gmem);
    std::abort();
  }
  if (valid) {
    std::memcpy(smem, gmem, kBytes);
  } else {
    std::memset(smem, 0, kBytes);
  }
#endif
}
__device__ __forceinline__ void CpAsyncCommit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most `pending` of this thread's committed groups are still in flight.
template <int pending>
__device__ __forceinline__ void CpAsyncWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
#endif
}

// ---- Dispatch ---------------------------------------------------------------------------
// One switch per template parameter, each ending in an explicit error. `f` is a generic
// lambda taking a value of the chosen type (dtype) or std::integral_constant (head_dim).

template <typename F>
cudaError_t DispatchDType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f(float{});
    case DType::kFloat16:
      return f(__half{});
    case DType::kBFloat16:
      return f(__nv_bfloat16{});
    case DType::kUnspecified:
      break;
  }
  return cudaErrorInvalidValue;
}

template <int D>
struct HeadDim {
  static constexpr int value = D;
};

template <typename F>
cudaError_t DispatchHeadDim(int head_dim, F&& f) {
  switch (head_dim) {
    case 64:
      return f(HeadDim<64>{});
    case 128:
      return f(HeadDim<128>{});
    case 256:
      return f(HeadDim<256>{});
    default:
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace kvarena::gpu

#endif  // KVARENA_KERNELS_CUDA_CUDA_UTIL_CUH_
