// AVX-512 tile step for int8 pages with the AVX512_VNNI dot product: q . K by vpdpbusd on
// q quantized per row to int8 (attention.cc: QuantizeQueries) and K's int8 codes, 64
// products a vector summed exactly in int32; the V pass converts and weights by FMAs as in
// attention_tile_avx512.cc. Built with that unit's flags plus -mavx512vnni and called only
// after a run-time CPU check (AVX512_VNNI and AVX-512 F/BW/VL).
//
// vpdpbusd multiplies unsigned by signed bytes, so K's codes go in offset by 128
// (code + 128 = code XOR 0x80, in [1, 255]) and each row's sum subtracts 128 x the sum of
// its q codes: sum((k + 128) q) - 128 sum(q) = sum(k q), exactly. The score is that
// integer times the row's q scale (which carries scale * log2(e)), then times the token's
// K scale (tile_scales.h). Every partial stays below 2^24 for head_dim <= 512, so the
// float sums are exact too.
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
    defined(__AVX512VNNI__) && defined(__FMA__)

#include "kernels/cpu/avx512_tile.h"

namespace kvarena::cpu_internal {
namespace avx512 {
namespace {

// int8 K codes against the int8 q (args.q_i8), 64 dims a step, in int32 accumulators
// (held in __m512 registers by their bits).
struct I8Dot {
  static constexpr size_t kVBytes = 1;
  static constexpr int kDimsPerStep = 64;
  static const int8_t* Query(const AttendTileArgs& args) { return args.q_i8; }
  static __m512 LoadQ(const int8_t* q, int d) {
    return _mm512_castsi512_ps(_mm512_loadu_si512(q + d));
  }
  static __m512 LoadK(const uint8_t* p, int d) {  // code + 128, as vpdpbusd's unsigned side
    return _mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_loadu_si512(p + d), _mm512_set1_epi8(char(0x80))));
  }
  static __m512 Mac(__m512 acc, __m512 q, __m512 k) {
    return _mm512_castsi512_ps(_mm512_dpbusd_epi32(_mm512_castps_si512(acc), _mm512_castps_si512(k),
                                                   _mm512_castps_si512(q)));
  }
  static __m512 Partial(__m512 acc) { return _mm512_cvtepi32_ps(_mm512_castps_si512(acc)); }
  // Per lane i (row i / tb of the block): 128 x its q codes' sum, and its q scale.
  struct Rows {
    __m512 offset;
    __m512 scale;
  };
  static Rows RowsOf(const AttendTileArgs& args, int r0, int rb, int tb) {
    alignas(64) float offset[16] = {}, scale[16] = {};
    for (int i = 0; i < rb * tb; ++i) {
      offset[i] = 128.0f * float(args.q_i8_sum[r0 + i / tb]);
      scale[i] = args.q_i8_scale[r0 + i / tb];
    }
    return {_mm512_load_ps(offset), _mm512_load_ps(scale)};
  }
  static __m512 Finish(__m512 sums, const AttendTileArgs&, const Rows& rows) {
    return _mm512_mul_ps(_mm512_sub_ps(sums, rows.offset), rows.scale);
  }
  static __m512 LoadV(const uint8_t* p) { return LoadI8(p); }  // ScaleByTokens scales
};

}  // namespace
}  // namespace avx512

void Avx512VnniAttendTile(const AttendTileArgs& args) { avx512::AttendTile<avx512::I8Dot>(args); }

}  // namespace kvarena::cpu_internal

#else  // not built for x86-64: CpuKernelsSupported() is below kAvx512Vnni, so never called.

namespace kvarena::cpu_internal {
void Avx512VnniAttendTile(const AttendTileArgs&) {}
}  // namespace kvarena::cpu_internal

#endif
