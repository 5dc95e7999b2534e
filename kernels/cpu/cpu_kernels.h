// Which CPU attention kernels PagedAttention runs: the best this CPU supports (cpuid,
// checked once), capped by KVARENA_CPU_KERNELS at start-up and by a test hook. All
// functions are thread-safe.
#ifndef KVARENA_KERNELS_CPU_CPU_KERNELS_H_
#define KVARENA_KERNELS_CPU_CPU_KERNELS_H_

namespace kvarena {

// The kernel families, each needing what the one before it needs and more.
enum class CpuKernels {
  kPortable = 0,    // plain C++
  kAvx2 = 1,        // AVX2 + FMA + F16C, head_dim % 8 == 0
  kAvx512 = 2,      // AVX-512 F/BW/VL, head_dim % 16 == 0
  kAvx512Vnni = 3,  // kAvx512, and q . K by vpdpbusd (AVX512_VNNI) for int8 caches, with q
                    // quantized per row to int8, head_dim % 64 == 0
  kAvx512Bf16 = 4,  // kAvx512Vnni, and q . K by vdpbf16ps (AVX512_BF16) for bf16 and fp8 caches
};

// "portable", "avx2", "avx512", "avx512_vnni", "avx512_bf16".
const char* CpuKernelsName(CpuKernels kernels);

// The best kernels this CPU (and OS: the vector state saved by XSAVE) runs.
CpuKernels CpuKernelsSupported();

// The kernels PagedAttention uses: the supported ones, capped by
// KVARENA_CPU_KERNELS=portable|avx2|avx512|avx512_vnni|avx512_bf16 (read once; an unknown value is
// reported on stderr and ignored) and by TEST_ForceCpuKernels. A head_dim a family does
// not handle falls back to the best one below it.
CpuKernels CpuKernelsInUse();

// Test / benchmark hook: use `kernels`, or the best below them that the CPU has (the
// environment's cap still applies). TEST_ForceCpuKernels(CpuKernels::kAvx512Bf16) goes
// back to the default.
void TEST_ForceCpuKernels(CpuKernels kernels);

}  // namespace kvarena

#endif  // KVARENA_KERNELS_CPU_CPU_KERNELS_H_
