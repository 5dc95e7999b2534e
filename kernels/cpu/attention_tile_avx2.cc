// AVX2 + FMA + F16C implementation of the attention tile step (see attention_tile.h).
// Built with -mavx2 -mfma -mf16c and called only after a run-time CPU check.
//
// Per block of RB <= 4 query rows (the rows of one GQA group share every K/V load; a
// group of 8 is two blocks, reading the tile's K/V twice from L1, not from memory):
//   1. scores: RB rows x (8 / RB) tokens at a time in 8 vector accumulators over
//      head_dim, reduced together by one transposing horizontal sum (no per-token sums);
//   2. mask, then the online-softmax update per row with a vector exp2;
//   3. V: RB rows x CB vectors of dims in registers across the tile's tokens, 8-12
//      accumulators so that the FMA latency is covered.
//
// Only <immintrin.h>, plain C headers and avx2_util.h here: inline or template code from
// other headers compiled with these flags could be the copy the linker keeps for
// callers on CPUs without AVX2.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/attention_tile.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/tile_accumulate.h"
#include "kernels/cpu/tile_prefetcher.h"
#include "kernels/cpu/tile_row_ranges.h"
#include "kernels/cpu/tile_scales.h"

namespace kvarena::cpu_internal {
namespace {

using namespace avx2;  // NOLINT: this unit's vocabulary

// scores[r][t + j] = q[r] . K[t + j] for r < RB, j < TB.
// q: [RB][dim]; k: token pointers (+ off); scores: [RB][kTileTokens].
template <class E, int RB, int TB>
void ScoreTokens(const float* q, int dim, const uint8_t* const* k, size_t off, int t,
                 float* scores) {
  constexpr int N = RB * TB;
  const uint8_t* kp[TB];
#pragma GCC unroll 8
  for (int j = 0; j < TB; ++j) kp[j] = k[t + j] + off;
  __m256 acc[N];
#pragma GCC unroll 8
  for (int i = 0; i < N; ++i) acc[i] = _mm256_setzero_ps();
  for (int d = 0; d < dim; d += 8) {
    __m256 kv[TB];
#pragma GCC unroll 8
    for (int j = 0; j < TB; ++j) kv[j] = E::Load8(kp[j] + d * E::kBytes);
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) {
      __m256 qv = _mm256_loadu_ps(q + r * dim + d);
      if constexpr (TB > 1) {
        // Keep q in a register for its TB uses rather than one load per FMA: the loads,
        // not the FMAs, would otherwise bound this loop.
        asm("" : "+x"(qv));
      }
#pragma GCC unroll 8
      for (int j = 0; j < TB; ++j) acc[r * TB + j] = _mm256_fmadd_ps(qv, kv[j], acc[r * TB + j]);
    }
  }
  alignas(32) float sums[8];
  if constexpr (N == 8) {
    _mm256_store_ps(sums, HSum8(acc));
  } else {
#pragma GCC unroll 8
    for (int i = 0; i < N; ++i) sums[i] = HSum(acc[i]);
  }
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 8
    for (int j = 0; j < TB; ++j) scores[r * kTileTokens + t + j] = sums[r * TB + j];
  }
}

// scores[r][t] = q[r] . K[t] for r < RB, t in [a, b): 8 accumulators in flight (the FMA
// latency times the FMA ports) over all but the last few tokens.
template <class E, int RB>
void ScoreBlock(const float* q, int dim, const uint8_t* const* k, size_t off, int a, int b,
                float* scores, TilePrefetcher& prefetch) {
  constexpr int TB = 8 / RB;
  int t = a;
  for (; t + TB <= b; t += TB) {
    prefetch.Step(TB);
    ScoreTokens<E, RB, TB>(q, dim, k, off, t, scores);
  }
  for (; t < b; ++t) {
    prefetch.Step(1);
    ScoreTokens<E, RB, 1>(q, dim, k, off, t, scores);
  }
}

template <class E, int RB>
void AttendRowBlock(const AttendTileArgs& args, const float* q, int r0, TilePrefetcher& prefetch) {
  const TileRowRanges<RB> rows(args, r0);
  if (rows.empty()) return;
  const int a = rows.a, b = rows.b;
  const int dim = args.head_dim;
  float* scores = args.scratch + size_t(r0) * kTileTokens;
  float* corr = args.scratch + size_t(args.rows) * kTileTokens + r0;
  ScoreBlock<E, RB>(q + size_t(r0) * dim, dim, args.k, args.head_offset, a, b, scores, prefetch);
  ScaleByTokens<RB>(args, args.k, a, b, scores);
  for (int r = 0; r < RB; ++r) {
    float* s = scores + r * kTileTokens;
    rows.Mask(r, s);
    corr[r] = SoftmaxRow(s, a, b, args.m + r0 + r, args.l + r0 + r);
  }
  ScaleByTokens<RB>(args, args.v, a, b, scores);
  // As many accumulators as the 16 registers allow beside the CB vectors of V and a
  // weight: 12 for 4 rows (measured faster than 8, which only just covers the latency).
  constexpr int CB = RB == 4 ? 3 : RB == 2 ? 5 : 8;
  AccumulateBlock<Vec8, E, RB, CB>(scores, corr, dim, args.v, args.head_offset, a, b,
                                   args.acc + size_t(r0) * dim);
}

template <class E>
void AttendTile(const AttendTileArgs& args) {
  TilePrefetcher prefetch(args, size_t(args.head_dim) * E::kBytes);
  const float* q = args.q;
  int r0 = 0;
  while (r0 < args.rows) {
    const int left = args.rows - r0;
    if (left >= 4) {
      AttendRowBlock<E, 4>(args, q, r0, prefetch);
      r0 += 4;
    } else if (left >= 2) {
      AttendRowBlock<E, 2>(args, q, r0, prefetch);
      r0 += 2;
    } else {
      AttendRowBlock<E, 1>(args, q, r0, prefetch);
      r0 += 1;
    }
  }
  prefetch.Rest();
}

}  // namespace

void Avx2AttendTile(const AttendTileArgs& args) {
  switch (args.kv_format) {
    case KvFormat::kFloat32:
      return AttendTile<F32>(args);
    case KvFormat::kFloat16:
      return AttendTile<F16>(args);
    case KvFormat::kBFloat16:
      return AttendTile<BF16>(args);
    case KvFormat::kInt8:
      return AttendTile<I8>(args);
    case KvFormat::kFp8E4M3:
      return AttendTile<E4M3>(args);
    case KvFormat::kUnspecified:
      return;
  }
}

}  // namespace kvarena::cpu_internal

#else  // not built for x86-64: CpuKernelsSupported() is kPortable, so never called.

namespace kvarena::cpu_internal {
void Avx2AttendTile(const AttendTileArgs&) {}
}  // namespace kvarena::cpu_internal

#endif
