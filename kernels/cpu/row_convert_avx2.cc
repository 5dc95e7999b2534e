// The AVX2 + F16C row conversions (row_convert.h). Built with -mavx2 -mf16c; selected only
// where cpuid says the CPU has them. Bit for bit dtype_convert.h's scalar conversions:
// vcvtph2ps is exact; vcvtps2ph rounds to nearest even, ignores MXCSR's DAZ / FTZ and
// quiets a NaN keeping its payload's top bits, as FloatToHalf does; bfloat16 is the same
// integer arithmetic as FloatToBFloat16, eight lanes at a time.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/row_convert.h"

namespace kvarena::cpu_internal {

#if defined(__AVX2__) && defined(__F16C__)

namespace {

// dtype: float16, else bfloat16.
__m256 Widen(DType dtype, __m128i h) {
  if (dtype == DType::kFloat16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

__m128i Narrow(DType dtype, __m256 x) {
  if (dtype == DType::kFloat16) return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
  const __m256i b = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40));
  const __m256i magnitude = _mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);  // every lane <= 0xffff
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

}  // namespace

void Avx2LoadRow(DType dtype, const void* src, size_t n, float* dst) {
  const auto* s = static_cast<const uint16_t*>(src);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i,
                     Widen(dtype, _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  }
  if (i < n) {  // the tail through a zero-padded block: nothing outside [0, n) is touched
    uint16_t in[8] = {};
    float out[8];
    std::memcpy(in, s + i, (n - i) * sizeof(uint16_t));
    _mm256_storeu_ps(out, Widen(dtype, _mm_loadu_si128(reinterpret_cast<const __m128i*>(in))));
    std::memcpy(dst + i, out, (n - i) * sizeof(float));
  }
}

void Avx2StoreRow(DType dtype, const float* src, size_t n, void* dst) {
  auto* d = static_cast<uint16_t*>(dst);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), Narrow(dtype, _mm256_loadu_ps(src + i)));
  }
  if (i < n) {
    float in[8] = {};
    uint16_t out[8];
    std::memcpy(in, src + i, (n - i) * sizeof(float));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), Narrow(dtype, _mm256_loadu_ps(in)));
    std::memcpy(d + i, out, (n - i) * sizeof(uint16_t));
  }
}

#else  // not built for x86-64: CpuKernelsSupported() is kPortable, so never called.

void Avx2LoadRow(DType, const void*, size_t, float*) {}
void Avx2StoreRow(DType, const float*, size_t, void*) {}

#endif

}  // namespace kvarena::cpu_internal
