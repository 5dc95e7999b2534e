// ScaleByTokens: the per-token scales of a quantized format (kvarena/paged_kv.h; int8)
// applied inside a tile step. The vectorised tiles multiply q by the stored codes as
// they would by 16-bit values; a token's K scale then multiplies its scores, and its V
// scale the weights the V pass accumulates (after the softmax has summed them into l).
// Plain scalar code: RB x kTileTokens multiplies against head_dim-long dot products.
//
// Shared by the vectorised tile units, each built with its own instruction-set flags:
// everything here has internal linkage (an unnamed namespace), so every unit keeps its
// own copy and the linker never hands one unit's code to another.
#ifndef KVARENA_KERNELS_CPU_TILE_SCALES_H_
#define KVARENA_KERNELS_CPU_TILE_SCALES_H_

#include <cstdint>
#include <cstring>

#include "kernels/cpu/attention_tile.h"

namespace kvarena::cpu_internal {
namespace {  // NOLINT(build/namespaces): internal linkage on purpose, see above

// s[r][t] *= the scale of tokens[t] (its row + args.scale_offset) for rows r < RB and
// t in [a, b); s: [RB][kTileTokens]. Nothing for formats without scales.
template <int RB>
void ScaleByTokens(const AttendTileArgs& args, const uint8_t* const* tokens, int a, int b,
                   float* s) {
  if (args.scale_offset == 0) return;
  float scale[kTileTokens];
  for (int t = a; t < b; ++t) std::memcpy(&scale[t], tokens[t] + args.scale_offset, 4);
  for (int r = 0; r < RB; ++r) {
    for (int t = a; t < b; ++t) s[r * kTileTokens + t] *= scale[t];
  }
}

}  // namespace
}  // namespace kvarena::cpu_internal

#endif  // KVARENA_KERNELS_CPU_TILE_SCALES_H_
