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
// Pure functions; thread-safe. C++17 (the CUDA host emulator includes it too).
#ifndef KVARENA_KERNELS_KV_QUANT_H_
#define KVARENA_KERNELS_KV_QUANT_H_

#include <cmath>
#include <cstdint>

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

}  // namespace kvarena

#endif  // KVARENA_KERNELS_KV_QUANT_H_
