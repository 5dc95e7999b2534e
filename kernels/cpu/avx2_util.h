// Vector helpers for the AVX2 attention tile: element formats, horizontal reductions,
// exp2 and the online-softmax row update.
//
// Include ONLY from translation units built with -mavx2 -mfma -mf16c. Everything here
// lives in kvarena::cpu_internal::avx2 and is inline, so every copy the linker may pick
// is AVX2 code called from AVX2 code; no portable unit may include this header.
#ifndef KVARENA_KERNELS_CPU_AVX2_UTIL_H_
#define KVARENA_KERNELS_CPU_AVX2_UTIL_H_

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/attention_tile.h"

namespace kvarena::cpu_internal::avx2 {

inline constexpr float kNegInf = -__builtin_inff();

// The vector vocabulary tile_accumulate.h is written in: 8 floats.
struct Vec8 {
  using F = __m256;
  static constexpr int kLanes = 8;
  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, F x) { _mm256_storeu_ps(p, x); }
  static F Set1(float x) { return _mm256_set1_ps(x); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
};

// Element formats: Load8 reads 8 consecutive stored elements as 8 floats, for K and V
// alike. tile_accumulate.h, which reads V only, calls it LoadV (with kVBytes).
struct F32 {
  static constexpr size_t kBytes = 4, kVBytes = kBytes;
  static __m256 Load8(const uint8_t* p) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  }
  static __m256 LoadV(const uint8_t* p) { return Load8(p); }
};
struct F16 {
  static constexpr size_t kBytes = 2, kVBytes = kBytes;
  static __m256 Load8(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static __m256 LoadV(const uint8_t* p) { return Load8(p); }
};
// bfloat16: zero-extend to 32 bits, shift into the high half. (Loading 16 at a time and
// splitting even / odd elements with a shift and a mask measured no faster.)
struct BF16 {
  static constexpr size_t kBytes = 2, kVBytes = kBytes;
  static __m256 Load8(const uint8_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static __m256 LoadV(const uint8_t* p) { return Load8(p); }
};
// int8 codes (a quantized format's values; tile_scales.h applies the scales).
struct I8 {
  static constexpr size_t kBytes = 1, kVBytes = kBytes;
  static __m256 Load8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static __m256 LoadV(const uint8_t* p) { return Load8(p); }
};

// fp8 e4m3 codes (kernels/kv_quant.h) as their values / kFp8TileScale: sign-extended to 16
// bits and shifted left by 7, a code's sign lands in bits 15 and 14 and its exponent and
// mantissa in a half's low exponent and high mantissa bits; clearing bit 14 leaves the half
// of value / 2^8, which F16C widens exactly (subnormals included). The NaN code reads as
// 480 / 2^8, which no other code does, and becomes NaN. The static scales are attention.cc's.
struct E4M3 {
  static constexpr size_t kBytes = 1, kVBytes = kBytes;
  static __m256 Load8(const uint8_t* p) {
    const __m128i b = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m128i half = _mm_and_si128(_mm_slli_epi16(b, 7), _mm_set1_epi16(int16_t(0xBF80)));
    const __m256 x = _mm256_cvtph_ps(half);
    const __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    const __m256 nan = _mm256_cmp_ps(magnitude, _mm256_set1_ps(1.875f), _CMP_EQ_OQ);
    return _mm256_or_ps(x, nan);
  }
  static __m256 LoadV(const uint8_t* p) { return Load8(p); }
};

inline int Min(int a, int b) { return a < b ? a : b; }
inline int Max(int a, int b) { return a > b ? a : b; }

inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float HMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
// Lane i of the result = horizontal sum of v[i].
inline __m256 HSum8(const __m256* v) {
  const __m256 t0 = _mm256_hadd_ps(v[0], v[1]);
  const __m256 t1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 t2 = _mm256_hadd_ps(v[4], v[5]);
  const __m256 t3 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1);  // per 128-bit half: sums of v0..v3
  const __m256 u1 = _mm256_hadd_ps(t2, t3);  // per 128-bit half: sums of v4..v7
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// 2^x for x <= 0 (as softmax uses it); x < -126, -inf included, gives 0; NaN stays NaN
// (maxps returns its second operand when either is NaN), so a NaN score spreads as in the
// portable tile.
inline __m256 Exp2(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-127.0f), x);
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);  // [-0.5, 0.5]
  __m256 p = _mm256_set1_ps(kExp2Taylor[0]);
#pragma GCC unroll 7
  for (int i = 1; i < 8; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2Taylor[i]));
  // 2^n as exponent bits; n = -127 gives the bit pattern 0, i.e. 0.0f.
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// Mask of the first `count` lanes (count in [0, 8]).
inline __m256i FirstLanes(int count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Turns scores[a, b) of one row into weights 2^(s - m_new) (masked entries are -inf and
// become 0), updates m and l, and returns the factor that rescales the old acc.
inline float SoftmaxRow(float* s, int a, int b, float* m, float* l) {
  const __m256 neg_inf = _mm256_set1_ps(kNegInf);
  const int full_end = a + (b - a) / 8 * 8;  // [a, full_end) in whole vectors
  const __m256i tail = FirstLanes(b - full_end);
  const bool has_tail = full_end < b;
  auto load_tail = [&] {
    return _mm256_blendv_ps(neg_inf, _mm256_maskload_ps(s + full_end, tail),
                            _mm256_castsi256_ps(tail));
  };
  __m256 vmax = has_tail ? load_tail() : neg_inf;
  for (int t = a; t < full_end; t += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + t));
  const float m_old = *m;
  const float tile_max = HMax(vmax);
  const float m_new = m_old > tile_max ? m_old : tile_max;
  if (m_new == kNegInf) {  // nothing visible yet: all weights 0, state unchanged
    for (int t = a; t < b; ++t) s[t] = 0;
    return 1.0f;
  }
  const __m256 mv = _mm256_set1_ps(m_new);
  __m256 vsum = _mm256_setzero_ps();
  for (int t = a; t < full_end; t += 8) {
    const __m256 w = Exp2(_mm256_sub_ps(_mm256_loadu_ps(s + t), mv));
    _mm256_storeu_ps(s + t, w);
    vsum = _mm256_add_ps(vsum, w);
  }
  if (has_tail) {
    const __m256 w = Exp2(_mm256_sub_ps(load_tail(), mv));
    _mm256_maskstore_ps(s + full_end, tail, w);
    vsum = _mm256_add_ps(vsum, w);
  }
  const float corr = _mm256_cvtss_f32(Exp2(_mm256_set1_ps(m_old - m_new)));  // 0 if m_old = -inf
  *l = *l * corr + HSum(vsum);
  *m = m_new;
  return corr;
}

}  // namespace kvarena::cpu_internal::avx2

#endif  // KVARENA_KERNELS_CPU_AVX2_UTIL_H_
