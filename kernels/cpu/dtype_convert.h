// Scalar conversions between the storage dtypes (float16, bfloat16) and float32, exact on
// the way in and round-to-nearest-even on the way out, subnormals, infinities and NaN
// included. Internal to kernels/cpu (and its tests); plain functions, no state.
//
// Portable C++ only: the AVX2 translation unit must not include this header (an inline
// function compiled there with -mavx2 could be the copy the linker keeps for everyone).
#ifndef KVARENA_KERNELS_CPU_DTYPE_CONVERT_H_
#define KVARENA_KERNELS_CPU_DTYPE_CONVERT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/paged_kv.h"

namespace kvarena::cpu_internal {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// IEEE binary16 -> float32 (exact). Branch-free so that loops over it vectorise: the
// half's exponent and mantissa placed in a float's low bits, times 2^112, rebias the
// exponent exactly, subnormal halves included; infinities and NaN are set aside, a NaN
// coming out quiet with its payload (as an IEEE conversion, and F16C's, gives it).
// REQUIRES: denormals-are-zero off (the default floating-point environment).
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t em = uint32_t(h & 0x7fffu) << 13;
  const uint32_t finite = FloatBits(BitsFloat(em) * 0x1p112f);
  const uint32_t quiet = uint32_t(em > (0x7c00u << 13)) << 22;  // NaN: set the quiet bit
  const uint32_t special = 0x7f800000u | em | quiet;
  return BitsFloat(sign | (em >= (0x7c00u << 13) ? special : finite));
}

// float32 -> IEEE binary16, round to nearest even; overflow gives infinity, NaN stays a
// (quiet) NaN. REQUIRES: the default floating-point rounding mode.
inline uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) {  // inf or NaN
    return sign | (a > 0x7f800000u ? uint16_t(0x7e00u | ((a >> 13) & 0x3ffu)) : 0x7c00u);
  }
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to infinity
  if (a < 0x38800000u) {
    // Below the smallest normal half (2^-14): add 0.5f so that the FPU rounds the value
    // to a multiple of 2^-24 (the half subnormal step) with ties to even; the low bits of
    // the sum are then the half's bits.
    const float sum = BitsFloat(a) + 0.5f;
    return sign | uint16_t(FloatBits(sum) - 0x3f000000u);
  }
  const uint32_t odd = (a >> 13) & 1u;
  a += (uint32_t(15 - 127) << 23) + 0xfffu + odd;
  return sign | uint16_t(a >> 13);
}

inline float BFloat16ToFloat(uint16_t b) { return BitsFloat(uint32_t(b) << 16); }

// float32 -> bfloat16, round to nearest even; NaN stays a (quiet) NaN.
inline uint16_t FloatToBFloat16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// src: [n] elements of dtype -> dst: [n] floats.
inline void LoadAsFloat(DType dtype, const void* src, size_t n, float* dst) {
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kFloat16: {
      const auto* s = static_cast<const uint16_t*>(src);
      size_t i = 0;
      for (; i + 8 <= n; i += 8) {  // fixed blocks of 8: vectorised at -O2
        for (size_t j = 0; j < 8; ++j) dst[i + j] = HalfToFloat(s[i + j]);
      }
      for (; i < n; ++i) dst[i] = HalfToFloat(s[i]);
      return;
    }
    case DType::kBFloat16: {
      const auto* s = static_cast<const uint16_t*>(src);
      size_t i = 0;
      for (; i + 8 <= n; i += 8) {
        for (size_t j = 0; j < 8; ++j) dst[i + j] = BFloat16ToFloat(s[i + j]);
      }
      for (; i < n; ++i) dst[i] = BFloat16ToFloat(s[i]);
      return;
    }
    case DType::kUnspecified:
      return;
  }
}

// src: [n] floats -> dst: [n] elements of dtype (round to nearest even).
inline void StoreFromFloat(DType dtype, const float* src, size_t n, void* dst) {
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kFloat16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = FloatToHalf(src[i]);
      return;
    }
    case DType::kBFloat16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = FloatToBFloat16(src[i]);
      return;
    }
    case DType::kUnspecified:
      return;
  }
}

}  // namespace kvarena::cpu_internal

#endif  // KVARENA_KERNELS_CPU_DTYPE_CONVERT_H_
