// AVX-512 implementation of the attention tile step (see attention_tile.h, the algorithm
// in avx512_tile.h): K and V converted to float, FMAs, for f32 / f16 / bf16 caches.
// Built with -mavx512f -mavx512bw -mavx512vl -mavx2 -mfma -mf16c and called only after a
// run-time CPU check.
//
// Only <immintrin.h>, plain C headers and the avx512 / prefetcher headers here: inline or
// template code from other headers compiled with these flags could be the copy the linker
// keeps for callers on CPUs without AVX-512.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 takes the _mm512_undefined_*() inside its own intrinsics for uninitialized
// variables (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "kernels/cpu/attention_tile.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__FMA__)

#include "kernels/cpu/avx512_tile.h"

namespace kvarena::cpu_internal {

void Avx512AttendTile(const AttendTileArgs& args) {
  switch (args.kv_format) {
    case KvFormat::kFloat32:
      return avx512::AttendTile<avx512::F32>(args);
    case KvFormat::kFloat16:
      return avx512::AttendTile<avx512::F16>(args);
    case KvFormat::kBFloat16:
      return avx512::AttendTile<avx512::BF16>(args);
    case KvFormat::kInt8:
      return avx512::AttendTile<avx512::I8>(args);
    case KvFormat::kFp8E4M3:
      return avx512::AttendTile<avx512::E4M3>(args);
    case KvFormat::kUnspecified:
      return;
  }
}

}  // namespace kvarena::cpu_internal

#else  // not built for x86-64: CpuKernelsSupported() is below kAvx512, so never called.

namespace kvarena::cpu_internal {
void Avx512AttendTile(const AttendTileArgs&) {}
}  // namespace kvarena::cpu_internal

#endif
