// The AVX-512 attention tile step (see attention_tile.h), as templates over how a K/V
// element is loaded and how q . K is multiplied; attention_tile_avx512.cc instantiates
// them with converted K (f32 / f16 / bf16 / int8 / fp8, FMAs), attention_tile_avx512_bf16.cc
// with bf16 K multiplied by vdpbf16ps and attention_tile_avx512_vnni.cc with int8 K
// multiplied by vpdpbusd.
//
// An element type E says how: Query (the q rows it multiplies), LoadQ / LoadK / Mac (one
// step of kDimsPerStep dims into a vector accumulator), Partial (an accumulator as 16
// float partial sums), RowsOf / Finish (what turns a row's summed products into its score,
// prepared once per block of rows), LoadV and kVBytes (the V pass).
//
// Per block of RB <= 4 query rows (the rows of one GQA group share every K/V load):
//   1. scores: RB rows x (16 / RB) tokens at a time in 16 accumulators over head_dim,
//      reduced together by one transposing horizontal sum (Sum16);
//   2. mask, then the online-softmax update per row with a vector exp2;
//   3. V: RB rows x CB vectors of 16 dims in registers across the tile's tokens.
//
// Include ONLY from units built with AVX-512 F/BW/VL (+ FMA, F16C). Everything here has
// internal linkage (an unnamed namespace): the two units are built with different flags,
// and the linker must not hand one unit's copy of a function to the other.
#ifndef KVARENA_KERNELS_CPU_AVX512_TILE_H_
#define KVARENA_KERNELS_CPU_AVX512_TILE_H_

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/tile_accumulate.h"
#include "kernels/cpu/tile_prefetcher.h"
#include "kernels/cpu/tile_row_ranges.h"
#include "kernels/cpu/tile_scales.h"

