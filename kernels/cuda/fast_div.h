// FastDiv: division and remainder by a run-time divisor fixed at launch (page_size, row
// length), as a multiply-high and a shift instead of the ~20-instruction integer divide.
// Round-up method (Granlund & Montgomery; CUTLASS FastDivmod). Host and device code; a
// plain value type, safe to copy into kernel arguments.
//
// REQUIRES: divisor >= 1 and every dividend in [0, 2^31).
#ifndef KVARENA_KERNELS_CUDA_FAST_DIV_H_
#define KVARENA_KERNELS_CUDA_FAST_DIV_H_

#include <cstdint>

#if defined(__CUDACC__)
#define KVARENA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define KVARENA_HOST_DEVICE inline
#endif

namespace kvarena::gpu {

struct FastDiv {
  uint32_t divisor = 1;
  uint32_t mul = 0;    // ceil(2^(31 + shift') / divisor), unused for divisor 1
  uint32_t shift = 0;  // ceil(log2(divisor)) - 1

  FastDiv() = default;
  explicit FastDiv(uint32_t d) : divisor(d) {
    if (d <= 1) return;
    uint32_t log2_up = 0;
    while ((uint64_t{1} << log2_up) < d) ++log2_up;
    const uint32_t p = 31 + log2_up;
    mul = uint32_t(((uint64_t{1} << p) + d - 1) / d);
    shift = p - 32;
  }

  KVARENA_HOST_DEVICE uint32_t Div(uint32_t n) const {
    return divisor == 1 ? n : MulHi(n, mul) >> shift;
  }
  // quotient = n / divisor, remainder = n % divisor.
  KVARENA_HOST_DEVICE void DivMod(uint32_t n, uint32_t* quotient, uint32_t* remainder) const {
    *quotient = Div(n);
    *remainder = n - *quotient * divisor;
  }

 private:
  KVARENA_HOST_DEVICE static uint32_t MulHi(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
    return __umulhi(a, b);
#else
    return uint32_t((uint64_t(a) * b) >> 32);
#endif
  }
};

}  // namespace kvarena::gpu

#endif  // KVARENA_KERNELS_CUDA_FAST_DIV_H_
