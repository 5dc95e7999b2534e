// The quantized KV formats' arithmetic, stated once for every kernel and every test
// reference (kvarena/paged_kv.h names the formats and lays out their scales).
//
// int8 (KvFormat::kInt8): symmetric, one float32 scale per (token, kv head), computed at
// append from that head's head_dim values x:
//   scale = max|x| / 127                      (0 when every x is 0)
//   q     = clamp(rint(x / scale), -127, 127) (0 when scale is 0; rint rounds half to even)
//   x'    = q * scale                         (what attention and GetKv read)
// -128 is never stored, so the format is symmetric and negating K negates its codes.
// A value that is NaN or infinite has no finite scale: the head's scale becomes NaN or
// infinite and its values read back as NaN, as a 16-bit cache would carry them.
//
// fp8_e4m3 (KvFormat::kFp8E4M3): OCP FP8 E4M3FN (1 sign, 4 exponent bits biased by 7, 3
// mantissa bits; no infinities; S.1111.111 is NaN; largest finite 448; smallest subnormal
// 2^-9), with a static float32 scale per (layer, kv head) for K and for V (CacheSpec):
//   code = E4M3(x / scale), rounded to nearest, ties to even; |x / scale| beyond 448
//          (infinities included) saturates to +-448; NaN stays NaN
//   x'   = value(code) * scale
//
// Pure functions; thread-safe. C++17 (the CUDA host emulator includes it too).
#ifndef KVARENA_KERNELS_KV_QUANT_H_
#define KVARENA_KERNELS_KV_QUANT_H_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace kvarena {

inline constexpr float kInt8Max = 127.0f;

// The int8 scale of x[0, n).
inline float Int8Scale(const float* x, int n) {
  float amax = 0;
  for (int i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  for (int i = 0; i < n; ++i) {  // fmax drops NaN: keep it, so the head reads back as NaN
    if (std::isnan(x[i])) return x[i];
  }
  return amax / kInt8Max;
}

// q[i] = x[i] quantized with scale (Int8Scale's).
inline void QuantizeInt8(const float* x, int n, float scale, int8_t* q) {
  for (int i = 0; i < n; ++i) {
    const float r = scale > 0 && std::isfinite(scale) ? std::rint(x[i] / scale) : 0.0f;
    q[i] = int8_t(std::fmin(std::fmax(r, -kInt8Max), kInt8Max));
  }
}

// x[i] = q[i] * scale.
inline void DequantizeInt8(const int8_t* q, int n, float scale, float* x) {
  for (int i = 0; i < n; ++i) x[i] = float(q[i]) * scale;
}

inline constexpr float kFp8E4M3Max = 448.0f;
inline constexpr uint8_t kFp8E4M3MaxCode = 0x7E;  // 448: S.1111.110
inline constexpr uint8_t kFp8E4M3NaN = 0x7F;

// The E4M3 code of x (see above).
inline uint8_t EncodeFp8E4M3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | kFp8E4M3NaN;
  const float a = std::fmin(std::fabs(x), kFp8E4M3Max);
  if (a < 0.015625f) {  // below 2^-6: subnormal codes count units of 2^-9 (8 is 2^-6)
    return sign | uint8_t(std::rint(a * 512.0f));
  }
  // Normal: round the float's 23 mantissa bits to 3, ties to even; a carry moves into the
  // exponent, which is what the next code is.
  uint32_t bits;
  std::memcpy(&bits, &a, sizeof(bits));
  bits += 0x7FFFF + ((bits >> 20) & 1);
  const uint32_t code = (bits >> 20) - ((127 - 7) << 3);
  return sign | uint8_t(code < kFp8E4M3MaxCode ? code : kFp8E4M3MaxCode);
}

// The value of an E4M3 code.
inline float DecodeFp8E4M3(uint8_t code) {
  const int magnitude = code & 0x7F;
  if (magnitude == kFp8E4M3NaN) return std::nanf("");
  const int exponent = magnitude >> 3, mantissa = magnitude & 7;
  const float a = exponent == 0 ? std::ldexp(float(mantissa), -9)
                                : std::ldexp(float(8 + mantissa), exponent - 10);
  return (code & 0x80) != 0 ? -a : a;
}

// q[i] = EncodeFp8E4M3(x[i] / scale); x[i] = DecodeFp8E4M3(q[i]) * scale.
inline void QuantizeFp8E4M3(const float* x, int n, float scale, uint8_t* q) {
  for (int i = 0; i < n; ++i) q[i] = EncodeFp8E4M3(x[i] / scale);
}
inline void DequantizeFp8E4M3(const uint8_t* q, int n, float scale, float* x) {
  for (int i = 0; i < n; ++i) x[i] = DecodeFp8E4M3(q[i]) * scale;
}

}  // namespace kvarena

#endif  // KVARENA_KERNELS_KV_QUANT_H_
