// The V step of the vector attention tiles, written once for both vector widths:
//   acc[r] = acc[r] * corr[r] + sum over t in [a, b) of p[r][t] * V[t], for r < RB,
// with RB rows x CB vectors of dims in registers across the tile's tokens.
//
// `Vec` is the unit's vector vocabulary (avx2::Vec8, avx512::Vec16: F, kLanes, Load, Store,
// Set1, Mul, Fma); `E` its element format (LoadV reads kLanes stored elements as floats,
// kVBytes is one element's size).
//
// Include ONLY from a unit built for Vec's instruction set, after Vec's header. Everything
// here has internal linkage (an unnamed namespace): the units are built with different
// flags, and the linker must not hand one unit's copy of a function to another.
#ifndef KVARENA_KERNELS_CPU_TILE_ACCUMULATE_H_
#define KVARENA_KERNELS_CPU_TILE_ACCUMULATE_H_

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/attention_tile.h"

namespace kvarena::cpu_internal {
namespace {  // NOLINT(build/namespaces): internal linkage on purpose, see above

// acc[r][d0, d0 + kLanes * CB) = acc * corr[r] + sum over t in [a, b) of p[r][t] * V[t].
template <class Vec, class E, int RB, int CB>
void AccumulateDims(const float* p, const float* corr, int dim, const uint8_t* const* v, size_t off,
                    int a, int b, int d0, float* acc) {
  using F = typename Vec::F;
  constexpr int L = Vec::kLanes;
  F ac[RB][CB];
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r) {
    const F c = Vec::Set1(corr[r]);
#pragma GCC unroll 8
    for (int j = 0; j < CB; ++j) ac[r][j] = Vec::Mul(Vec::Load(acc + r * dim + d0 + L * j), c);
  }
  for (int t = a; t < b; ++t) {
    const uint8_t* vp = v[t] + off + size_t(d0) * E::kVBytes;
    F vv[CB];
#pragma GCC unroll 8
    for (int j = 0; j < CB; ++j) vv[j] = E::LoadV(vp + L * j * E::kVBytes);
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r) {
      const F w = Vec::Set1(p[r * kTileTokens + t]);
#pragma GCC unroll 8
      for (int j = 0; j < CB; ++j) ac[r][j] = Vec::Fma(w, vv[j], ac[r][j]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 8
    for (int j = 0; j < CB; ++j) Vec::Store(acc + r * dim + d0 + L * j, ac[r][j]);
  }
}

// p: [RB][kTileTokens]; v: token pointers (+ off); acc: [RB][dim]. CB vectors of dims a
// pass (the unit picks it for its register count), then single vectors for the rest.
template <class Vec, class E, int RB, int CB>
void AccumulateBlock(const float* p, const float* corr, int dim, const uint8_t* const* v,
                     size_t off, int a, int b, float* acc) {
  constexpr int L = Vec::kLanes;
  int d = 0;
  for (; d + L * CB <= dim; d += L * CB) {
    AccumulateDims<Vec, E, RB, CB>(p, corr, dim, v, off, a, b, d, acc);
  }
  for (; d < dim; d += L) AccumulateDims<Vec, E, RB, 1>(p, corr, dim, v, off, a, b, d, acc);
}

}  // namespace
}  // namespace kvarena::cpu_internal

#endif  // KVARENA_KERNELS_CPU_TILE_ACCUMULATE_H_
