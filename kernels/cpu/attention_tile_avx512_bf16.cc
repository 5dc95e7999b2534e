// AVX-512 tile step for bfloat16 caches with the AVX512_BF16 dot product: q . K by
// vdpbf16ps on the stored bf16 q and K (32 products a vector, each exact in float32,
// summed in float32), then times scale * log2(e); V is converted and weighted by FMAs as
// in attention_tile_avx512.cc. Built with that unit's flags plus -mavx512bf16 and called
// only after a run-time CPU check (AVX512_BF16 and AVX-512 F/BW/VL).
//
// vdpbf16ps treats bf16 subnormals as zero (|x| < 2^-126: below any score that matters).
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

// bf16 K against the bf16 q (args.q_bf16), 32 dims a step.
struct BF16Dot {
  static constexpr size_t kVBytes = 2;
  static constexpr int kDimsPerStep = 32;
  static const uint16_t* Query(const AttendTileArgs& args) { return args.q_bf16; }
  static __m512 LoadQ(const uint16_t* q, int d) {
    return _mm512_castsi512_ps(_mm512_loadu_si512(q + d));
  }
  static __m512 LoadK(const uint8_t* p, int d) {
    return _mm512_castsi512_ps(_mm512_loadu_si512(p + size_t(d) * 2));
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
  static __m512 LoadV(const uint8_t* p) { return LoadBF16(p); }
};

}  // namespace
}  // namespace avx512

void Avx512Bf16AttendTile(const AttendTileArgs& args) { avx512::AttendTile<avx512::BF16Dot>(args); }

}  // namespace kvarena::cpu_internal

#else  // not built for x86-64: CpuHasAvx512Bf16() is false, so this is never called.

namespace kvarena::cpu_internal {
void Avx512Bf16AttendTile(const AttendTileArgs&) {}
}  // namespace kvarena::cpu_internal

#endif
