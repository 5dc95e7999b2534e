// TileRowRanges: which positions of one tile each of RB query rows sees (its causal and
// window range, clipped to the tile), the span they cover together, and the masking of
// the positions of that span a row does not see. Plain scalar code; one per row block.
//
// Shared by the vectorised tile units, each built with its own instruction-set flags:
// everything here has internal linkage (an unnamed namespace), so every unit keeps its
// own copy and the linker never hands one unit's code to another.
#ifndef KVARENA_KERNELS_CPU_TILE_ROW_RANGES_H_
#define KVARENA_KERNELS_CPU_TILE_ROW_RANGES_H_

#include <cstdint>

#include "kernels/cpu/attention_tile.h"

namespace kvarena::cpu_internal {
namespace {  // NOLINT(build/namespaces): internal linkage on purpose, see above

template <int RB>
struct TileRowRanges {
  // Rows [r0, r0 + RB) of args.
  TileRowRanges(const AttendTileArgs& args, int r0) {
    auto clamp = [&](int64_t x) { return x < 0 ? 0 : x > args.tokens ? args.tokens : int(x); };
    for (int r = 0; r < RB; ++r) {
      first[r] = clamp(args.row_lo[r0 + r] - args.pos0);
      last[r] = clamp(args.row_hi[r0 + r] + 1 - args.pos0);
      if (first[r] < last[r]) {
        a = first[r] < a ? first[r] : a;
        b = last[r] > b ? last[r] : b;
      }
    }
  }

  bool empty() const { return a >= b; }

  // Sets s[t] = -inf for the t in [a, b) that row r does not see. s: [kTileTokens].
  void Mask(int r, float* s) const {
    for (int t = a; t < first[r] && t < b; ++t) s[t] = -__builtin_inff();
    for (int t = last[r] > a ? last[r] : a; t < b; ++t) s[t] = -__builtin_inff();
  }

  int first[RB], last[RB];     // row r sees tile positions [first[r], last[r])
  int a = kTileTokens, b = 0;  // the span [a, b) the rows see together (empty: a >= b)
};

}  // namespace
}  // namespace kvarena::cpu_internal

#endif  // KVARENA_KERNELS_CPU_TILE_ROW_RANGES_H_