namespace kvarena::cpu_internal::avx512 {
namespace {  // NOLINT(build/namespaces): internal linkage on purpose, see above

constexpr float kNegInf = -__builtin_inff();

inline int Min(int a, int b) { return a < b ? a : b; }
inline int Max(int a, int b) { return a > b ? a : b; }

// The vector vocabulary tile_accumulate.h is written in: 16 floats.
struct Vec16 {
  using F = __m512;
  static constexpr int kLanes = 16;
  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static F Set1(float x) { return _mm512_set1_ps(x); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
};

// Loads of 16 consecutive stored elements as 16 floats.
inline __m512 LoadF32(const uint8_t* p) { return _mm512_loadu_ps(p); }
inline __m512 LoadF16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 LoadI8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
// fp8 e4m3 codes as their values / kFp8TileScale, as avx2_util.h's E4M3 widens them.
inline __m512 LoadE4M3(const uint8_t* p) {
  const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i half =
      _mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16(int16_t(0xBF80)));
  const __m512 x = _mm512_cvtph_ps(half);
  const __mmask16 nan = _mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(1.875f), _CMP_EQ_OQ);
  return _mm512_mask_mov_ps(x, nan, _mm512_castsi512_ps(_mm512_set1_epi32(-1)));
}
inline __m512 LoadBF16(const uint8_t* p) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

// Element formats with K converted to float: q . K by FMAs over 16 dims a step, on the
// float q (already scaled by scale * log2(e)).
template <__m512 (*Load)(const uint8_t*), size_t Bytes>
struct Converted {
  static constexpr size_t kVBytes = Bytes;
  static constexpr int kDimsPerStep = 16;
  static const float* Query(const AttendTileArgs& args) { return args.q; }
  static __m512 LoadQ(const float* q, int d) { return _mm512_loadu_ps(q + d); }
  static __m512 LoadK(const uint8_t* p, int d) { return Load(p + size_t(d) * Bytes); }
  static __m512 Mac(__m512 acc, __m512 q, __m512 k) { return _mm512_fmadd_ps(q, k, acc); }
  static __m512 Partial(__m512 acc) { return acc; }
  struct Rows {};  // q is pre-scaled: the sums are the scores
  static Rows RowsOf(const AttendTileArgs&, int, int, int) { return {}; }
  static __m512 Finish(__m512 sums, const AttendTileArgs&, const Rows&) { return sums; }
  static __m512 LoadV(const uint8_t* p) { return Load(p); }
};
using F32 = Converted<LoadF32, 4>;
using F16 = Converted<LoadF16, 2>;
using BF16 = Converted<LoadBF16, 2>;
using I8 = Converted<LoadI8, 1>;      // the codes; ScaleByTokens applies the scales
using E4M3 = Converted<LoadE4M3, 1>;  // the values; the static scales are attention.cc's

// Lane i of the result = horizontal sum of v[i].
inline __m512 Sum16(const __m512* v) {
  __m512 s1[8], s2[4], s3[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {  // per 128-bit block: partials of v[2i], v[2i+1]
    s1[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                          _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // per block: its partial sums of v[4i .. 4i + 3]
    const __m512d c = _mm512_castps_pd(s1[2 * i]), d = _mm512_castps_pd(s1[2 * i + 1]);
    s2[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(c, d)),
                          _mm512_castpd_ps(_mm512_unpackhi_pd(c, d)));
  }
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {  // blocks 0+1 and 2+3 combined
    s3[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s2[2 * i], s2[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_f32x4(s2[2 * i], s2[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(s3[0], s3[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(s3[0], s3[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// 2^x for x <= 0 (as softmax uses it); x < -126, -inf included, gives 0; NaN stays NaN
// (maxps returns its second operand when either is NaN), so a NaN score spreads as in the
// portable tile.
inline __m512 Exp2(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-127.0f), x);
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);  // [-0.5, 0.5]
  __m512 p = _mm512_set1_ps(kExp2Taylor[0]);
#pragma GCC unroll 7
  for (int i = 1; i < 8; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Taylor[i]));
  // 2^n as exponent bits; n = -127 gives the bit pattern 0, i.e. 0.0f.
  const __m512i e =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

// Mask of lanes [a - base, b - base) of the 16 starting at base.
inline __mmask16 Lanes(int base, int a, int b) {
  const int lo = Max(a - base, 0), hi = Min(b - base, 16);
  return hi <= lo ? 0 : __mmask16(((1u << (hi - lo)) - 1) << lo);
}

// Turns scores[a, b) of one row into weights 2^(s - m_new) (masked entries are -inf and
// become 0), updates m and l, and returns the factor that rescales the old acc.
// s: [kTileTokens] (two vectors of 16).
inline float SoftmaxRow(float* s, int a, int b, float* m, float* l) {
  static_assert(kTileTokens == 32);
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  const __mmask16 k0 = Lanes(0, a, b), k1 = Lanes(16, a, b);
  const __m512 s0 = _mm512_mask_loadu_ps(neg_inf, k0, s);
  const __m512 s1 = _mm512_mask_loadu_ps(neg_inf, k1, s + 16);
  const float m_old = *m;
  const float tile_max = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
  const float m_new = m_old > tile_max ? m_old : tile_max;
  if (m_new == kNegInf) {  // nothing visible yet: all weights 0, state unchanged
    for (int t = a; t < b; ++t) s[t] = 0;
    return 1.0f;
  }
  const __m512 mv = _mm512_set1_ps(m_new);
  const __m512 w0 = Exp2(_mm512_sub_ps(s0, mv)), w1 = Exp2(_mm512_sub_ps(s1, mv));
  _mm512_mask_storeu_ps(s, k0, w0);
  _mm512_mask_storeu_ps(s + 16, k1, w1);
  const float corr = _mm512_cvtss_f32(Exp2(_mm512_set1_ps(m_old - m_new)));  // 0 if m_old = -inf
  *l = *l * corr + _mm512_reduce_add_ps(_mm512_add_ps(w0, w1));
  *m = m_new;
  return corr;
}

// scores[r][t + j] = q[r] . K[t + j] for r < RB, j < TB (RB * TB <= 16).
// q: [RB][dim] in E's query format; k: token pointers (+ off); scores: [RB][kTileTokens];
// rows: E::RowsOf these RB rows and TB.
template <class E, int RB, int TB, class Q>
void ScoreTokens(const AttendTileArgs& args, const Q* q, const uint8_t* const* k, size_t off, int t,
                 float* scores, const typename E::Rows& rows) {
  constexpr int N = RB * TB;
  const int dim = args.head_dim;
  const uint8_t* kp[TB];
#pragma GCC unroll 16
  for (int j = 0; j < TB; ++j) kp[j] = k[t + j] + off;
  __m512 acc[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  for (int d = 0; d < dim; d += E::kDimsPerStep) {
    __m512 kv[TB];
#pragma GCC unroll 16
    for (int j = 0; j < TB; ++j) kv[j] = E::LoadK(kp[j], d);
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r) {
      const __m512 qv = E::LoadQ(q + size_t(r) * dim, d);
#pragma GCC unroll 16
      for (int j = 0; j < TB; ++j) acc[r * TB + j] = E::Mac(acc[r * TB + j], qv, kv[j]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < N; ++i) acc[i] = E::Partial(acc[i]);
  alignas(64) float sums[16];
  if constexpr (N > 4) {
    _mm512_store_ps(sums, E::Finish(Sum16(acc), args, rows));
  } else {
    __m512 s = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int i = 0; i < N; ++i) {
      s = _mm512_mask_mov_ps(s, __mmask16(1u << i), _mm512_set1_ps(_mm512_reduce_add_ps(acc[i])));
    }
    _mm512_store_ps(sums, E::Finish(s, args, rows));
  }
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 16
    for (int j = 0; j < TB; ++j) scores[r * kTileTokens + t + j] = sums[r * TB + j];
  }
}

// scores[r][t] = q[r0 + r] . K[t] for r < RB, t in [a, b): 16 / RB tokens a step, the
// last few one at a time.
template <class E, int RB>
void ScoreBlock(const AttendTileArgs& args, int r0, int a, int b, float* scores,
                TilePrefetcher& prefetch) {
  constexpr int TB = RB == 1 ? 8 : 16 / RB;  // 16 K vectors would not leave room for q
  const auto* q = E::Query(args) + size_t(r0) * args.head_dim;
  int t = a;
  if (t + TB <= b) {
    const typename E::Rows rows = E::RowsOf(args, r0, RB, TB);
    for (; t + TB <= b; t += TB) {
      prefetch.Step(TB);
      ScoreTokens<E, RB, TB>(args, q, args.k, args.head_offset, t, scores, rows);
    }
  }
  if (t < b) {
    const typename E::Rows rows = E::RowsOf(args, r0, RB, 1);
    for (; t < b; ++t) {
      prefetch.Step(1);
      ScoreTokens<E, RB, 1>(args, q, args.k, args.head_offset, t, scores, rows);
    }
  }
}

template <class E, int RB>
void AttendRowBlock(const AttendTileArgs& args, int r0, TilePrefetcher& prefetch) {
  const TileRowRanges<RB> rows(args, r0);
  if (rows.empty()) return;
  const int a = rows.a, b = rows.b;
  const int dim = args.head_dim;
  float* scores = args.scratch + size_t(r0) * kTileTokens;
  float* corr = args.scratch + size_t(args.rows) * kTileTokens + r0;
  ScoreBlock<E, RB>(args, r0, a, b, scores, prefetch);
  ScaleByTokens<RB>(args, args.k, a, b, scores);
  for (int r = 0; r < RB; ++r) {
    float* s = scores + r * kTileTokens;
    rows.Mask(r, s);
    corr[r] = SoftmaxRow(s, a, b, args.m + r0 + r, args.l + r0 + r);
  }
  ScaleByTokens<RB>(args, args.v, a, b, scores);
  constexpr int CB = RB == 4 ? 4 : 8;  // accumulators, V vectors and a weight in 32 registers
  AccumulateBlock<Vec16, E, RB, CB>(scores, corr, dim, args.v, args.head_offset, a, b,
                                    args.acc + size_t(r0) * dim);
}

// REQUIRES: head_dim % E::kDimsPerStep == 0.
template <class E>
void AttendTile(const AttendTileArgs& args) {
  TilePrefetcher prefetch(args, size_t(args.head_dim) * E::kVBytes);
  int r0 = 0;
  while (r0 < args.rows) {
    const int left = args.rows - r0;
    if (left >= 4) {
      AttendRowBlock<E, 4>(args, r0, prefetch);
      r0 += 4;
    } else if (left >= 2) {
      AttendRowBlock<E, 2>(args, r0, prefetch);
      r0 += 2;
    } else {
      AttendRowBlock<E, 1>(args, r0, prefetch);
      r0 += 1;
    }
  }
  prefetch.Rest();
}

}  // namespace
}  // namespace kvarena::cpu_internal::avx512

#endif  // KVARENA_KERNELS_CPU_AVX512_TILE_H_
