// AVX-512 tile steps with the AVX512_BF16 dot product: q . K by vdpbf16ps on bf16 q
// (args.q_bf16) and K (32 products a vector, each exact in float32, summed in float32),
// then times args.q_scale; V is converted and weighted by FMAs as in
// attention_tile_avx512.cc. K is the stored bf16 of bfloat16 caches, or fp8 e4m3 codes
// widened to the bf16 of value / kFp8TileScale, which is exact. Built with that unit's
// flags plus -mavx512bf16 and called only after a run-time CPU check (AVX512_BF16 and
// AVX-512 F/BW/VL).
//
// vdpbf16ps treats bf16 subnormals as zero (|x| < 2^-126: below any score that matters);
// every fp8 value / kFp8TileScale (2^-17 .. 1.75) is a normal bf16.
//
// Only <immintrin.h>, plain C headers and the avx512 / prefetcher headers here (see
// attention_tile_avx512.cc).
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 takes the _mm512_undefined_*() inside its own intrinsics for uninitialized
// variables (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/attention_tile.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512BF16__) && defined(__FMA__)

#include "kernels/cpu/avx512_tile.h"

namespace kvarena::cpu_internal {
namespace avx512 {
namespace {

// What every vdpbf16ps element type shares: bf16 q (args.q_bf16) against K widened to
// bf16, 32 dims a step, the sums times args.q_scale. The types add kVBytes, LoadK, LoadV.
struct BF16QueryDot {
  static constexpr int kDimsPerStep = 32;
  static const uint16_t* Query(const AttendTileArgs& args) { return args.q_bf16; }
  static __m512 LoadQ(const uint16_t* q, int d) {
    return _mm512_castsi512_ps(_mm512_loadu_si512(q + d));
  }
  static __m512 Mac(__m512 acc, __m512 q, __m512 k) {
    return _mm512_dpbf16_ps(acc, (__m512bh)q, (__m512bh)k);
  }
  static __m512 Partial(__m512 acc) { return acc; }
  struct Rows {};
  static Rows RowsOf(const AttendTileArgs&, int, int, int) { return {}; }
  static __m512 Finish(__m512 sums, const AttendTileArgs& args, const Rows&) {
    return _mm512_mul_ps(sums, _mm512_set1_ps(args.q_scale));
  }
};

// bf16 K against the bf16 q.
struct BF16Dot : BF16QueryDot {
  static constexpr size_t kVBytes = 2;
  static __m512 LoadK(const uint8_t* p, int d) {
    return _mm512_castsi512_ps(_mm512_loadu_si512(p + size_t(d) * 2));
  }
  static __m512 LoadV(const uint8_t* p) { return LoadBF16(p); }
};

// bf16 bits of the e4m3 values / kFp8TileScale with exponent field 0, M x 2^-17 for
// M = 0..7 (zero and the subnormals), indexed by M; the second table by M + 1, after the
// NaN code's (a quiet NaN) at 0. vpermw reads 32 words.
alignas(64) constexpr uint16_t kSubnormals[32] = {0,      0x3700, 0x3780, 0x37C0,
                                                  0x3800, 0x3820, 0x3840, 0x3860};
alignas(64) constexpr uint16_t kNaNAndSubnormals[32] = {0x7FC0, 0,      0x3700, 0x3780, 0x37C0,
                                                        0x3800, 0x3820, 0x3840, 0x3860};

// fp8 e4m3 codes for vdpbf16ps: 32 codes S.EEEE.MMM widened to the bf16 of their value /
// kFp8TileScale. For E >= 1 that is 2^(E - 15) x 1.MMM, the bits S | (E + 112) << 7 |
// MMM << 4, and as E + 112 = E | 112 for E < 16, an OR builds them; E = 0 comes from
// kSubnormals by the code's low 5 bits (M), and the sign is ORed in after. Without kNaN a
// NaN code (S.1111.111) reads as 1.875 / kFp8TileScale, so the caller must know the tile
// has none (AnyNaN); with it, kNaNAndSubnormals by (code + 1) mod 128 (0 for NaN, M + 1
// for E = 0) serves both.
template <bool kNaN>
inline __m512i E4M3ToBF16(const uint8_t* p) {
  const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  __m512i index = w;
  __mmask32 from_table;
  if constexpr (kNaN) {
    index = _mm512_and_si512(_mm512_add_epi16(w, _mm512_set1_epi16(1)), _mm512_set1_epi16(0x7F));
    from_table = _mm512_cmple_epu16_mask(index, _mm512_set1_epi16(8));
  } else {
    from_table = _mm512_testn_epi16_mask(w, _mm512_set1_epi16(0x78));  // E = 0
  }
  const __m512i table = _mm512_load_si512(kNaN ? kNaNAndSubnormals : kSubnormals);
  __m512i r = _mm512_ternarylogic_epi32(_mm512_slli_epi16(w, 4), _mm512_set1_epi16(0x07F0),
                                        _mm512_set1_epi16(0x3800), 0xEA);  // a & b | c
  r = _mm512_mask_permutexvar_epi16(r, from_table, index, table);
  return _mm512_ternarylogic_epi32(r, w, _mm512_set1_epi16(int16_t(0x8000)), 0xF8);  // a | b & c
}

// fp8 codes as floats of value / kFp8TileScale, as LoadE4M3 but a NaN code reads as
// 1.875 / kFp8TileScale: only for tiles without one.
inline __m512 LoadE4M3Finite(const uint8_t* p) {
  const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_cvtph_ps(
      _mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16(int16_t(0xBF80))));
}

// fp8 e4m3 K codes against the bf16 q, 32 dims a step; kNaN: whether the tile may hold
// NaN codes (then V is read by LoadE4M3, which keeps them).
template <bool kNaN>
struct Fp8Dot : BF16QueryDot {
  static constexpr size_t kVBytes = 1;
  static __m512 LoadK(const uint8_t* p, int d) {
    return _mm512_castsi512_ps(E4M3ToBF16<kNaN>(p + d));
  }
  static __m512 LoadV(const uint8_t* p) { return kNaN ? LoadE4M3(p) : LoadE4M3Finite(p); }
};

// Whether any K or V code of the tile's tokens (this kv head) is NaN: 0xFF is the
// largest code unsigned, 0x7F the largest signed. REQUIRES: head_dim % 32 == 0.
bool AnyNaN(const AttendTileArgs& args) {
  __m512i u = _mm512_setzero_si512(), s = _mm512_setzero_si512();
  for (int t = 0; t < args.tokens; ++t) {
    const uint8_t* k = args.k[t] + args.head_offset;
    const uint8_t* v = args.v[t] + args.head_offset;
    for (int d = 0; d < args.head_dim; d += 64) {
      const __mmask64 m = d + 64 <= args.head_dim ? ~__mmask64(0) : __mmask64(0xFFFFFFFF);
      const __m512i a = _mm512_maskz_loadu_epi8(m, k + d), b = _mm512_maskz_loadu_epi8(m, v + d);
      u = _mm512_max_epu8(u, _mm512_max_epu8(a, b));
      s = _mm512_max_epi8(s, _mm512_max_epi8(a, b));
    }
  }
  return (_mm512_cmpeq_epi8_mask(u, _mm512_set1_epi8(char(0xFF))) |
          _mm512_cmpeq_epi8_mask(s, _mm512_set1_epi8(0x7F))) != 0;
}

}  // namespace
}  // namespace avx512

void Avx512Bf16AttendTile(const AttendTileArgs& args) { avx512::AttendTile<avx512::BF16Dot>(args); }
void Avx512Bf16Fp8AttendTile(const AttendTileArgs& args) {
  if (avx512::AnyNaN(args)) {
    avx512::AttendTile<avx512::Fp8Dot<true>>(args);
  } else {
    avx512::AttendTile<avx512::Fp8Dot<false>>(args);
  }
}

}  // namespace kvarena::cpu_internal

#else  // not built for x86-64: CpuHasAvx512Bf16() is false, so this is never called.

namespace kvarena::cpu_internal {
void Avx512Bf16AttendTile(const AttendTileArgs&) {}
void Avx512Bf16Fp8AttendTile(const AttendTileArgs&) {}
}  // namespace kvarena::cpu_internal

#endif
