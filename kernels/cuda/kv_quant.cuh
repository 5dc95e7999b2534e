// The quantized KV formats on the device (internal to kernels/cuda): kernels/kv_quant.h's
// arithmetic rewritten over CUDA's float intrinsics, bit for bit the same codes and scales
// (emulator_quant_test.cc checks them against kv_quant.h), plus the storage tags the
// attention kernel is templated on and the switch that picks one from a PageLayout.
// Stateless; compiles as host C++ too (the kernel emulator).
#ifndef KVARENA_KERNELS_CUDA_KV_QUANT_CUH_
#define KVARENA_KERNELS_CUDA_KV_QUANT_CUH_

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/paged_kv.h"

namespace kvarena::gpu {

__host__ __device__ __forceinline__ uint32_t FloatBits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}
__host__ __device__ __forceinline__ float BitsFloat(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}
__host__ __device__ __forceinline__ bool IsNan(float x) {
  return (FloatBits(x) & 0x7fffffffu) > 0x7f800000u;
}
__host__ __device__ __forceinline__ bool IsFinite(float x) {
  return (FloatBits(x) & 0x7f800000u) != 0x7f800000u;
}

// ---- int8: kv_quant.h's Int8Scale / QuantizeInt8 / DequantizeInt8 -----------------------

// The code of x under `scale` (Int8Scale's: amax / 127, or NaN / inf for such heads).
__host__ __device__ __forceinline__ int8_t EncodeInt8(float x, float scale) {
  const float r = scale > 0 && IsFinite(scale) ? rintf(x / scale) : 0.0f;
  return int8_t(fminf(fmaxf(r, -127.0f), 127.0f));
}
__host__ __device__ __forceinline__ float DecodeInt8(int8_t q, float scale) {
  return float(q) * scale;
}

// ---- fp8 e4m3fn: kv_quant.h's EncodeFp8E4M3 / DecodeFp8E4M3 -----------------------------

__host__ __device__ __forceinline__ uint8_t EncodeFp8(float x) {
  const uint32_t bits = FloatBits(x);
  const uint8_t sign = (bits >> 31) != 0 ? 0x80 : 0x00;
  if (IsNan(x)) return sign | 0x7f;
  const float a = fminf(fabsf(x), 448.0f);
  if (a < 0.015625f) return sign | uint8_t(rintf(a * 512.0f));  // subnormal codes: 2^-9 units
  uint32_t u = FloatBits(a);
  u += 0x7ffffu + ((u >> 20) & 1u);  // round 23 mantissa bits to 3, ties to even
  const uint32_t code = (u >> 20) - ((127u - 7u) << 3);
  return sign | uint8_t(code < 0x7eu ? code : 0x7eu);
}

// S.1111.111 is NaN (the positive quiet NaN, as DecodeFp8E4M3 gives).
__host__ __device__ __forceinline__ float DecodeFp8(uint8_t code) {
  const uint32_t mag = code & 0x7fu;
  if (mag == 0x7fu) return BitsFloat(0x7fc00000u);
  const float a = (mag >> 3) != 0 ? BitsFloat((mag + ((127u - 7u) << 3)) << 20)
                                  : float(mag) * 0x1p-9f;  // subnormal: mantissa * 2^-9
  return (code & 0x80) != 0 ? -a : a;
}

// ---- Storage tags -------------------------------------------------------------------------
// KV storage types of the attention kernel beside the plain T: Storage<KV> unpacks one
// lane's chunk of kChunkBytes (in the first bytes of a 16-byte slot) into kVec floats.
// kTokenScales: each (token, kv head) row has a float32 scale after the token's values.

struct Int8Kv {};  // KvFormat::kInt8
struct Fp8Kv {};   // KvFormat::kFp8E4M3

template <>
struct Storage<Int8Kv> {
  static constexpr int kVec = 8;
  static constexpr int kChunkBytes = 8;
  static constexpr bool kTokenScales = true;
  __device__ __forceinline__ static void Unpack(const uint4& raw, float* f) {
    const uint32_t w[2] = {raw.x, raw.y};
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = float(int8_t(uint8_t(w[i / 4] >> (8 * (i % 4)))));
  }
};

template <>
struct Storage<Fp8Kv> {
  static constexpr int kVec = 8;
  static constexpr int kChunkBytes = 8;
  static constexpr bool kTokenScales = false;
  __device__ __forceinline__ static void Unpack(const uint4& raw, float* f) {
    const uint32_t w[2] = {raw.x, raw.y};
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = DecodeFp8(uint8_t(w[i / 4] >> (8 * (i % 4))));
  }
};

// Calls f(KV{}) with KV the storage type of `format` for activation dtype T: T itself
// for T's plain format, Int8Kv, Fp8Kv; cudaErrorInvalidValue for any other pairing.
template <typename T, typename F>
cudaError_t DispatchKvStorage(KvFormat format, DType dtype, F&& f) {
  switch (format) {
    case KvFormat::kInt8:
      return f(Int8Kv{});
    case KvFormat::kFp8E4M3:
      return f(Fp8Kv{});
    case KvFormat::kFloat32:
    case KvFormat::kFloat16:
    case KvFormat::kBFloat16:
      if (format == NativeKvFormat(dtype)) return f(T{});
      break;
    case KvFormat::kUnspecified:
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace kvarena::gpu

#endif  // KVARENA_KERNELS_CUDA_KV_QUANT_CUH_
