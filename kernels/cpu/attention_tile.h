// Internal to kernels/cpu: the inner step of PagedAttention, one tile of consecutive key
// positions against the query rows of one kv head, with a portable implementation and an
// AVX2 + FMA + F16C one (a separate translation unit built with those flags), and the
// run-time choice between them.
//
// The tile step keeps the flash-attention running state of each row in the log2 domain:
// m = max score seen, l = sum of 2^(score - m), acc = sum of 2^(score - m) * V.
// It only reads K/V and writes the state and scratch it is given, so tiles of different
// rows or of different key ranges may run concurrently.
//
// This header must stay free of inline functions and std templates: the AVX2 unit
// includes it, and any such code emitted there could replace the portable copy at link.
#ifndef KVARENA_KERNELS_CPU_ATTENTION_TILE_H_
#define KVARENA_KERNELS_CPU_ATTENTION_TILE_H_

#include <cstddef>
#include <cstdint>

#include "kernels/paged_kv.h"

namespace kvarena {
namespace cpu_internal {

// Key positions per tile (the scratch row length).
inline constexpr int kTileTokens = 32;

// The vector tiles' 2^f for f in [-0.5, 0.5] (f the fraction of x after rounding): the
// Taylor series of e^(f ln2) to degree 7, highest power first, for Horner's rule; relative
// error < 1e-8 on the interval.
inline constexpr float kExp2Taylor[8] = {1.5252733804059841e-05f, 1.5403530393381606e-04f,
                                         1.3333558146428443e-03f, 9.6181291076284772e-03f,
                                         5.5504108664821580e-02f, 2.4022650695910071e-01f,
                                         6.9314718055994531e-01f, 1.0f};

// fp8_e4m3 pages read as value / 2^8 in every tile: a code's exponent and mantissa bits
// placed in a half's make exactly that (the exponent biases differ by 8), so the vector
// tiles widen codes with no multiply. attention.cc multiplies K's and V's static scales by
// this, which is exact (a power of two).
inline constexpr float kFp8TileScale = 256.0f;

struct AttendTileArgs {
  KvFormat kv_format = KvFormat::kFloat32;  // how the pages store K/V
  int head_dim = 0;
  int rows = 0;              // query rows (GQA heads x queries) of this kv head
  const float* q = nullptr;  // [rows][head_dim], pre-scaled by scale * log2(e)
  // The tiles that multiply bf16 q by bf16 K (bf16 caches, and fp8 ones on AVX512_BF16):
  // q unscaled, as stored for bf16 activations and rounded to bf16 (to nearest even) for
  // f16 / f32 ones, and the factor q carries: scale * log2(e) * K's static scale of this kv
  // head (x kFp8TileScale for fp8, see attention.cc), by which the tile scales the sums.
  const uint16_t* q_bf16 = nullptr;  // [rows][head_dim]
  float q_scale = 0;
  // int8 caches on the VNNI tile only: q quantized per row (kernels/kv_quant.h's int8 of
  // the pre-scaled q), each row's scale and the sum of its codes.
  const int8_t* q_i8 = nullptr;       // [rows][head_dim]
  const float* q_i8_scale = nullptr;  // [rows]
  const int32_t* q_i8_sum = nullptr;  // [rows]
  const int64_t* row_lo = nullptr;    // [rows] first visible key position per row
  const int64_t* row_hi = nullptr;    // [rows] last visible key position (inclusive)
  int64_t pos0 = 0;                   // absolute position of tile token 0
  int tokens = 0;                     // 1..kTileTokens consecutive positions pos0..
  const uint8_t* const* k = nullptr;  // [tokens] K of token j, kv head 0
  const uint8_t* const* v = nullptr;  // [tokens] V of token j, kv head 0
  size_t head_offset = 0;             // bytes from head 0 to this kv head within a token
  // A format with per-token scales: bytes from a token row's start to this kv head's
  // float32 scale (kvarena/paged_kv.h); 0 for formats without (no row starts with one).
  size_t scale_offset = 0;
  // The next tile's tokens (same head_offset), which the step may prefetch; 0 if none.
  int next_tokens = 0;
  const uint8_t* const* next_k = nullptr;  // [next_tokens]
  const uint8_t* const* next_v = nullptr;  // [next_tokens]
  float* m = nullptr;                      // [rows] running max, -inf before the first key
  float* l = nullptr;                      // [rows] running sum of weights
  float* acc = nullptr;                    // [rows][head_dim] running weighted sum of V
  float* scratch = nullptr;                // [rows][kTileTokens + 1] floats of workspace
};

// Folds the visible keys of one tile into the rows' running state. Rows that see no key
// of the tile are left unchanged.
using AttendTileFn = void (*)(const AttendTileArgs& args);

void PortableAttendTile(const AttendTileArgs& args);
// The vectorised tiles take every format the KV format table has; int8 scales by token
// (tile_scales.h). REQUIRES: CpuKernelsSupported() >= kAvx2 and head_dim % 8 == 0.
void Avx2AttendTile(const AttendTileArgs& args);
// REQUIRES: CpuKernelsSupported() >= kAvx512 and head_dim % 16 == 0.
void Avx512AttendTile(const AttendTileArgs& args);
// REQUIRES: CpuKernelsSupported() == kAvx512Bf16, kv_format bf16, head_dim % 32 == 0, q_bf16.
void Avx512Bf16AttendTile(const AttendTileArgs& args);
// REQUIRES: CpuKernelsSupported() == kAvx512Bf16, kv_format fp8_e4m3, head_dim % 32 == 0,
// q_bf16. K's codes become bf16 exactly, so q . K is exact on q as bf16: with f16 / f32
// activations the scores carry q's rounding to bf16 (relative 2^-9 an element).
void Avx512Bf16Fp8AttendTile(const AttendTileArgs& args);
// REQUIRES: CpuKernelsSupported() >= kAvx512Vnni, kv_format int8, head_dim % 64 == 0, q_i8.
// q . K is exact on the quantized q: the scores carry q's int8 rounding besides K's.
void Avx512VnniAttendTile(const AttendTileArgs& args);

// The tile function PagedAttention uses for this head_dim, activation dtype and KV format:
// the best of the kernels in use (CpuKernelsInUse()) that handles them.
AttendTileFn SelectAttendTile(int head_dim, DType dtype, KvFormat kv_format);

}  // namespace cpu_internal
}  // namespace kvarena

#endif  // KVARENA_KERNELS_CPU_ATTENTION_TILE_H_
